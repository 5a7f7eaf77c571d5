"""A person settles what no query can, and leaves evidence.

A person's "not applied" verdict is weighed against the world first (rule 14): on an
operation that has a query, one more check is made before it is recorded. When that
check sees the effect, the verdict is refused and the record settles by the evidence;
when it cannot be made, the verdict is refused unless the person says to record it
without one (``recheck=False``, ``--no-recheck``), which its event keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from . import policy, tracing
from .crashpoints import Probe, no_probe
from .errors import (
    EffectVisible,
    InvalidInput,
    NotFound,
    RecheckFailed,
    SettledError,
    TransitionNotAllowed,
)
from .model import ActionRecord, EventKind, Move, Status, name_problem
from .providers.base import Providers
from .selection import Target
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
    via: str | None = None,
    correct: bool = False,
    probe: Probe = no_probe,
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
    no check.

    ``via``: the authenticated surface that vouches for ``by`` (``api:TOKEN``), set by
    the service that authenticated the caller; ``by`` may then be empty (the surface
    alone attests) and never holds `` via `` or a control character
    (``policy.resolution`` says how the event keeps the two).

    ``correct``: correct a person's earlier verdict that later proved wrong (the
    customer did receive it): allowed only on a terminal record whose status that
    verdict set, on the same attempt (never once a retry opened a new one), and only
    with ``evidence``; the event says which verdict it corrects (``corrects``)."""
    if not reason or not reason.strip():
        raise InvalidInput("--reason is required: say how you know")
    if via is None and (not by or not by.strip()):
        raise InvalidInput("--by must not be empty")
    if by and by.strip() and name_problem(by.strip()):
        raise InvalidInput(f"by: {name_problem(by.strip())}")
    named = tracing.record(action_id, "", "")
    with tracing.span("settled.verdict", {**named, "settled.applied": applied}) as s:
        try:
            moved = _resolve(
                ledger,
                action_id,
                applied=applied,
                reason=reason,
                by=by,
                now=now,
                evidence=evidence,
                object_id=object_id,
                registry=registry,
                recheck=recheck,
                via=via,
                correct=correct,
                probe=probe,
            )
        except SettledError as exc:
            tracing.note(s, **{"settled.outcome": "refused", "error.type": type(exc).__name__})
            raise
        tracing.note(
            s,
            **{
                **tracing.record(action_id, moved.provider, moved.operation, moved.tier),
                "settled.outcome": "recorded",
                "settled.status": str(moved.status),
            },
        )
        return moved


def _resolve(  # noqa: PLR0913  (keyword-only: the verdict's fields)
    ledger: Ledger,
    action_id: str,
    *,
    applied: bool,
    reason: str,
    by: str,
    now: datetime,
    evidence: str | None,
    object_id: str | None,
    registry: Providers | None,
    recheck: bool,
    via: str | None,
    correct: bool,
    probe: Probe,
) -> ActionRecord:
    rec = ledger.get(action_id)
    who = by.strip()
    corrects = _corrected(ledger, rec, evidence) if correct else None

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
            via=via,
            corrects=corrects,
        )

    def refused(current: ActionRecord, why: str) -> None:
        """Keep the person's claim, refused, as an event on the record as it stands."""
        ledger.move(
            policy.refused_verdict(
                current,
                applied=applied,
                reason=reason.strip(),
                by=who,
                now=now,
                why=why,
                evidence=evidence,
                object_id=object_id,
                via=via,
            )
        )

    move = verdict()
    if move is None:
        hint = (
            "it is verified automatically; wait or run `settled reconcile`"
            if rec.status is Status.AWAITING_VERIFICATION
            else "resolve applies to unresolved actions only"
        )
        # not a claim weighed and refused, only one made on the wrong record: nothing kept
        raise TransitionNotAllowed(f"action {action_id} is {rec.status}{_won(ledger, rec)}; {hint}")
    if not applied:
        try:
            note, checked = _recheck(
                ledger,
                registry,
                rec,
                now,
                by=policy.attested(who, via),
                recheck=recheck,
                probe=probe,
            )
        except EffectVisible as exc:  # settled by the evidence: the claim is kept beside it
            refused(exc.record, str(exc))  # type: ignore[arg-type]
            raise
        except RecheckFailed as exc:
            if registry is not None:  # without one it is the caller's mistake, not a refusal
                refused(rec, str(exc))
            raise
        move = verdict(note, checked)
        assert move is not None  # the record is as it was: the check wrote nothing
    moved = ledger.move(move)
    if moved is None:
        current = ledger.get(action_id)
        why = (
            f"action {action_id} changed to {current.status}{_won(ledger, current)} while "
            "resolving; check `settled show`"
        )
        refused(current, why)
        raise TransitionNotAllowed(why)
    return moved


def record_verdicts(
    ledger: Ledger,
    targets: Sequence[Target],
    verdict: Mapping[str, Any],
    *,
    advance: Callable[[], None] | None = None,
) -> list[tuple[Target, SettledError | None]]:
    """Record one verdict (``resolve``'s keywords) for each target not skipped, one at a
    time: each is its own checked move, after its own check of the provider, so an
    action changed meanwhile, or whose check refuses the verdict, is reported, not
    forced. The CLI's ``resolve`` and the console's bulk form both come here. Returns
    each target as it ended (its record, or why it was left alone) with the error that
    refused it (None when it was recorded, or skipped before anything was done);
    ``advance`` is called after each one tried."""
    done: list[tuple[Target, SettledError | None]] = []
    for t in targets:
        if t.skip:
            done.append((t, None))
            continue
        try:
            moved = resolve(ledger, t.action_id, **verdict)
        except NotFound as exc:
            done.append((replace(t, record=None, skip=str(exc)), exc))
        except EffectVisible as exc:  # settled by the evidence instead
            done.append((replace(t, record=exc.record, skip=str(exc)), exc))
        except SettledError as exc:  # changed meanwhile, or no check possible
            done.append((replace(t, skip=str(exc)), exc))
        else:
            done.append((replace(t, record=moved), None))
        if advance is not None:
            advance()
    return done


def _corrected(ledger: Ledger, rec: ActionRecord, evidence: str | None) -> int:
    """The id of the person's verdict a correction corrects: the event that set the
    record's terminal status, a ``resolved`` one on this attempt; else refused."""
    if not evidence or not evidence.strip():
        raise InvalidInput("--correct needs --evidence: say what shows the verdict was wrong")
    if not rec.terminal:
        raise TransitionNotAllowed(
            f"action {rec.action_id} is {rec.status}: only a settled verdict can be corrected"
        )
    events = ledger.events(rec.action_id)
    setter = next(
        (
            e
            for e in reversed(events)
            if e.to_status == str(rec.status) and e.from_status != e.to_status
        ),
        None,
    )
    if setter is None or setter.kind != EventKind.RESOLVED or setter.attempt != rec.attempt:
        what = f"{setter.kind} by {setter.actor}" if setter is not None else "no event"
        raise TransitionNotAllowed(
            f"action {rec.action_id} is {rec.status} by {what}, not by a person's verdict on "
            f"attempt {rec.attempt}: only a person's verdict can be corrected (a retry's new "
            "attempt is settled by its own evidence)"
        )
    return setter.id


def _won(ledger: Ledger, rec: ActionRecord) -> str:
    """What set the record's status as it now stands: `` (by ACTOR at AT, KIND)``, from
    the last event that changed its status ("" when it has none)."""
    for e in reversed(ledger.events(rec.action_id)):
        if e.to_status == str(rec.status) and e.from_status != e.to_status:
            return f" (by {e.actor} at {e.at}, {e.kind})"
    return ""


def _recheck(
    ledger: Ledger,
    registry: Providers | None,
    rec: ActionRecord,
    now: datetime,
    *,
    by: str,
    recheck: bool,
    probe: Probe = no_probe,
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
    checker = Reconciler(
        ledger, registry, clock=ledger.clock(anchor=False), actor="recheck", probe=probe
    )
    seen = checker.recheck(rec, now, asked=f"operator:{by} (resolve --not-applied)")
    if seen.refuses:
        raise seen.refusal("the verdict")
    return seen.note, seen.queried


__all__ = ["NO_RECHECK", "resolve"]
