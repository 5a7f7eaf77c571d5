"""A person settles what no query can, and leaves evidence."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .clock import to_text
from .errors import TransitionNotAllowed, UsageError
from .ledger import Ledger
from .model import Acceptance, ActionRecord, Delivery, Status


def resolve(
    ledger: Ledger,
    action_id: str,
    *,
    applied: bool,
    reason: str,
    by: str,
    now: datetime,
    evidence: str | None = None,
    object_id: str | None = None,
) -> ActionRecord:
    """Record an operator's attested verdict. Allowed from ``DENIED_UNRESOLVED``, and
    from ``AWAITING_VERIFICATION`` when the operation requires manual verification.
    The event keeps actor, reason, evidence and object id; ``confirmed_by`` becomes
    ``operator:NAME``."""
    if not reason or not reason.strip():
        raise UsageError("--reason is required: say how you know")
    if not by or not by.strip():
        raise UsageError("--by must not be empty")
    rec = ledger.get(action_id)
    allowed = rec.status is Status.DENIED_UNRESOLVED or (
        rec.status is Status.AWAITING_VERIFICATION and rec.requires_manual_verification
    )
    if not allowed:
        hint = (
            "it is verified automatically; wait or run `settled reconcile`"
            if rec.status is Status.AWAITING_VERIFICATION
            else "resolve applies to unresolved actions only"
        )
        raise TransitionNotAllowed(f"action {action_id} is {rec.status}; {hint}")
    actor = f"operator:{by.strip()}"
    at = to_text(now)
    to = Status.CONFIRMED if applied else Status.FAILED
    values: dict[str, Any] = {
        "next_check_at": None,
        "lease_owner": None,
        "acceptance": str(Acceptance.ACCEPTED if applied else Acceptance.REJECTED),
        "reason": f"resolved by {actor}: {reason.strip()}",
    }
    if applied:
        values.update(confirmed_at=at, confirmed_by=actor, delivery=str(Delivery.DELIVERED))
    if object_id:
        values["provider_object_id"] = object_id
    detail = {
        "verdict": "applied" if applied else "not_applied",
        "reason": reason.strip(),
        "evidence": evidence,
        "object_id": object_id,
        "by": by.strip(),
    }
    moved = ledger.transition(
        action_id,
        rec.status,
        to,
        actor=actor,
        kind="resolved",
        at=at,
        detail=detail,
        values=values,
    )
    if moved is None:
        current = ledger.get(action_id)
        raise TransitionNotAllowed(
            f"action {action_id} changed to {current.status} while resolving; check `settled show`"
        )
    return moved
