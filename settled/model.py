"""The domain: capability tiers, statuses on three axes, the dispatch strategy,
the action record, and the one table of allowed status moves.

Nothing here touches storage or the network.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from .clock import plus
from .errors import TransitionNotAllowed

DEFAULT_CONSISTENCY_WINDOW = 30.0


class Tier(StrEnum):
    """What a provider operation can prove, declared at registration."""

    FULL = "full"  # delivery and acceptance, in the response
    RECONCILABLE = "reconcilable"  # nothing directly; state can be queried afterwards
    PARTIAL = "partial"  # delivery only; a person verifies acceptance
    BLIND = "blind"  # nothing: no receipt, no query


class Status(StrEnum):
    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    AWAITING_VERIFICATION = "AWAITING_VERIFICATION"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    DENIED_UNRESOLVED = "DENIED_UNRESOLVED"


class Delivery(StrEnum):
    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"  # provably not delivered
    UNKNOWN = "UNKNOWN"  # sent, no answer


class Acceptance(StrEnum):
    UNKNOWN = "UNKNOWN"
    ACCEPTED = "ACCEPTED"  # effect observed
    REJECTED = "REJECTED"  # provably not applied


TERMINAL = frozenset({Status.CONFIRMED, Status.FAILED})
# The one table of allowed moves. A move to the same status records new evidence
# (a check that found nothing yet) without changing what people read.
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.PENDING, Status.IN_FLIGHT),  # the atomic claim
        (Status.IN_FLIGHT, Status.CONFIRMED),  # full tier, the reply proves the effect
        (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION),  # delivered/accepted, verify later
        (Status.IN_FLIGHT, Status.FAILED),  # rejected, or never sent within the budget
        (Status.IN_FLIGHT, Status.DENIED_UNRESOLVED),  # ambiguous outcome, blind, lost lease
        (Status.AWAITING_VERIFICATION, Status.AWAITING_VERIFICATION),
        (Status.AWAITING_VERIFICATION, Status.CONFIRMED),
        (Status.AWAITING_VERIFICATION, Status.FAILED),
        (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED),
        (Status.DENIED_UNRESOLVED, Status.DENIED_UNRESOLVED),
        (Status.DENIED_UNRESOLVED, Status.CONFIRMED),
        (Status.DENIED_UNRESOLVED, Status.FAILED),
        (Status.FAILED, Status.PENDING),  # retry: attempt N+1, new idempotency key
    }
)


def check_transition(frm: Status, to: Status) -> None:
    if (frm, to) not in TRANSITIONS:
        raise TransitionNotAllowed(f"{frm} → {to} is not an allowed move")


def new_reconciliation_key() -> str:
    return "stl-" + uuid.uuid4().hex


@dataclass(frozen=True)
class DispatchStrategy:
    """Fixed and stored before any request leaves."""

    tier: Tier
    reconciliation_key: str | None
    eligible_at: datetime | None  # None: never eligible for automatic checks
    requires_manual_verification: bool


def build_strategy(
    tier: Tier | str,
    now: datetime,
    window: float = DEFAULT_CONSISTENCY_WINDOW,
    *,
    carries_key: bool = False,
    key: str | None = None,
) -> DispatchStrategy:
    """The seeds' rules, with one addition: a ``full`` operation that can carry a key
    (``carries_key``, e.g. a CalDAV UID) gets one, so that a reply lost on the wire can
    still be reconciled instead of waiting for a person."""
    tier = Tier(tier)
    if window < 0:
        raise ValueError("consistency window must be >= 0")
    if tier is Tier.FULL:
        k = (key or new_reconciliation_key()) if carries_key else None
        return DispatchStrategy(tier, k, now, False)
    if tier is Tier.RECONCILABLE:
        return DispatchStrategy(tier, key or new_reconciliation_key(), plus(now, window), False)
    if tier is Tier.PARTIAL:
        return DispatchStrategy(tier, key or new_reconciliation_key(), plus(now, window), True)
    return DispatchStrategy(tier, None, None, True)


def idempotency_key(action_id: str, attempt: int) -> str:
    return f"{action_id}:{attempt}"


# Public JSON fields of a record, in the order DESIGN.md lists them.
RECORD_FIELDS = (
    "action_id",
    "provider",
    "operation",
    "params",
    "params_hash",
    "tier",
    "reconciliation_key",
    "eligible_at",
    "requires_manual_verification",
    "attempt",
    "idempotency_key",
    "dispatch_id",
    "provider_object_id",
    "status",
    "delivery",
    "acceptance",
    "dispatched_at",
    "confirmed_at",
    "confirmed_by",
    "created_at",
    "updated_at",
    "lease_owner",
    "lease_expires_at",
    "next_check_at",
    "verify_deadline_at",
    "checks",
    "reason",
)


@dataclass
class ActionRecord:
    action_id: str
    provider: str
    operation: str
    params: Any
    params_hash: str
    tier: Tier
    reconciliation_key: str | None
    eligible_at: str | None
    requires_manual_verification: bool
    attempt: int
    idempotency_key: str
    dispatch_id: str | None
    provider_object_id: str | None
    status: Status
    delivery: Delivery
    acceptance: Acceptance
    dispatched_at: str | None
    confirmed_at: str | None
    confirmed_by: str | None
    created_at: str
    updated_at: str
    lease_owner: str | None = None
    lease_expires_at: str | None = None
    next_check_at: str | None = None
    verify_deadline_at: str | None = None
    checks: int = 0
    reason: str | None = None
    snapshot: Any = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ActionRecord:
        snap = row.get("snapshot")
        return cls(
            action_id=row["action_id"],
            provider=row["provider"],
            operation=row["operation"],
            params=json.loads(row["params"]),
            params_hash=row["params_hash"],
            tier=Tier(row["tier"]),
            reconciliation_key=row["reconciliation_key"],
            eligible_at=row["eligible_at"],
            requires_manual_verification=bool(row["requires_manual_verification"]),
            attempt=row["attempt"],
            idempotency_key=row["idempotency_key"],
            dispatch_id=row["dispatch_id"],
            provider_object_id=row["provider_object_id"],
            status=Status(row["status"]),
            delivery=Delivery(row["delivery"]),
            acceptance=Acceptance(row["acceptance"]),
            dispatched_at=row["dispatched_at"],
            confirmed_at=row["confirmed_at"],
            confirmed_by=row["confirmed_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            lease_owner=row["lease_owner"],
            lease_expires_at=row["lease_expires_at"],
            next_check_at=row["next_check_at"],
            verify_deadline_at=row["verify_deadline_at"],
            checks=row["checks"],
            reason=row["reason"],
            snapshot=json.loads(snap) if snap is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("snapshot")
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in d.items()}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Event:
    id: int
    action_id: str
    at: str
    actor: str
    kind: str
    from_status: str | None
    to_status: str
    attempt: int
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def params_hash(params: Any) -> str:
    import hashlib

    canon = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()

