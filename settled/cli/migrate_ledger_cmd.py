"""settled migrate-ledger FROM TO: copy a still ledger to another backend, verified,
and mark FROM as moved (rule 17)."""

import typer

from . import options
from .common import STATE, console, emit_json


def register(app: typer.Typer) -> None:
    @app.command("migrate-ledger")
    def migrate_ledger(
        source: str = typer.Argument(
            ..., metavar="FROM", help="The ledger to copy: a SQLite file or a postgresql:// URL."
        ),
        target: str = typer.Argument(
            ..., metavar="TO", help="An empty ledger to copy it into (made when missing)."
        ),
        wait_for_leases: bool = typer.Option(
            False,
            "--wait-for-leases",
            help="Wait (at most 600 s) for live dispatch leases on FROM to end, then copy; "
            "without it, live leases refuse the copy.",
        ),
        as_json: options.JsonReport = False,
    ) -> None:
        """Copy every record, event and kept callback of FROM into the empty ledger TO,
        and mark FROM as moved to TO.

        SQLite to PostgreSQL (a team outgrowing one host), or back. FROM is held still
        for the whole copy (writers wait); while a dispatch is in flight on FROM (a
        live lease) the copy is refused (exit 7) unless --wait-for-leases. A damaged
        row or an event without its record in FROM is refused by name, TO left empty
        (exit 1). The copy lands in TO in one transaction, verified before its commit
        by reading both ledgers' rows (counts and a SHA-256 per table). Then FROM is
        marked as moved: every later write to it is refused, naming TO; reads still
        work and say it moved.

        \b
        Examples:
          settled migrate-ledger ~/.local/share/settled/settled.db postgresql:///settled
          settled migrate-ledger postgresql:///settled ./back.db --json
        """
        from ..storage import Ledger
        from ..storage.transfer import WAIT_FOR_LEASES, copy_ledger, refuse_moved

        pg = STATE.postgres_settings()
        with Ledger.open(source, create=False, migrate=False, postgres=pg) as src:
            refuse_moved(src)  # before TO is made
            with Ledger.open(target, migrate=False, postgres=pg) as dst:
                report = copy_ledger(
                    src, dst, wait_for_leases=WAIT_FOR_LEASES if wait_for_leases else 0.0
                )
        if as_json:
            emit_json(report.to_json())
            return
        c = report.target_after
        con = console()
        con.print(
            f"copied {c.records} records, {c.events} events and {c.callbacks} callbacks",
            markup=False,
        )
        con.print(f"  from {report.source}", markup=False)
        con.print(f"  to   {report.target}", markup=False)
        con.print(f"  events sha256 {c.events_sha256}", markup=False)
        con.print(f"  records sha256 {c.records_sha256}", markup=False)
        con.print(f"  callbacks sha256 {c.callbacks_sha256}", markup=False)
        err = console(stderr=True)
        err.print(
            "verified: both ledgers' rows read again, counts and checksums match", markup=False
        )
        err.print(f"{report.source} is marked as moved to {report.moved_to}", markup=False)
