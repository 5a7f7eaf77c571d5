"""The leases one holder still holds, and their release once a person names it dead.

A dispatch lease (``IN_FLIGHT``) is released by exactly the move the reconciler makes
when a dispatcher's lease expires (``policy.expire``): the record becomes
``DENIED_UNRESOLVED``, so a request that may have left is checked, never sent again.
A check lease is handed back, due at once (a repeated check, never a send). Every
release is a guarded move on the record as it was read, with its event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from . import policy
from .clock import from_text, to_text
from .model import ActionRecord, EventKind, Move, Status

if TYPE_CHECKING:
    from .storage.ledger import Ledger

# the statuses a lease can be held in: a dispatch claim, or a check
LEASED = (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)


@dataclass(frozen=True)
class Held:
    """One lease of a holder: the record as read, what kind, and until when."""

    record: ActionRecord
    kind: str  # "dispatch" or "check"
    until: str | None


def held_by(ledger: Ledger, holder: str, now: datetime) -> list[Held]:
    """The leases ``holder`` holds: every dispatch claim still ``IN_FLIGHT`` (lapsed or
    not: a lapsed one is released the same way the reconciler would), and every check
    lease that has not run out at ``now``."""
    out: list[Held] = []
    for rec in ledger.query(statuses=[str(s) for s in LEASED]):
        if rec.lease_owner != holder:
            continue
        if rec.status is Status.IN_FLIGHT:
            out.append(Held(rec, "dispatch", rec.lease_expires_at))
            continue
        due = from_text(rec.next_check_at)
        if due is not None and due > now:
            out.append(Held(rec, "check", rec.next_check_at))
    return out


def release_move(h: Held, *, holder: str, actor: str, reason: str, now: datetime) -> Move:
    """The move that releases one lease, recorded as the person's."""
    rec = h.record
    if h.kind == "dispatch":
        return policy.expire(
            rec,
            None,
            now,
            actor=actor,
            problem="released by settled unlock",
            recheck=0.0,
            released=(actor, reason),
        )
    return Move(
        rec.action_id,
        rec.status,
        rec.status,
        to_text(now),
        actor,
        EventKind.NOTE,
        values={"lease_owner": None, "next_check_at": to_text(now)},
        detail={
            "unlocked": holder,
            "lease": "check",
            "lease_until": rec.next_check_at,
            "released_by": actor,
            "reason": reason,
        },
        owner=holder,
    )


def release(
    ledger: Ledger,
    held: Sequence[Held],
    *,
    holder: str,
    actor: str,
    reason: str,
    now: datetime,
) -> list[bool]:
    """Release each lease, each guarded on the record as read: one that moved on
    meanwhile (its holder was alive after all, or a reconciler expired it) is left as
    it is. Whether each was released."""
    done: list[bool] = []
    for h in held:
        move = release_move(h, holder=holder, actor=actor, reason=reason, now=now)
        moved = ledger.move(move, record=h.record)
        done.append(moved is not None)
    return done
