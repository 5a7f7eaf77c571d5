"""dispatch: record an action and send it, one or many (``--from``: ``from_lines.py``)."""

import sys
from typing import Annotated, Any

import typer

from . import completion, options, signals
from .common import STATE, finish
from .inputs import check_id, parse_params
from .render import console, is_tty, text
from .sent import check_wait_timeout, render_report, wait_for_report


def _rerun_hint(report: Any) -> None:
    """A script that dispatches without --action-id sends again on every re-run."""
    rec = report.record
    if rec is None or is_tty(sys.stdin):
        return
    console(stderr=True).print(
        text(
            f"settled: hint: no --action-id, so this action got the id {rec.action_id}; running "
            "this command again will send it again. Give --action-id (e.g. derived from the "
            "pipeline run) to make a re-run safe."
        )
    )


DISPATCH_HELP = """Record an action and dispatch it; the exit code is its status.

The action is recorded and claimed (committed) before the request leaves. An
--action-id that exists with the same params returns that record and sends nothing;
with other params it exits 7. Without --action-id every run sends again: scripts
should always give one, unless the operation declares an action_key, which makes the
id from the params (a different --action-id is refused).

Exit codes: 0 CONFIRMED, 3 pending (accepted, not yet verified), 4 DENIED_UNRESOLVED,
5 FAILED, 1 bad input or config, 7 conflict. Once the request has left, the exit code
is the record's whatever happens afterwards.

With --from, one action per line ({"action_id": ..., "params": {...}}), claimed in
groups, each group committed before its requests leave; --json prints one line per
action as it settles, then a summary. Exit 0 when every line did what was asked, else
the highest code among the lines (docs/bulk.md).

\b
Examples:
  settled dispatch mail send --params '{"to": "a@example.com"}' --action-id order-42-mail
  settled dispatch mail send --params @message.json --action-id "release-$CI_PIPELINE_ID-mail" --wait
  settled dispatch cal book --params - --needs-confirmation --action-id b-7 < booking.json
  settled dispatch mail send --from campaign.jsonl --concurrency 16 --json
"""


def register(app: typer.Typer) -> None:
    @app.command(help=DISPATCH_HELP)
    def dispatch(
        provider: str = typer.Argument(
            ...,
            metavar="PROVIDER",
            autocompletion=completion.providers,
            help="Provider name (see `settled providers`).",
        ),
        operation: str = typer.Argument(
            ...,
            metavar="OPERATION",
            autocompletion=completion.operations,
            help="Operation of that provider.",
        ),
        params: options.Params = None,
        action_id: str | None = typer.Option(
            None,
            "--action-id",
            metavar="ID",
            help="Your id for this action; repeating it never sends twice.",
        ),
        needs_confirmation: bool = typer.Option(
            False, "--needs-confirmation", help="Record only; `settled confirm` dispatches it."
        ),
        wait: options.Wait = False,
        wait_timeout: options.WaitTimeout = 60.0,
        as_json: options.JsonRecord = False,
        from_: str | None = typer.Option(
            None,
            "--from",
            metavar="FILE|-",
            show_default=False,
            help="Bulk: JSON lines {action_id, params} from FILE, or - for stdin.",
        ),
        concurrency: Annotated[
            int | None,
            options.concurrency(
                "With --from: requests in flight at once (default: the provider's)."
            ),
        ] = None,
    ) -> None:
        if from_ is not None or concurrency is not None:
            from .from_lines import check_bulk_options, dispatch_from

            source = check_bulk_options(from_, params, action_id, needs_confirmation, wait)
            raise typer.Exit(dispatch_from(provider, operation, source, concurrency, as_json))
        values = parse_params(params)
        if action_id is not None:
            check_id(action_id)
        check_wait_timeout(wait_timeout)
        if wait:
            signals.as_interrupt()  # a CI cancel is Ctrl-C: the record, and its status
        d = STATE.dispatcher(actor="dispatch")
        report = d.submit(
            provider, operation, values, action_id=action_id, needs_confirmation=needs_confirmation
        )
        if wait and report.record is not None and not needs_confirmation:
            wait_for_report(report, wait_timeout, as_json)
        code = finish(report, as_json, render_report)
        if action_id is None and not STATE.registry().operation(provider, operation).action_key:
            _rerun_hint(report)  # an action key makes the id from the params: a re-run is safe
        raise typer.Exit(code)
