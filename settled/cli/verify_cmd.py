"""settled verify: every record checked against its events (rule 18)."""

from __future__ import annotations

import typer

from .common import STATE, console, emit_json

FOUND = 4  # exit code on a finding (like ``restic check``): the ledger disagrees with itself


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
    ) -> None:
        """Replay every record's events against its fields; report every disagreement.

        History is the truth of state: a record's status and attempt are its last
        event's, every event moves from where the one before left it and only by the
        transition table, and delivery, acceptance and confirmed_by are what that
        status allows. An event whose record is missing is a finding too. Exit 0 with
        one summary line when all agree; exit 4 and one line per disagreement (action
        id, field, what the record says, what the events say) when any does not; exit
        1 when a row cannot be read. It only reads: it never creates or changes a
        ledger.

        \b
        Examples:
          settled verify
          settled --db postgresql:///settled verify --json
        """
        ledger = STATE.ledger(read_only=True)
        verdict = ledger.verify()
        if as_json:
            emit_json(verdict.to_json())
        else:
            from .render import term

            con = console()
            for finding in verdict.findings:
                con.print(term(finding.line(), limit=2000), markup=False, highlight=False)
            con.print(verdict.summary(), markup=False, highlight=False)
        if verdict.findings:
            raise typer.Exit(FOUND)
