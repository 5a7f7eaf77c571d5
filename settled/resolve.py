"""A person settles what no query can, and leaves evidence."""

from __future__ import annotations

from datetime import datetime

from . import policy
from .errors import InvalidInput, TransitionNotAllowed
from .model import ActionRecord, Status
from .storage import Ledger


def resolve(  # noqa: PLR0913  (keyword-only: the verdict's fields)
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
    """Record an operator's attested verdict. Allowed from ``DENIED_UNRESOLVED``;
    from ``AWAITING_VERIFICATION`` when the operation requires manual verification;
    and on a terminal record that later evidence contradicts (the verdict corrects
    its status, or confirms it and clears the flag). The event keeps actor, reason,
    evidence and object id; ``confirmed_by`` becomes ``operator:NAME``."""
    if not reason or not reason.strip():
        raise InvalidInput("--reason is required: say how you know")
    if not by or not by.strip():
        raise InvalidInput("--by must not be empty")
    rec = ledger.get(action_id)
    move = policy.resolution(
        rec, applied=applied, reason=reason.strip(), by=by.strip(), now=now,
        evidence=evidence, object_id=object_id,
    )  # fmt: skip
    if move is None:
        hint = (
            "it is verified automatically; wait or run `settled reconcile`"
            if rec.status is Status.AWAITING_VERIFICATION
            else "resolve applies to unresolved actions only"
        )
        raise TransitionNotAllowed(f"action {action_id} is {rec.status}; {hint}")
    moved = ledger.move(move)
    if moved is None:
        current = ledger.get(action_id)
        raise TransitionNotAllowed(
            f"action {action_id} changed to {current.status} while resolving; check `settled show`"
        )
    return moved
