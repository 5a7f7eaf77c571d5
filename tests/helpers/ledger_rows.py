"""Records written straight into a ledger, for tests of what people see: any id,
any reason, in DENIED_UNRESOLVED (or another status) without a provider."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from records import declared

from settled import Ledger, policy
from settled.clock import plus, to_text, utcnow
from settled.model import EventKind, Status, Tier
from settled.storage import Move


def add(
    ledger: Ledger,
    action_id: str,
    *,
    provider: str = "sim",
    operation: str = "notify",
    reason: str = "blind operation: nothing can observe the effect; a person must verify it",
    params: Any = None,
    age: float = 0.0,
    status: Status = Status.DENIED_UNRESOLVED,
    tier: str = "blind",
    by: str = "test",
    now: datetime | None = None,
) -> None:
    when = plus(now if now is not None else utcnow(), -age)
    at = to_text(when)
    rec = policy.new_record(
        action_id=action_id,
        provider=provider,
        operation=operation,
        params={"to": "x"} if params is None else params,
        declared=declared(Tier(tier)),
        now=when,
    )
    ledger.record(rec, actor=by)
    if status is Status.PENDING:
        return
    lease = to_text(plus(utcnow(), 60))
    ledger.move(
        Move(
            action_id,
            Status.PENDING,
            Status.IN_FLIGHT,
            at,
            by,
            EventKind.CLAIMED,
            values={"lease_expires_at": lease},
            detail={"idempotency_key": f"{action_id}:1", "lease_expires_at": lease},
        )
    )
    if status is Status.IN_FLIGHT:
        return
    ledger.move(
        Move(
            action_id,
            Status.IN_FLIGHT,
            status,
            at,
            by,
            EventKind.OUTCOME,
            values={
                "reason": reason,
                "lease_expires_at": None,
                "dispatched_at": at,
                "delivery": "UNKNOWN",
            },
            detail={"reason": reason},
        )
    )
