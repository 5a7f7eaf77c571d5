"""confirm: dispatch a recorded action at most once, however many confirm."""

from typing import Annotated

import typer

from . import options, signals
from .common import STATE, finish, operator
from .inputs import check_id
from .sent import check_wait_timeout, render_report, wait_for_report

CONFIRM_HELP = """Confirm a recorded action: dispatches it at most once, however many confirm.

Outcome and exit code: dispatched (by the new status), already_completed (0 or 5),
in_progress (3), blocked by an unresolved earlier dispatch (4), not_found (6).

\b
Examples:
  settled confirm order-42-booking
  settled confirm order-42-booking --wait --wait-timeout 120 --json
"""


def register(app: typer.Typer) -> None:
    @app.command(help=CONFIRM_HELP)
    def confirm(
        action_id: Annotated[str, options.action_id("The action to confirm.")],
        wait: options.Wait = False,
        wait_timeout: options.WaitTimeout = 60.0,
        by: Annotated[str | None, options.by("confirms it")] = None,
        as_json: Annotated[bool, options.json_output("Print the outcome as JSON.")] = False,
    ) -> None:
        from ..dispatch import Outcome

        actor = operator(by)
        check_id(action_id)
        check_wait_timeout(wait_timeout)
        if wait:
            signals.as_interrupt()  # a CI cancel is Ctrl-C: the record, and its status
        d = STATE.dispatcher(actor=actor)
        report = d.confirm(action_id)
        if wait and report.outcome in (Outcome.DISPATCHED, Outcome.IN_PROGRESS) and report.record:
            wait_for_report(report, wait_timeout, as_json)
        raise typer.Exit(finish(report, as_json, render_report))
