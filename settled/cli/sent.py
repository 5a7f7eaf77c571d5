"""A report of a send (dispatch, confirm, retry) as a person reads it, and ``--wait``
after it: verification in this process until the record settles."""

from __future__ import annotations

import sys
import time
from typing import Any

from ..advice import next_step
from ..display import iso, span
from . import signals
from .common import STATE
from .render import console, is_tty, status_text, text


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


def check_wait_timeout(value: float) -> None:
    from ..errors import InvalidInput

    if not value >= 0 or value == float("inf"):
        raise InvalidInput(f"--wait-timeout {value!r}: must be a finite number of seconds >= 0")


def wait_for_report(report: Any, timeout: float, as_json: bool) -> None:
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
