"""Records written straight into a ledger, for tests of what people see: any id,
any reason, in DENIED_UNRESOLVED (or another status) without a provider."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from settled.clock import plus, to_text, utcnow
from settled.ledger import Ledger
from settled.model import Status


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
) -> None:
    at = to_text(plus(utcnow(), -age))
    body = json.dumps(params if params is not None else {"to": "x"}, ensure_ascii=False)
    ledger.record(
        {
            "action_id": action_id,
            "provider": provider,
            "operation": operation,
            "params": body,
            "params_hash": hashlib.sha256(body.encode()).hexdigest(),
            "tier": tier,
            "reconciliation_key": None,
            "eligible_at": None,
            "requires_manual_verification": 1 if tier in ("blind", "partial") else 0,
            "attempt": 1,
            "idempotency_key": f"{action_id}:1",
            "status": "PENDING",
            "delivery": "PENDING",
            "acceptance": "UNKNOWN",
            "created_at": at,
            "updated_at": at,
            "checks": 0,
        },
        actor=by,
        at=at,
    )
    if status is Status.PENDING:
        return
    ledger.transition(
        action_id,
        Status.PENDING,
        Status.IN_FLIGHT,
        actor=by,
        kind="claimed",
        at=at,
        values={"lease_expires_at": to_text(plus(utcnow(), 60))},
        detail={"idempotency_key": f"{action_id}:1"},
    )
    if status is Status.IN_FLIGHT:
        return
    ledger.transition(
        action_id,
        Status.IN_FLIGHT,
        status,
        actor=by,
        kind="outcome",
        at=at,
        values={
            "reason": reason,
            "lease_expires_at": None,
            "dispatched_at": at,
            "delivery": "UNKNOWN",
        },
        detail={"reason": reason},
    )
