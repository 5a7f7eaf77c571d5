"""settled migrate: bring the ledger's schema up to date, step by step, announced.

Nothing else migrates a ledger (rule 18): every other command refuses an older one with
"run `settled migrate`", or, when it only reads, reads it as it is if it can."""

import os
from typing import Annotated, Any

import typer

from . import options
from .common import STATE, console, emit_json

MIGRATE_HELP = """Apply the schema steps this settled has and the ledger lacks.

Lists each step (its name, and the schema version it takes the ledger from and to),
then applies them in order, each in its own transaction, and says so as each one
commits. A ledger that is up to date says so and exits 0; a missing one exits 1
with its path. --dry-run only lists (nothing is changed, exit 0). --backup PATH
first writes a consistent copy of a SQLite ledger to the new file PATH (VACUUM
INTO; mode 0600) and says where; on PostgreSQL it is refused: back up with pg_dump.

Stop the daemons, dispatchers and services of the older settled first. While any
settled (of any version) wrote to the ledger in the last minute, or a dispatch lease
is live, migrate refuses (exit 7) and names when and what: an older daemon left
running does not stop on its own (an 0.1.0 one keeps writing, or keeps failing),
so stop it and run migrate again; --force migrates anyway.

\b
Examples:
  settled migrate --dry-run
  settled migrate --backup settled-before-0.2.db
  settled --db 'postgresql://db.internal/settled' migrate --json
"""


def register(app: typer.Typer) -> None:
    @app.command("migrate", help=MIGRATE_HELP)
    def migrate(
        dry_run: Annotated[bool, options.dry_run("Only list the steps.")] = False,
        backup: str | None = typer.Option(
            None,
            "--backup",
            metavar="PATH",
            help="First copy the SQLite ledger to this new file.",
            show_default=False,
        ),
        force: bool = typer.Option(
            False, "--force", help="Migrate even though the ledger was written just now."
        ),
        as_json: options.JsonReport = False,
    ) -> None:
        from ..errors import InvalidInput
        from ..storage import Ledger

        location = STATE.ledger_location()
        if backup is not None and not backup:
            raise InvalidInput("--backup needs a file name")
        with Ledger.open_for_migration(
            location, busy_timeout=STATE.config().busy_timeout, postgres=STATE.postgres_settings()
        ) as led:
            pg = led.backend == "postgresql"
            # --backup is refused before anything is listed or changed
            if backup is not None and pg:
                raise InvalidInput(
                    f"--backup copies SQLite ledgers only; back up {led.location} with pg_dump "
                    "(e.g. pg_dump --schema=NAME --format=custom) before `settled migrate`"
                )
            if backup is not None and os.path.lexists(backup):
                raise InvalidInput(f"--backup {backup}: a file is already there; name a new file")
            found, latest = led.schema_version(), led.latest_schema
            steps = led.pending_steps()
            report: dict[str, Any] = {
                "ledger": led.location,
                "backend": led.backend,
                "from": found,
                "to": latest,
                "dry_run": dry_run,
                "backup": None,
                "steps": [
                    {"step": name, "from": n - 1, "to": n, "applied": False} for n, name in steps
                ],
            }
            con = None if as_json else console()

            def say(text: str) -> None:
                if con is not None:
                    con.print(text, markup=False, highlight=False, soft_wrap=True)

            if not steps:
                say(f"ledger {led.location} is up to date (schema {found})")
            else:
                n = len(steps)
                say(
                    f"ledger {led.location}: schema {found}, this settled writes {latest}; "
                    f"{n} step{'s' if n != 1 else ''} {'would apply' if dry_run else 'to apply'}:"
                )
                width = max(len(name) for _, name in steps)
                for number, name in steps:
                    say(f"  {name:<{width}}  schema {number - 1} → {number}")
            if dry_run:
                if backup is not None:
                    say(f"would back up to {backup} first")
                say("dry run: nothing was changed")
            else:
                if steps and not force:
                    _refuse_while_written(led)
                if backup is not None:
                    led.backup(backup)
                    report["backup"] = os.path.abspath(backup)
                    say(f"backed up to {report['backup']} (schema {found})")
                by_number = {s["to"]: s for s in report["steps"]}

                def announce(number: int, name: str) -> None:
                    if number in by_number:
                        by_number[number]["applied"] = True
                    say(f"applied {name}: schema {number - 1} → {number}")

                if steps:
                    led.migrate(announce)
                    now = led.schema_version()
                    report["to"] = now
                    say(f"ledger {led.location} is at schema {now}")
        if as_json:
            emit_json(report)


QUIET = 60.0  # s without a write before a ledger counts as still enough to migrate


def _refuse_while_written(led: Any) -> None:
    """Refuse (exit 7) while a writer may still be running: a write in the last
    ``QUIET`` seconds, or a live dispatch lease. Nothing is changed."""
    from ..clock import from_text, to_text
    from ..errors import Conflict

    now = led.clock(anchor=False).now()
    live, last = led.activity(to_text(now))
    ago = (now - from_text(last)).total_seconds() if last is not None else None
    if live or (ago is not None and ago < QUIET):
        what = (
            f"{live} live dispatch lease{'s' if live != 1 else ''}"
            if live
            else f"a write {max(ago or 0.0, 0.0):.0f} s ago ({last})"
        )
        raise Conflict(
            f"ledger {led.location} has {what}: a daemon, dispatcher or service may still be "
            "running; stop every one (of any version), then run `settled migrate` again "
            "(--force migrates anyway); nothing was changed"
        )
