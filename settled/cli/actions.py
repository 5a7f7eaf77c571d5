"""dispatch, confirm, show, queue: the everyday commands."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from .common import (
    EXIT_BY_STATUS,
    STATE,
    STATUS_STYLE,
    age,
    console,
    emit_json,
    next_step,
    one_line,
    parse_duration,
    report_exit,
)

STATUSES = (
    "PENDING",
    "IN_FLIGHT",
    "AWAITING_VERIFICATION",
    "CONFIRMED",
    "FAILED",
    "DENIED_UNRESOLVED",
)


def parse_params(raw: str | None) -> Any:
    from ..errors import UsageError

    if raw is None:
        return {}
    source = "--params"
    if raw == "-":
        text = sys.stdin.read()
        source = "--params - (stdin)"
    elif raw.startswith("@"):
        path = raw[1:]
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise UsageError(f"--params @{path}: file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--params @{path}: cannot read: {exc}") from None
        source = f"--params @{path}"
    else:
        text = raw
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise UsageError(f"{source} is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object, got {type(value).__name__}")
    try:  # Python's json accepts NaN, Infinity, 1e999 and lone surrogates; JSON does not
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc})") from None
    return value


def check_id(action_id: str) -> str:
    from ..errors import UsageError

    if not action_id or len(action_id) > 200 or not action_id.isprintable() or action_id != action_id.strip():
        raise UsageError(
            "action id must be 1-200 printable characters without surrounding spaces"
        )
    return action_id


def _report_out(report: Any, as_json: bool) -> int:
    if as_json:
        emit_json(report.to_json())
    else:
        render_report(report)
    return report_exit(report)


def render_report(report: Any) -> None:
    con = console()
    rec = report.record
    if rec is None:
        console(stderr=True).print(f"{report.outcome}: {report.message}")
        return
    style = STATUS_STYLE.get(str(rec.status), "white")
    result = f" → {report.result}" if report.result else ""
    con.print(
        f"[bold]{rec.action_id}[/]  {rec.provider}.{rec.operation} ({rec.tier})  "
        f"[{style}]{rec.status}[/]  {report.outcome}{result}"
    )
    why = report.message or rec.reason
    if why:
        con.print(f"  why:  {why}", markup=False)
    con.print(f"  next: {next_step(rec)}", markup=False)


def _wait(record: Any, timeout: float) -> Any:
    """``--wait``: verification in this process (``settled.wait``), until settled."""
    from ..clock import Clock
    from ..wait import wait_for

    return wait_for(STATE.reconciler(clock=Clock(), actor="wait"), record.action_id, timeout)


def _check_wait_timeout(value: float) -> None:
    from ..errors import UsageError

    if not value >= 0 or value == float("inf"):
        raise UsageError(f"--wait-timeout {value!r}: must be a finite number of seconds >= 0")


def _after_wait(report: Any, before: Any) -> None:
    """Say what --wait saw; ``result`` stays what the call itself did."""
    rec = report.record
    if rec.status == before:
        report.message = f"{report.message}; --wait: still {rec.status}".lstrip("; ")
    else:
        by = f" by {rec.confirmed_by}" if rec.confirmed_by else ""
        why = f": {rec.reason}" if rec.reason and rec.status != "CONFIRMED" else ""
        report.message = f"--wait: {before} → {rec.status}{by}{why}"


def register(app: typer.Typer) -> None:
    @app.command()
    def dispatch(
        provider: str = typer.Argument(..., help="Provider name (see `settled providers`)."),
        operation: str = typer.Argument(..., help="Operation of that provider."),
        params: str = typer.Option(None, "--params", help="JSON object, @FILE, or - for stdin."),
        action_id: str = typer.Option(
            None, "--action-id", help="Your id for this action; repeating it never sends twice."
        ),
        needs_confirmation: bool = typer.Option(
            False, "--needs-confirmation", help="Record only; `settled confirm` dispatches it."
        ),
        wait: bool = typer.Option(False, "--wait", help="Verify in-process until settled."),
        wait_timeout: float = typer.Option(60.0, "--wait-timeout", help="Seconds --wait may take."),
        as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
        from_: str = typer.Option(
            None, "--from", help="Bulk: JSON lines {action_id, params} from FILE, or - for stdin.",
            show_default=False,
        ),
        concurrency: int = typer.Option(
            None, "--concurrency", min=1, max=100, show_default=False,
            help="With --from: requests in flight at once (default: the provider's).",
        ),
    ) -> None:
        """Record an action and dispatch it (exit code = its status).

        With --from, one action per line; exit 0 when every line did what was asked,
        else the highest exit code among the lines."""
        if from_ is not None or concurrency is not None:
            from .bulk import check_bulk_options, dispatch_from

            check_bulk_options(from_, params, action_id, needs_confirmation, wait)
            raise typer.Exit(dispatch_from(provider, operation, from_, concurrency, as_json))
        values = parse_params(params)
        if action_id is not None:
            check_id(action_id)
        _check_wait_timeout(wait_timeout)
        d = STATE.dispatcher(actor="dispatch")
        report = d.submit(
            provider, operation, values, action_id=action_id, needs_confirmation=needs_confirmation
        )
        if wait and report.record is not None and not needs_confirmation:
            before = report.record.status
            report.record = _wait(report.record, wait_timeout)
            _after_wait(report, before)
        raise typer.Exit(_report_out(report, as_json))

    @app.command()
    def confirm(
        action_id: str = typer.Argument(..., help="The action to confirm."),
        wait: bool = typer.Option(False, "--wait", help="Verify in-process until settled."),
        wait_timeout: float = typer.Option(60.0, "--wait-timeout", help="Seconds --wait may take."),
        as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    ) -> None:
        """Confirm a recorded action: dispatches it at most once, however many confirm."""
        from ..dispatch import Outcome

        check_id(action_id)
        _check_wait_timeout(wait_timeout)
        d = STATE.dispatcher(actor="confirm")
        report = d.confirm(action_id)
        if wait and report.outcome in (Outcome.DISPATCHED, Outcome.IN_PROGRESS) and report.record:
            before = report.record.status
            report.record = _wait(report.record, wait_timeout)
            _after_wait(report, before)
        raise typer.Exit(_report_out(report, as_json))

    @app.command()
    def show(
        action_id: str = typer.Argument(..., help="The action to show."),
        as_json: bool = typer.Option(False, "--json", help="The record and its events as JSON."),
    ) -> None:
        """Show one action and its full event timeline."""
        check_id(action_id)
        ledger = STATE.ledger()
        rec = ledger.get(action_id)
        events = ledger.events(action_id)
        if as_json:
            data = rec.to_json()
            data["events"] = [e.to_json() for e in events]
            emit_json(data)
        else:
            render_show(rec, events)
        raise typer.Exit(EXIT_BY_STATUS[rec.status])

    @app.command()
    def queue(
        status: str = typer.Option(
            "DENIED_UNRESOLVED", "--status", help="Status to list (comma-separated, or 'all')."
        ),
        provider: str = typer.Option(None, "--provider", help="Only this provider."),
        older_than: str = typer.Option(None, "--older-than", help="Only older than e.g. 10m."),
        fail_if_any: bool = typer.Option(
            False, "--fail-if-any", help="Exit 4 when any row is listed (for monitors)."
        ),
        limit: int = typer.Option(1000, "--limit", help="At most this many rows.", min=1),
        as_json: bool = typer.Option(False, "--json", help="Rows as a JSON array."),
    ) -> None:
        """The queue of actions nobody can call done yet, oldest first."""
        from ..clock import plus, to_text, utcnow
        from ..errors import UsageError

        if status.strip().lower() == "all":
            statuses = list(STATUSES)
        else:
            statuses = [s.strip().upper() for s in status.split(",") if s.strip()]
            bad = [s for s in statuses if s not in STATUSES]
            if bad or not statuses:
                raise UsageError(
                    f"--status {status!r}: unknown status; use one of {', '.join(STATUSES)} or all"
                )
        now = utcnow()
        before = to_text(plus(now, -parse_duration(older_than))) if older_than else None
        rows = STATE.ledger().query(
            statuses=statuses, provider=provider, created_before=before,
            limit=min(limit, 2**63 - 1),  # SQLite's largest integer; more rows cannot exist
        )
        if as_json:
            emit_json([{**r.to_json(), "next": next_step(r)} for r in rows])
        else:
            render_queue(rows, now, statuses)
        raise typer.Exit(4 if (fail_if_any and rows) else 0)


def render_queue(rows: list[Any], now: Any, statuses: list[str]) -> None:
    from rich.table import Table

    con = console()
    if not rows:
        con.print(f"queue ({', '.join(statuses)}): empty")
        return
    t = Table(title=f"queue: {', '.join(statuses)} ({len(rows)})", title_justify="left")
    t.add_column("action", no_wrap=True)
    t.add_column("age", no_wrap=True)
    t.add_column("operation", no_wrap=True)
    t.add_column("tier", no_wrap=True)
    t.add_column("att", justify="right")
    t.add_column("status", no_wrap=True)
    t.add_column("settles next")
    t.add_column("why", max_width=60)
    for r in rows:
        t.add_row(
            r.action_id,
            age(r.created_at, now),
            f"{r.provider}/{r.operation}",
            str(r.tier),
            str(r.attempt),
            f"[{STATUS_STYLE.get(str(r.status), 'white')}]{r.status}[/]",
            next_step(r),
            (r.reason or "")[:120],
        )
    con.print(t)


def event_detail(e: Any) -> str:
    """One event's evidence in words: the reason, then what backs it."""
    d = e.detail
    parts = [str(d["reason"])] if d.get("reason") else []
    for key, label in (("evidence", "evidence"), ("object_id", "object"), ("seen", "seen"),
                       ("check", "check"), ("lease_expires_at", "lease")):
        if d.get(key) not in (None, "") and (key != "lease_expires_at" or e.kind != "claimed"):
            parts.append(f"{label}: {d[key]}")
    if e.kind == "claimed":
        parts.append(f"key {d.get('idempotency_key')}, lease until {d.get('lease_expires_at')}")
    if e.kind == "retry":
        parts.append(f"attempt {d.get('attempt')}; previous key {d.get('previous_idempotency_key')}")
    if e.kind == "recorded":
        parts.append(f"tier {d.get('tier')}, eligible at {d.get('eligible_at') or 'never'}")
    if not parts:
        parts.append(json.dumps(d, ensure_ascii=False)[:160])
    return one_line("; ".join(parts))[:300]


def render_show(rec: Any, events: list[Any]) -> None:
    from rich.table import Table

    con = console()
    style = STATUS_STYLE.get(str(rec.status), "white")
    con.print(f"[bold]{rec.action_id}[/]  [{style}]{rec.status}[/]")
    fields = [
        ("provider/operation", f"{rec.provider}/{rec.operation}"),
        ("tier", str(rec.tier)),
        ("attempt", f"{rec.attempt} (idempotency key {rec.idempotency_key})"),
        ("delivery / acceptance", f"{rec.delivery} / {rec.acceptance}"),
        ("reconciliation key", rec.reconciliation_key or "-"),
        ("eligible at", rec.eligible_at or "never (manual verification)"),
        ("provider object", rec.provider_object_id or "-"),
        ("confirmed", f"{rec.confirmed_at} by {rec.confirmed_by}" if rec.confirmed_at else "-"),
        ("why", rec.reason or "-"),
        ("next", next_step(rec)),
    ]
    for k, v in fields:
        con.print(f"  {k:<22} {v}", markup=False, highlight=False)
    t = Table(title="events", title_justify="left")
    for col in ("#", "at", "actor", "kind", "move", "detail"):
        t.add_column(col, overflow="fold")
    for e in events:
        move = f"{e.from_status or '∅'} → {e.to_status}"
        t.add_row(str(e.id), e.at[:19].replace("T", " "), e.actor, e.kind, move, event_detail(e))
    con.print(t)
