"""Waiting for an action to settle: ``dispatch --wait``, ``confirm --wait``, an agent
polling a tool, a script that needs the answer before it goes on.

Verification runs in the waiting process, through the same leased pass as the daemon
(``Reconciler.run_ids``), and only when a check is due: the schedule is the record's,
so waiting never asks the provider sooner or more often than the daemon would, and a
daemon running at the same time never doubles a query.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .clock import from_text, nap
from .model import ActionRecord, Status
from .reconcile import Reconciler

POLL = 0.2  # s between looks at a record another process is working on
MAX_SLEEP = 1.0  # s: wake at least this often, to notice changes made elsewhere


def only_a_person(rec: ActionRecord) -> bool:
    """Nothing automatic will move this record any more: a person must settle it."""
    if rec.status not in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED):
        return False
    if rec.next_check_at is None:
        return True
    return rec.requires_manual_verification and rec.status is Status.DENIED_UNRESOLVED


def wait_for(
    reconciler: Reconciler,
    action_id: str,
    timeout: float,
    *,
    on_progress: Callable[[ActionRecord], None] | None = None,
) -> ActionRecord:
    """Run verification until the record is terminal, only a person can settle it, or
    ``timeout`` seconds have passed; return the record as it then stands.

    ``on_progress(record)`` is called with the record whenever its status or its next
    scheduled check changes (and once at the start), so a caller can say what it is
    waiting for."""
    ledger, clock = reconciler.ledger, reconciler.clock
    deadline = time.monotonic() + timeout
    seen: tuple[str, str | None] | None = None
    while True:
        rec = ledger.get(action_id)
        state = (str(rec.status), rec.next_check_at)
        if on_progress is not None and state != seen:
            on_progress(rec)
        seen = state
        if rec.terminal or only_a_person(rec):
            return rec
        left = deadline - time.monotonic()
        if left <= 0:
            return rec
        due = from_text(rec.next_check_at or rec.lease_expires_at)
        gap = (due - clock.now()).total_seconds() if due else POLL
        if gap > 0:
            nap(min(gap, left, MAX_SLEEP))
            continue
        if rec.status is Status.PENDING:
            nap(min(POLL, left))  # another caller holds the confirmation; watch it
            continue
        reconciler.run_ids([rec.action_id])


__all__ = ["only_a_person", "wait_for"]
