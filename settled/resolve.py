"""A person settles what no query can, and leaves evidence.

A person's "not applied" verdict is weighed against the world first (rule 14): on an
operation that has a query, one more check is made before it is recorded. When that
check sees the effect, the verdict is refused and the record settles by the evidence;
when it cannot be made, the verdict is refused unless the person says to record it
without one (``recheck=False``, ``--no-recheck``), which its event keeps.
"""

from __future__ import annotations

from datetime import datetime

from . import policy
from .errors import InvalidInput, RecheckFailed, TransitionNotAllowed
from .model import ActionRecord, Move, Status
from .providers.base import Providers
from .storage import Ledger

NO_RECHECK = "skipped (--no-recheck)"


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
    registry: Providers | None = None,
    recheck: bool = True,
) -> ActionRecord:
    """Record an operator's attested verdict. Allowed from ``DENIED_UNRESOLVED``;
    from ``AWAITING_VERIFICATION`` when the operation requires manual verification;
    and on a terminal record that later evidence contradicts (the verdict corrects
    its status, or confirms it and clears the flag). The event keeps actor, reason,
    evidence and object id; ``confirmed_by`` becomes ``operator:NAME``.

    A "not applied" verdict on an operation that has a query is first checked against
    the provider through ``registry`` (rule 14): ``EffectVisible`` when the effect is
    there (the record is then CONFIRMED by reconciliation), ``RecheckFailed`` when the
    check cannot be made or cannot tell (nothing written). ``recheck=False`` records
    the verdict without that check, and its event says so. ``applied`` verdicts need
    no check."""
    if not reason or not reason.strip():
        raise InvalidInput("--reason is required: say how you know")
    if not by or not by.strip():
        raise InvalidInput("--by must not be empty")
    rec = ledger.get(action_id)
    who = by.strip()

    def verdict(recheck_note: str | None = None, checked: bool = False) -> Move | None:
        return policy.resolution(
            rec,
            applied=applied,
            reason=reason.strip(),
            by=who,
            now=now,
            evidence=evidence,
            object_id=object_id,
            recheck=recheck_note,
            checked=checked,
        )

    move = verdict()
    if move is None:
        hint = (
            "it is verified automatically; wait or run `settled reconcile`"
            if rec.status is Status.AWAITING_VERIFICATION
            else "resolve applies to unresolved actions only"
        )
        raise TransitionNotAllowed(f"action {action_id} is {rec.status}; {hint}")
    if not applied:
        note, checked = _recheck(ledger, registry, rec, now, by=who, recheck=recheck)
        move = verdict(note, checked)
        assert move is not None  # the record is as it was: the check wrote nothing
    moved = ledger.move(move)
    if moved is None:
        current = ledger.get(action_id)
        raise TransitionNotAllowed(
            f"action {action_id} changed to {current.status} while resolving; check `settled show`"
        )
    return moved


def _recheck(
    ledger: Ledger,
    registry: Providers | None,
    rec: ActionRecord,
    now: datetime,
    *,
    by: str,
    recheck: bool,
) -> tuple[str, bool]:
    """What the verdict's event says about the check made first, and whether it asked
    the provider; raises when that check refuses the verdict."""
    if not recheck:
        return NO_RECHECK, False
    from .reconcile import Reconciler

    if registry is None:
        why_not = policy.recheck_needed(rec, rec.declared)
        if why_not:
            return f"not needed: {why_not}", False
        raise RecheckFailed(
            f"action {rec.action_id}: the verdict is refused: it must be checked against "
            "the provider first, and no provider registry was given (pass registry=, or "
            "recheck=False to record it without a check)"
        )
    checker = Reconciler(ledger, registry, clock=ledger.clock(anchor=False), actor="recheck")
    seen = checker.recheck(rec, now, asked=f"operator:{by} (resolve --not-applied)")
    if seen.refuses:
        raise seen.refusal("the verdict")
    return seen.note, seen.queried


__all__ = ["NO_RECHECK", "resolve"]
