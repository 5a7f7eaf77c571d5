"""Records and moves made by hand, for tests of the ledger itself."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from settled import policy
from settled.clock import to_text
from settled.model import ActionRecord, Declared, EventKind, Status, Tier
from settled.storage import Ledger, Move

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AT = to_text(T0)


def declared(tier: Tier = Tier.FULL, **over: Any) -> Declared:
    """What a queryable operation of ``tier`` declares, with no window."""
    base: dict[str, Any] = {
        "consistency_window": 0.0,
        "queryable": tier in (Tier.FULL, Tier.RECONCILABLE),
        "carries_key": tier is not Tier.BLIND,
        "verify_interval": 1.0,
        "verify_deadline": 60.0,
    }
    return Declared(tier, **{**base, **over})


def new_record(
    aid: str = "a-1",
    params: Any = None,
    *,
    tier: Tier = Tier.FULL,
    provider: str = "p",
    operation: str = "o",
    now: datetime = T0,
    **over: Any,
) -> ActionRecord:
    return policy.new_record(
        action_id=aid,
        provider=provider,
        operation=operation,
        params={} if params is None else params,
        declared=declared(tier, **over),
        now=now,
    )


def move(
    aid: str, frm: Status, to: Status, kind: EventKind = EventKind.CLAIMED, **values: Any
) -> Move:
    return Move(aid, frm, to, AT, "t", kind, values=values)


def transition(
    led: Ledger,
    aid: str,
    frm: Status,
    to: Status,
    *,
    kind: EventKind,
    at: str = AT,
    owner: str | None = None,
    **values: Any,
) -> ActionRecord | None:
    """One guarded move, as the core makes them."""
    return led.move(Move(aid, frm, to, at, "t", kind, values=values, owner=owner))
