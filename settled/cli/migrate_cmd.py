"""settled migrate-ledger FROM TO: copy a ledger to another backend, verified."""

from __future__ import annotations

import typer

from .common import console, emit_json


def register(app: typer.Typer) -> None:
    @app.command("migrate-ledger")
    def migrate_ledger(
        source: str = typer.Argument(
            ..., metavar="FROM", help="The ledger to copy: a SQLite file or a postgresql:// URL."
        ),
        target: str = typer.Argument(
            ..., metavar="TO", help="An empty ledger to copy it into (made when missing)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ) -> None:
        """Copy every record and every event of FROM into the empty ledger TO.

        SQLite to PostgreSQL (a team outgrowing one host), or back. TO must be empty:
        the copy lands in one transaction, whole or not at all. Then both ledgers are
        read again and compared (records, events, and a SHA-256 of each); any
        difference exits 1. Stop every dispatcher and daemon on FROM first: a write
        during the copy is found as a difference, and that copy must be discarded.
        FROM is never changed.

        \b
        Examples:
          settled migrate-ledger ~/.local/share/settled/settled.db postgresql:///settled
          settled migrate-ledger postgresql:///settled ./back.db --json
        """
        from ..errors import LedgerError
        from ..storage import Ledger
        from ..storage.transfer import copy_ledger

        with (
            Ledger.open(source, create=False, migrate=False) as src,
            Ledger.open(target, migrate=False) as dst,
        ):
            report = copy_ledger(src, dst)
        if as_json:
            emit_json(report.to_json())
        else:
            c, t = report.copied, report.target_after
            con = console()
            con.print(f"copied {c.records} records and {c.events} events", markup=False)
            con.print(f"  from {report.source}", markup=False)
            con.print(f"  to   {report.target}", markup=False)
            con.print(f"  events sha256 {t.events_sha256}", markup=False)
            con.print(f"  records sha256 {t.records_sha256}", markup=False)
        if not report.verified:
            raise LedgerError(
                f"the copy in {report.target} differs from {report.source} (a writer changed "
                "the source during the copy?); discard the copy, stop every dispatcher and "
                "daemon on the source, and run migrate-ledger again"
            )
        if not as_json:
            console(stderr=True).print("verified: counts and checksums match", markup=False)
