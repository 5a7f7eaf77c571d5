"""dispatch and confirm: the commands that send."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer

from . import complete, signals
from .common import STATE, finish, next_step
from .render import console, is_tty, iso, span, status_text, term, text

MAX_PARAMS = 1024 * 1024  # bytes of --params: far above any API body, far below memory trouble


def _read_capped(stream: Any, source: str) -> str:
    from ..errors import InvalidInput

    raw = stream.read(MAX_PARAMS + 1)
    if isinstance(raw, str):  # a text stream (stdin replaced in process): count bytes anyway
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_PARAMS:
        raise InvalidInput(
            f"{source} is larger than {MAX_PARAMS // 1024} KiB; settled reads at most that much "
            "params (put large content where the provider can fetch it)"
        )
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_params(raw: str | None) -> Any:
    from ..errors import InvalidInput

    if raw is None:
        return {}
    source = "--params"
    if raw == "-":
        source = "--params - (stdin)"
        text_ = _read_capped(getattr(sys.stdin, "buffer", sys.stdin), source)
    elif raw.startswith("@"):
        path = raw[1:]
        source = f"--params @{path}"
        try:
            with open(path, "rb") as fh:
                text_ = _read_capped(fh, source)
        except FileNotFoundError:
            raise InvalidInput(f"--params @{path}: file not found") from None
        except OSError as exc:
            raise InvalidInput(f"--params @{path}: cannot read: {exc.strerror or exc}") from None
    else:
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_PARAMS:
            raise InvalidInput(f"--params is larger than {MAX_PARAMS // 1024} KiB")
        text_ = raw
    try:
        value = json.loads(text_)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{source} is nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{source} must be a JSON object, got {type(value).__name__}")
    try:  # Python's json accepts NaN, Infinity, 1e999 and lone surrogates; JSON does not
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError as exc:
        raise InvalidInput(f"{source} is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidInput(f"{source} is nested too deeply") from None
    return value


def check_id(action_id: str) -> str:
    from ..model import check_action_id

    return check_action_id(action_id)


def render_report(report: Any) -> None:
    con = console()
    rec = report.record
    if rec is None:
        console(stderr=True).print(text(f"{report.outcome}: ", report.message))
        return
    result = f" → {report.result}" if report.result else ""
    con.print(
        text((rec.action_id, "bold"), f"  {rec.provider}.{rec.operation} ({rec.tier})  ")
        + status_text(rec.status)
        + text(f"  {report.outcome}{result}")
    )
    why = report.message or rec.reason
    if why:
        con.print(text("  why:  ", why))
    con.print(text("  next: ", next_step(rec)))


def _wait(record: Any, timeout: float, quiet: bool = False) -> Any:
    """``--wait``: verification in this process (``settled.wait``), until settled, with
    what it waits for on stderr: in place on a terminal, else a line per status
    (none with ``quiet``: --json off a terminal)."""
    from ..wait import wait_for

    start = time.monotonic()
    reconciler = STATE.reconciler(actor="wait")  # the ledger's clock, as every process
    err = console(stderr=True)
    tty = is_tty(sys.stderr)
    last: list[str] = []
    spinner = err.status(text("waiting …")) if tty else None

    def progress(rec: Any) -> None:
        if rec.terminal:
            return
        left = max(0.0, timeout - (time.monotonic() - start))
        msg = waiting_for(rec, reconciler.clock.now(), left)
        if spinner is not None:
            spinner.update(text(msg))
        elif not quiet and str(rec.status) not in last:
            last.append(str(rec.status))
            err.print(text(msg))

    if spinner is not None:
        spinner.start()
    try:
        return wait_for(
            reconciler,
            record.action_id,
            timeout,
            on_progress=progress,
        )
    finally:
        if spinner is not None:
            spinner.stop()


def waiting_for(rec: Any, now: Any, left: float) -> str:
    """What ``--wait`` is waiting for, in one line."""
    from ..clock import from_text
    from ..wait import only_a_person

    head = f"--wait: {rec.action_id} is {rec.status}"
    budget = f"; giving up in {span(left)} (--wait-timeout)"
    if only_a_person(rec):
        return f"{head}: only a person can settle it (settled resolve); not waiting"
    if str(rec.status) == "PENDING":
        return f"{head}: another caller holds its confirmation{budget}"
    if str(rec.status) == "IN_FLIGHT":
        return f"{head}: dispatch in progress, lease until {iso(rec.lease_expires_at)}{budget}"
    due = from_text(rec.next_check_at)
    when = ""
    if due is not None:
        secs = (due - now).total_seconds()
        when = f"; next check of {rec.provider}/{rec.operation} at {iso(rec.next_check_at)}"
        when += f" (in {span(secs)})" if secs >= 1 else " (due now)"
    return f"{head}: waiting for the provider to show the effect{when}{budget}"


def _check_wait_timeout(value: float) -> None:
    from ..errors import InvalidInput

    if not value >= 0 or value == float("inf"):
        raise InvalidInput(f"--wait-timeout {value!r}: must be a finite number of seconds >= 0")


def _wait_for_report(report: Any, timeout: float, as_json: bool) -> None:
    """``--wait`` after the call: Ctrl-C or SIGTERM (``signals.Terminated``) ends the
    wait, never the report: the record as it then stands is printed, and exits by its
    status."""
    before = report.record.status
    try:
        report.record = _wait(report.record, timeout, quiet=as_json)
    except signals.Terminated:
        report.message = "--wait stopped by SIGTERM"
        report.record = STATE.ledger().get(report.record.action_id)
    except KeyboardInterrupt:
        report.message = "--wait interrupted"
        report.record = STATE.ledger().get(report.record.action_id)
    _after_wait(report, before)


def _after_wait(report: Any, before: Any) -> None:
    """Say what --wait saw; ``result`` stays what the call itself did."""
    rec = report.record
    if rec.status == before:
        report.message = f"{report.message}; --wait: still {rec.status}".lstrip("; ")
    else:
        by = f" by {rec.confirmed_by}" if rec.confirmed_by else ""
        why = f": {rec.reason}" if rec.reason and rec.status != "CONFIRMED" else ""
        report.message = f"--wait: {before} → {rec.status}{by}{why}"


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
should always give one.

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

CONFIRM_HELP = """Confirm a recorded action: dispatches it at most once, however many confirm.

Outcome and exit code: dispatched (by the new status), already_completed (0 or 5),
in_progress (3), blocked by an unresolved earlier dispatch (4), not_found (6).

\b
Examples:
  settled confirm order-42-booking
  settled confirm order-42-booking --wait --wait-timeout 120 --json
"""


def register(app: typer.Typer) -> None:
    @app.command(help=DISPATCH_HELP)
    def dispatch(
        provider: str = typer.Argument(
            ...,
            metavar="PROVIDER",
            autocompletion=complete.providers,
            help="Provider name (see `settled providers`).",
        ),
        operation: str = typer.Argument(
            ...,
            metavar="OPERATION",
            autocompletion=complete.operations,
            help="Operation of that provider.",
        ),
        params: str | None = typer.Option(
            None,
            "--params",
            metavar="JSON|@FILE|-",
            help="JSON object, @FILE, or - for stdin (at most 1 MiB).",
        ),
        action_id: str | None = typer.Option(
            None,
            "--action-id",
            metavar="ID",
            help="Your id for this action; repeating it never sends twice.",
        ),
        needs_confirmation: bool = typer.Option(
            False, "--needs-confirmation", help="Record only; `settled confirm` dispatches it."
        ),
        wait: bool = typer.Option(False, "--wait", help="Verify in-process until settled."),
        wait_timeout: float = typer.Option(
            60.0, "--wait-timeout", metavar="S", help="Seconds --wait may take."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
        from_: str | None = typer.Option(
            None,
            "--from",
            metavar="FILE|-",
            show_default=False,
            help="Bulk: JSON lines {action_id, params} from FILE, or - for stdin.",
        ),
        concurrency: int | None = typer.Option(
            None,
            "--concurrency",
            metavar="N",
            min=1,
            max=100,
            show_default=False,
            help="With --from: requests in flight at once (default: the provider's).",
        ),
    ) -> None:
        if from_ is not None or concurrency is not None:
            from .bulk import check_bulk_options, dispatch_from

            source = check_bulk_options(from_, params, action_id, needs_confirmation, wait)
            raise typer.Exit(dispatch_from(provider, operation, source, concurrency, as_json))
        values = parse_params(params)
        if action_id is not None:
            check_id(action_id)
        _check_wait_timeout(wait_timeout)
        if wait:
            signals.as_interrupt()  # a CI cancel is Ctrl-C: the record, and its status
        d = STATE.dispatcher(actor="dispatch")
        report = d.submit(
            provider, operation, values, action_id=action_id, needs_confirmation=needs_confirmation
        )
        if wait and report.record is not None and not needs_confirmation:
            _wait_for_report(report, wait_timeout, as_json)
        code = finish(report, as_json, render_report)
        if action_id is None:
            _rerun_hint(report)
        raise typer.Exit(code)

    @app.command(help=CONFIRM_HELP)
    def confirm(
        action_id: str = typer.Argument(
            ...,
            metavar="ACTION_ID",
            autocompletion=complete.action_ids,
            help="The action to confirm.",
        ),
        wait: bool = typer.Option(False, "--wait", help="Verify in-process until settled."),
        wait_timeout: float = typer.Option(
            60.0, "--wait-timeout", metavar="S", help="Seconds --wait may take."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    ) -> None:
        from ..dispatch import Outcome

        check_id(action_id)
        _check_wait_timeout(wait_timeout)
        if wait:
            signals.as_interrupt()  # a CI cancel is Ctrl-C: the record, and its status
        d = STATE.dispatcher(actor="confirm")
        report = d.confirm(action_id)
        if wait and report.outcome in (Outcome.DISPATCHED, Outcome.IN_PROGRESS) and report.record:
            _wait_for_report(report, wait_timeout, as_json)
        raise typer.Exit(finish(report, as_json, render_report))


__all__ = ["check_id", "parse_params", "register", "render_report", "term"]
