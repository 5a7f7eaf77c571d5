"""settled verify: every record checked against its events (rule 18)."""

from typing import Annotated

import typer

from . import options
from .common import STATE, console, emit_json

FOUND = 4  # exit code on a finding (like ``restic check``): the ledger disagrees with itself


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        full: bool = typer.Option(
            False, "--full", help="Replay every record and recount every count."
        ),
        as_json: Annotated[bool, options.json_output("Print the verdict as JSON.")] = False,
        archive: str | None = typer.Option(
            None,
            "--archive",
            metavar="FILE",
            help="Check a prune's archive instead: its digests, counts and every record's "
            "events; against the ledger too when there is one.",
            show_default=False,
        ),
    ) -> None:
        """Replay records' events against their fields; report every disagreement.

        History is the truth of state: a record's status and attempt are its last
        event's, every event moves from where the one before left it and only by the
        transition table, and delivery, acceptance and confirmed_by are what that
        status allows. An event whose record is missing is a finding too. Records a
        redaction erased stay erased: a value back where a `redacted` event erased one
        is a finding.

        By default only the records with an event after the checkpoint the last clean
        run stored are replayed, each with its whole log, so a daily run costs the
        day's records; --full replays every record and recounts the counts stats and
        metrics read (run it now and then: a row changed by hand without an event is
        found only so). The JSON says which it did ("mode") and how many records.

        Exit 0 with one summary line when all agree; exit 4 and one line per
        disagreement (action id, field, what the record says, what the events say)
        when any does not; exit 1 when a row cannot be read. It never creates or
        migrates a ledger; a clean run stores its checkpoint.

        With --archive FILE it checks an archive `settled prune` wrote: the header,
        every seal's and the end's SHA-256 over the bytes before it and the counts it
        states, and every record replayed against its events. When the ledger can be
        opened, each sealed batch is also checked against it: pruned (its `pruned`
        event names the same digest and none of its records remains) or, after a crash
        between the seal and the commit, not (all of its records are still there). An
        interrupted run's archive (no end line) is reported as such; its sealed batches
        must still be true. Exit 4 on any finding.

        \b
        Examples:
          settled verify
          settled verify --full
          settled --db postgresql:///settled verify --json
          settled verify --archive settled-2026-12.jsonl
        """
        if archive is not None:
            _archive(archive, as_json)
            return
        ledger = STATE.ledger(read_only=True)
        verdict = ledger.verify(full=full)
        if as_json:
            emit_json(verdict.to_json())
        else:
            from ..display import term

            con = console()
            for line in verdict.lines():
                con.print(term(line, limit=2000), markup=False, highlight=False)
            con.print(verdict.summary(), markup=False, highlight=False)
        if not verdict.ok:
            raise typer.Exit(FOUND)


def _archive(path: str, as_json: bool) -> None:
    from pathlib import Path

    from ..errors import InvalidInput, LedgerError
    from ..retention import verify_archive

    target = Path(path)
    if not target.is_file():
        raise InvalidInput(f"no archive at {target}")
    try:
        ledger = STATE.ledger(read_only=True)
    except LedgerError:  # no ledger here: the archive is checked on its own
        ledger = None
    verdict = verify_archive(target, ledger)
    if as_json:
        emit_json(verdict.to_json())
    else:
        from .render import term

        con = console()
        for finding in verdict.findings:
            con.print(term(finding, limit=2000), markup=False, highlight=False)
        con.print(term(verdict.summary(), limit=2000), markup=False, highlight=False)
    if not verdict.ok:
        raise typer.Exit(FOUND)
