"""What a reply or an observation means, and where the record goes next.

Pure functions: each takes the record, its declarations, what was seen and ``now``,
and returns a ``Move`` (or a value the orchestrators need). Nothing here reads the
ledger, the network or a clock; ``dispatch`` and ``reconcile`` fetch, call and write,
and ask this module what every answer means. The rules in force (docs/rules.md):

- Classify, never guess (rule 3): a validation rejection fails; nothing sent
  may be repeated; an ambiguous send is repeated only when the provider deduplicates
  the key; a conditional-write conflict is never proof.
- Accepted is not success (rule 4): only an observation confirms; a spent budget
  leaves the record unresolved, never confirmed. The budget starts at the later of
  ``eligible_at`` and the moment the outcome was recorded (or the lease lapsed).
- Absence proves nothing while the request may still land (rule 9): an absence counts
  only after ``lands_by`` (claim + whole request budget + grace) plus the window.
- The stored strategy governs (rule 11): decisions use the declarations stored with
  the action (``ActionRecord.declared``), not today's config.
"""

from __future__ import annotations

import uuid
from dataclasses import MISSING, dataclass, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from .clock import from_text, plus, to_text
from .model import (
    WRITABLE,
    Acceptance,
    ActionRecord,
    Declared,
    Delivery,
    EventKind,
    Move,
    Observation,
    PendingCallback,
    QueryTarget,
    Reported,
    Request,
    Seen,
    Status,
    Tier,
    Wire,
    WireResult,
    build_strategy,
    idempotency_key,
    params_hash,
)

MAX_BACKOFF = 2.0  # s: the longest pause between two tries of one attempt
DETAIL = 200  # characters of a provider's detail kept in a reason


class ReplyProof(StrEnum):
    """What one reply to a send proves (``classify``). Not a person's verdict: that is
    ``resolution``'s, recorded by ``settled resolve``."""

    PROVEN = "proven"  # the reply proves the effect
    ACCEPTED = "accepted"  # the provider took it; the effect is not yet observed
    REJECTED = "rejected"  # provably not applied
    NEVER_SENT = "never_sent"  # nothing left this machine
    AMBIGUOUS = "ambiguous"  # it may or may not have applied
    CONFLICT = "conflict"  # a conditional write refused: an earlier try may have applied it

    @property
    def maybe_applied(self) -> bool:
        return self in (ReplyProof.AMBIGUOUS, ReplyProof.CONFLICT)


def classify(declared: Declared, wire: WireResult) -> ReplyProof:
    """Rule 3 (docs/rules.md), in one place."""
    if wire.wire is Wire.NOT_CONNECTED:
        # A provider that wrote bytes and then reports "not connected" cannot know
        # that nothing arrived: only a request never written is never sent.
        return ReplyProof.NEVER_SENT if wire.written_at is None else ReplyProof.AMBIGUOUS
    if wire.wire is Wire.NO_ANSWER:
        return ReplyProof.AMBIGUOUS
    code = wire.status_code or 0
    if wire.conflict:
        return ReplyProof.CONFLICT
    if wire.maybe_applied:
        # An error the operation declared may come after the effect (rule 20): a 4xx
        # or a 2xx that says so proves neither the effect nor its absence.
        return ReplyProof.AMBIGUOUS
    if wire.applied is True:
        return ReplyProof.PROVEN if declared.tier is Tier.FULL else ReplyProof.ACCEPTED
    if 200 <= code <= 299:
        return ReplyProof.REJECTED if wire.applied is False else ReplyProof.ACCEPTED
    if code in (408, 429) or 500 <= code <= 599:
        return ReplyProof.AMBIGUOUS
    if 400 <= code <= 499:
        return ReplyProof.REJECTED
    return ReplyProof.AMBIGUOUS  # 1xx, 3xx and codes outside RFC ranges prove nothing


def final_answer(verdict: ReplyProof, wire: WireResult | None) -> str:
    """What a FAILED outcome rests on, in words, kept in its event (rule 20): nothing
    left this machine, the reply's declared "not applied", or a validation rejection
    (a 4xx the operation did not declare may come after the effect)."""
    if verdict is ReplyProof.NEVER_SENT:
        return "never sent: nothing reached the provider"
    if wire is not None and wire.applied is False:
        return "the reply's declared not_applied predicate"
    code = wire.status_code if wire is not None else None
    return f"HTTP {code}: a validation rejection (rule 3)"


def rests_on(event: Any) -> str | None:
    """What the FAILED status an event wrote rests on (rule 20), or None when it rests
    on nothing final: an outcome recorded before settled kept what its FAILED rests on,
    which may be an error that came after the effect. A query's, a callback's and a
    person's verdicts are final by what they are."""
    kind, detail = event.kind, event.detail or {}
    if kind in (EventKind.OUTCOME, EventKind.LATE_OUTCOME):
        if detail.get("final"):
            return str(detail["final"])
        if detail.get("verdict") == str(ReplyProof.NEVER_SENT):
            return "never sent: nothing reached the provider"
        return None
    if kind == EventKind.RECONCILED:
        return "the query's proof of absence"
    if kind == EventKind.CALLBACK:
        return "the provider's signed callback"
    if kind == EventKind.RESOLVED:
        return "a person's verdict"
    return None


def repeats(declared: Declared, verdict: ReplyProof) -> bool:
    """May the dispatcher try again within the same attempt (same idempotency key)?"""
    return verdict is ReplyProof.NEVER_SENT or (verdict.maybe_applied and declared.dedupes_keys)


def backoff(declared: Declared, default: float, n: int) -> float:
    """The pause before repeat ``n`` (1-based): doubling from the operation's backoff
    (or the dispatcher's default), capped at ``MAX_BACKOFF``."""
    first = declared.backoff if declared.backoff is not None else default
    return float(min(first * 2 ** (n - 1), MAX_BACKOFF))


THROTTLING = (429, 503)  # replies that ask the client to slow down
MAX_HOLD = 300.0  # s: the longest one Retry-After holds every request to its provider


def throttled(status_code: int | None, retry_after: float | None, default: float) -> float | None:
    """How long a reply asks us to leave its provider alone: on 429 or 503, its
    Retry-After (at most ``MAX_HOLD``), else ``default``; None for any other reply.
    It holds requests that have not started; it never makes a sent one repeatable."""
    if status_code not in THROTTLING:
        return None
    if retry_after is None:
        return default
    return min(max(float(retry_after), 0.0), MAX_HOLD)


def request_budget(declared: Declared, default_backoff: float) -> float:
    """The longest one attempt may take on the wire: every try's whole deadline and
    every pause between them."""
    tries = max(1, declared.attempts)
    pauses = sum(backoff(declared, default_backoff, n) for n in range(1, tries))
    return declared.timeout * tries + pauses


# -- recording and claiming ------------------------------------------------------------------


def new_record(
    *,
    action_id: str | None,
    provider: str,
    operation: str,
    params: Any,
    declared: Declared,
    now: datetime,
) -> ActionRecord:
    """A new PENDING action with its strategy fixed before anything leaves."""
    at = to_text(now)
    strategy = build_strategy(
        declared.tier,
        now,
        declared.consistency_window,
        carries_key=declared.carries_key,
        key=business_key(declared, params),
        key_format=declared.key_format,
    )
    aid = action_id or "act-" + uuid.uuid4().hex[:20]
    return ActionRecord(
        action_id=aid,
        provider=provider,
        operation=operation,
        params=params,
        params_hash=params_hash(params),
        tier=declared.tier,
        reconciliation_key=strategy.reconciliation_key,
        eligible_at=to_text(strategy.eligible_at),
        requires_manual_verification=strategy.requires_manual_verification,
        attempt=1,
        idempotency_key=idempotency_key(aid, 1),
        dispatch_id=None,
        provider_object_id=None,
        status=Status.PENDING,
        delivery=Delivery.PENDING,
        acceptance=Acceptance.UNKNOWN,
        dispatched_at=None,
        confirmed_at=None,
        confirmed_by=None,
        created_at=at,
        updated_at=at,
        declared=declared,
    )


def business_key(declared: Declared, params: Any) -> str | None:
    """The reconciliation key an operation takes from a param (an order number): the
    same for every attempt, so a provider that enforces its uniqueness makes a create
    idempotent across attempts. None: a generated key, new for each attempt."""
    if declared.key_param is None or not isinstance(params, dict):
        return None
    value = params.get(declared.key_param)
    return None if value is None or isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Claim:
    """The claim of one attempt: its lease, and the move that takes it."""

    owner: str
    lease_until: datetime
    move: Move


def claim(
    rec: ActionRecord,
    declared: Declared,
    now: datetime,
    *,
    actor: str,
    grace: float,
    default_backoff: float,
    snapshot: Any = None,
) -> Claim:
    """``PENDING → IN_FLIGHT`` with a lease for the whole request budget plus grace.
    The dispatcher never starts a request after the lease lapses, so the lease's end
    is also the last moment the request can land (``lands_by``)."""
    at = to_text(now)
    lease_until = plus(now, request_budget(declared, default_backoff) + grace)
    until = to_text(lease_until)
    owner = "d-" + uuid.uuid4().hex
    eligible = None
    if rec.eligible_at is not None:  # the window runs from the real dispatch time
        window = declared.consistency_window if declared.tier is not Tier.FULL else 0.0
        eligible = to_text(plus(now, window))
    move = Move(
        rec.action_id,
        Status.PENDING,
        Status.IN_FLIGHT,
        at,
        actor,
        EventKind.CLAIMED,
        values={
            "delivery": str(Delivery.IN_FLIGHT),
            "dispatch_id": owner,
            "lease_owner": owner,
            "lease_expires_at": until,
            "next_check_at": until,  # a lost dispatcher is found by the due scan
            "dispatched_at": at,
            "eligible_at": eligible,
            "lands_by": until,
            "snapshot": _json(snapshot),
        },
        detail={"lease_expires_at": until, "idempotency_key": rec.idempotency_key},
    )
    return Claim(owner, lease_until, move)


def request_for(rec: ActionRecord, declared: Declared, send_by: float | None) -> Request:
    return Request(
        action_id=rec.action_id,
        operation=rec.operation,
        params=rec.params,
        idempotency_key=rec.idempotency_key,
        reconciliation_key=rec.reconciliation_key,
        attempt=rec.attempt,
        timeout=declared.timeout,
        send_by=send_by,
    )


def target_for(rec: ActionRecord) -> QueryTarget:
    return QueryTarget(
        action_id=rec.action_id,
        operation=rec.operation,
        params=rec.params,
        reconciliation_key=rec.reconciliation_key,
        provider_object_id=rec.provider_object_id,
        snapshot=rec.snapshot,
        attempt=rec.attempt,
    )


# -- the dispatcher's outcome ----------------------------------------------------------------


def verification(declared: Declared, start: datetime) -> dict[str, Any]:
    """The verification budget (rule 4), in one place: it starts at ``start`` and
    lasts ``verify_deadline``; the first check is due at ``start``."""
    return {
        "verify_started_at": to_text(start),
        "verify_deadline_at": to_text(plus(start, declared.verify_deadline)),
        "next_check_at": to_text(start),
    }


def settle_verdict(tries: list[ReplyProof]) -> ReplyProof:
    """The attempt's verdict from its tries' verdicts: an earlier try that may have
    applied means a later "never sent" or rejection cannot prove the effect absent."""
    last = tries[-1] if tries else ReplyProof.NEVER_SENT
    if last in (ReplyProof.NEVER_SENT, ReplyProof.REJECTED) and any(v.maybe_applied for v in tries):
        return ReplyProof.AMBIGUOUS
    return last


def outcome(  # noqa: PLR0913  (keyword-only: every input a decision reads, named)
    rec: ActionRecord,
    declared: Declared,
    verdict: ReplyProof,
    wire: WireResult | None,
    now: datetime,
    *,
    owner: str,
    actor: str,
    tries: list[dict[str, Any]],
    late_send: bool = False,
) -> Move:
    """``IN_FLIGHT →`` the status the attempt's verdict proves, under the claim's lease."""
    to, values, reason = _outcome(rec, declared, verdict, wire, now)
    values.update(lease_owner=None, lease_expires_at=None)
    if rec.cause is None and to in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED):
        values["cause"] = cause_of_outcome(verdict, declared.tier, declared.queryable, wire)
    detail: dict[str, Any] = {"verdict": str(verdict), "tries": tries, "reason": reason}
    if to is Status.FAILED:
        detail["final"] = final_answer(verdict, wire)
    if late_send:
        detail["late_send"] = True
    return Move(
        rec.action_id,
        Status.IN_FLIGHT,
        to,
        to_text(now),
        actor,
        EventKind.OUTCOME,
        values=values,
        detail=detail,
        owner=owner,
    )


def _outcome(
    rec: ActionRecord,
    declared: Declared,
    verdict: ReplyProof,
    wire: WireResult | None,
    now: datetime,
) -> tuple[Status, dict[str, Any], str]:
    at = to_text(now)
    values: dict[str, Any] = {}
    code = ""
    detail = ""
    if wire is not None:
        if wire.object_id:
            values["provider_object_id"] = wire.object_id
        code = f" (HTTP {wire.status_code})" if wire.status_code is not None else ""
        detail = one_line(wire.detail)[:DETAIL]

    if verdict is ReplyProof.PROVEN:
        values.update(
            delivery=str(Delivery.DELIVERED),
            acceptance=str(Acceptance.APPLIED),
            confirmed_at=at,
            confirmed_by="provider",
            next_check_at=None,
            reason=None,
        )
        return Status.CONFIRMED, values, f"the provider's reply proves the effect{code}"
    if verdict is ReplyProof.REJECTED:
        reason = (
            f"rejected by the provider: {detail}" if detail else f"rejected by the provider{code}"
        )
        values.update(
            delivery=str(Delivery.DELIVERED),
            acceptance=str(Acceptance.NOT_APPLIED),
            next_check_at=None,
            reason=reason,
        )
        return Status.FAILED, values, reason
    if verdict is ReplyProof.NEVER_SENT:
        reason = f"never reached the provider: {detail}" if detail else "never reached the provider"
        values.update(
            delivery=str(Delivery.FAILED),
            acceptance=str(Acceptance.NOT_APPLIED),
            next_check_at=None,
            reason=reason,
        )
        return Status.FAILED, values, reason
    if verdict is ReplyProof.ACCEPTED:
        values.update(delivery=str(Delivery.DELIVERED), acceptance=str(Acceptance.UNKNOWN))
        if declared.tier is Tier.BLIND:
            reason = "blind operation: nothing can observe the effect; a person must verify it"
            values.update(next_check_at=None, reason=reason)
            return Status.DENIED_UNRESOLVED, values, reason
        if declared.tier is Tier.PARTIAL:
            reason = "delivered; only a person can verify acceptance (partial tier)"
            values.update(next_check_at=rec.eligible_at, reason=reason)
            return Status.AWAITING_VERIFICATION, values, reason
        if declared.queryable:
            values.update(verification(declared, max(now, from_text(rec.eligible_at) or now)))
            reason = f"accepted{code}, not yet observed; verification at {values['next_check_at']}"
            values["reason"] = reason
            return Status.AWAITING_VERIFICATION, values, reason
        reason = f"accepted{code} but the reply proves nothing and there is no query"
        values.update(next_check_at=None, reason=reason)
        return Status.DENIED_UNRESOLVED, values, reason
    if verdict is ReplyProof.CONFLICT:
        # Refused as a conflict: an earlier try of this attempt may have made it, or
        # something else did. Only reading the resource can tell (rule 10).
        values.update(delivery=str(Delivery.DELIVERED), acceptance=str(Acceptance.UNKNOWN))
        why = f"conflict{code}: {detail}".rstrip(": ")
        if declared.queryable and declared.tier is not Tier.PARTIAL:
            values.update(verification(declared, now))
            reason = why + "; an earlier try may have applied it: verifying by query"
            values["reason"] = reason
            return Status.AWAITING_VERIFICATION, values, reason
        reason = why + "; an earlier try may have applied it and no query can tell: needs a person"
        values.update(next_check_at=None, reason=reason)
        return Status.DENIED_UNRESOLVED, values, reason
    # AMBIGUOUS
    values.update(delivery=str(Delivery.UNKNOWN), acceptance=str(Acceptance.UNKNOWN))
    why = f"outcome unknown{code}: {detail}".rstrip(": ")
    if not declared.dedupes_keys:
        why += "; not repeated because the provider does not deduplicate keys"
    if declared.queryable and declared.tier is not Tier.PARTIAL:
        values.update(verification(declared, max(now, from_text(rec.eligible_at) or now)))
        values["reason"] = why + "; reconciliation will query the provider"
    else:
        values.update(next_check_at=None, reason=why + "; needs a person")
    return Status.DENIED_UNRESOLVED, values, values["reason"]


# -- why a record is open (``ActionRecord.cause``; its codes and words: ``settled.cause``)
# A cause is set once per attempt, at the first outcome that leaves the effect unknown,
# and kept by every later move: the first thing that went wrong is what a person can
# select the batch by ("HTTP 503"), not what the last check found.


def cause_of_outcome(
    verdict: ReplyProof, tier: Tier, queryable: bool, wire: WireResult | None
) -> str | None:
    """The cause a dispatch outcome leaves, or None when it settles the record."""
    if verdict is ReplyProof.ACCEPTED:
        if tier is Tier.BLIND:
            return "blind"
        if tier is Tier.PARTIAL:
            return "awaiting_person"
        return "accepted_unseen" if queryable else "unprovable"
    if verdict is ReplyProof.CONFLICT:
        return "conflict"
    if verdict is not ReplyProof.AMBIGUOUS:
        return None
    if wire is not None and wire.status_code is not None:
        return f"http_{wire.status_code}"
    if wire is not None and wire.wire is Wire.NO_ANSWER:
        text = wire.detail.lower()
        if "timeout" in text or "timed out" in text:
            return "timeout_after_send"
    return "reply_lost"


def cause_of_handover(rec: ActionRecord, why: str, check_error: str | None = None) -> str | None:
    """The cause a record is handed to a person with: its own when it has one (kept),
    else what the hand-over says."""
    if rec.cause:
        return rec.cause
    if check_error or rec.check_error:
        return "check_failing"
    if rec.tier is Tier.PARTIAL:
        return "awaiting_person"
    if rec.tier is Tier.BLIND:
        return "blind"
    if "budget" in why:
        return "not_seen"
    return "unprovable"


def late_outcome(
    current: ActionRecord,
    intended: Move,
    verdict: ReplyProof,
    now: datetime,
    *,
    attempt: int,
    actor: str,
    late_send: bool,
) -> Move:
    """Our lease lapsed and the record moved on before our outcome was written. The
    reply is still evidence (rule 9): applied where the table allows, else appended
    as a note; one that contradicts the record is flagged (it blocks retry)."""
    at = to_text(now)
    detail = {**intended.detail, "intended": str(intended.to), "attempt": attempt}
    same = current.attempt == attempt
    if same and current.status is Status.DENIED_UNRESOLVED and not late_send:
        if intended.to in (Status.CONFIRMED, Status.FAILED):
            moved = {
                k: v
                for k, v in intended.values.items()
                if k not in ("lease_owner", "lease_expires_at")
            }
            moved.update(next_check_at=None, check_error=None)
            return Move(
                current.action_id,
                Status.DENIED_UNRESOLVED,
                intended.to,
                at,
                actor,
                EventKind.LATE_OUTCOME,
                values=moved,
                detail=detail,
            )
        return Move(
            current.action_id,
            Status.DENIED_UNRESOLVED,
            Status.DENIED_UNRESOLVED,
            at,
            actor,
            EventKind.LATE_OUTCOME,
            detail=detail,
        )
    if same:
        conflict = contradiction(current, verdict, late_send)
    elif verdict in (ReplyProof.PROVEN, ReplyProof.ACCEPTED) or verdict.maybe_applied or late_send:
        conflict = (
            f"a reply to attempt {attempt} ({verdict}) came after attempt {current.attempt} "
            "was opened: both may have applied; resolve it before any retry"
        )
    else:
        conflict = None
    values: dict[str, Any] = {}
    if late_send and same:  # it may land later than the claim allowed for: absence waits
        values["lands_by"] = max(current.lands_by or at, at)
    if conflict:
        values["contradiction"] = conflict
        detail["contradiction"] = conflict
    return Move(
        current.action_id,
        current.status,
        current.status,
        at,
        actor,
        EventKind.NOTE,
        values=values,
        detail=detail,
    )


def declined(current: ActionRecord, now: datetime, actor: str, why: str) -> Move:
    """The refusal of an approval: an event on the PENDING record, which stays PENDING
    (nothing was sent, nothing is proven about the world)."""
    return Move(
        current.action_id,
        Status.PENDING,
        Status.PENDING,
        to_text(now),
        actor,
        EventKind.NOTE,
        detail={"approval": "not given", "reason": why},
    )


def contradiction(current: ActionRecord, verdict: ReplyProof, late_send: bool) -> str | None:
    """Why a late reply disagrees with the record's terminal status, or None."""
    if current.status is Status.FAILED and (
        verdict in (ReplyProof.PROVEN, ReplyProof.ACCEPTED) or verdict.maybe_applied or late_send
    ):
        what = "was written after its lease lapsed" if late_send else f"was answered: {verdict}"
        return (
            f"a request of attempt {current.attempt} {what}, after the record became FAILED; "
            "the effect may exist: resolve it before any retry"
        )
    if current.status is Status.CONFIRMED and verdict in (
        ReplyProof.REJECTED,
        ReplyProof.NEVER_SENT,
    ):
        return (
            f"a late reply says {verdict} although the effect was observed; check what the "
            "provider holds"
        )
    if current.status is Status.DENIED_UNRESOLVED and late_send:
        return (
            f"a request of attempt {current.attempt} was written after its lease lapsed; an "
            "absence seen before then proves nothing"
        )
    return None


# -- the reconciler's decisions --------------------------------------------------------------


def absence_counts_from(rec: ActionRecord, declared: Declared) -> datetime | None:
    """The first moment an absence proves anything (rule 9): after the last moment
    the request could land, plus the consistency window; never before ``eligible_at``."""
    eligible = from_text(rec.eligible_at)
    lands = from_text(rec.lands_by)
    if lands is None:
        return eligible
    after = plus(lands, declared.consistency_window)
    return max(after, eligible) if eligible is not None else after


def expire(
    rec: ActionRecord,
    declared: Declared | None,
    now: datetime,
    *,
    actor: str,
    problem: str,
    recheck: float,
    released: tuple[str, str] | None = None,
) -> Move:
    """A dispatcher that held the claim is gone: its request may or may not have
    left. Never re-send; the record becomes unresolved and, when the operation can be
    queried, reconciliation starts now (rule 4: the budget starts here, and the first
    check is due at once, or at ``eligible_at`` when that is later). ``problem`` says
    why the query cannot run here (provider not configured): then whoever has it
    checks the record, and its budget starts at that first check. ``released``:
    (person, why) when a person named the holder dead (``settled unlock``) before its
    lease ran out: the same move, recorded as theirs."""
    lost = (
        f"its lease (until {rec.lease_expires_at}) was released by {released[0]}: {released[1]},"
        if released is not None
        else f"its lease expired at {rec.lease_expires_at}"
    )
    reason = (
        f"dispatcher lost: {lost} before an outcome was recorded; the request may have been sent"
    )
    values: dict[str, Any] = {
        "delivery": str(Delivery.UNKNOWN),
        "lease_owner": None,
        "lease_expires_at": None,
        "next_check_at": None,
    }
    if problem:
        declared = None  # the query is not available here: whoever has it starts the budget
    if declared is not None and declared.queryable and not rec.requires_manual_verification:
        eligible = from_text(rec.eligible_at) or now
        values.update(verification(declared, max(now, eligible)))
        expired = from_text(rec.lease_expires_at) or now
        values["next_check_at"] = to_text(eligible if eligible > now else max(expired, eligible))
        reason += "; reconciliation will query the provider"
    elif declared is None and not rec.requires_manual_verification:
        # Whether it can be queried is for a reconciler that has the provider to say;
        # its budget starts at its first check.
        values["next_check_at"] = to_text(plus(now, recheck))
        reason += f"; {problem}: a reconciler that has it will check it"
    else:
        reason += "; needs a person"
    values["reason"] = reason
    values["cause"] = rec.cause or "dispatcher_lost"
    return Move(
        rec.action_id,
        Status.IN_FLIGHT,
        Status.DENIED_UNRESOLVED,
        to_text(now),
        actor,
        EventKind.LEASE_EXPIRED,
        values=values,
        detail={
            "lease_owner": rec.lease_owner,
            "lease_expires_at": rec.lease_expires_at,
            "reason": reason,
            **({"released_by": released[0], "why": released[1]} if released else {}),
        },
        owner=rec.lease_owner,
    )


def needs_person(rec: ActionRecord, now: datetime, *, owner: str, actor: str) -> Move:
    """A record only a person can verify, due for their queue."""
    why = (
        "past its consistency window; only a person can verify acceptance (partial tier)"
        if rec.tier is Tier.PARTIAL
        else "no query can observe this effect; needs a person"
    )
    return unresolved(rec, now, why, {}, owner=owner, actor=actor)


def unresolved(
    rec: ActionRecord,
    now: datetime,
    why: str,
    evidence: dict[str, Any],
    *,
    owner: str | None,
    actor: str,
    tally: dict[str, Any] | None = None,
) -> Move:
    """Into the queue for a person, with the evidence gathered; ``tally`` is the check
    that led here (``checks``, ``counted_checks``, ``check_error``), when one did."""
    return Move(
        rec.action_id,
        rec.status,
        Status.DENIED_UNRESOLVED,
        to_text(now),
        actor,
        EventKind.UNRESOLVED,
        values={
            "lease_owner": None,
            "next_check_at": None,
            "reason": why,
            **(tally or {}),
            "cause": cause_of_handover(rec, why, (tally or {}).get("check_error")),
        },
        detail={**evidence, "reason": why},
        owner=owner,
    )


def wait_again(
    rec: ActionRecord,
    now: datetime,
    until: datetime,
    reason: str,
    *,
    owner: str | None,
    extra: dict[str, Any] | None = None,
) -> Move:
    """Release the record with its next check at ``until``; no status change, no
    event: a check that found nothing new (``extra`` carries its tally), or one that
    could not run, which spends nothing (rule 15)."""
    values: dict[str, Any] = {
        "lease_owner": None,
        "reason": reason,
        "next_check_at": to_text(until),
        **(extra or {}),
    }
    return Move(
        rec.action_id, rec.status, rec.status, to_text(now), "", None, values=values, owner=owner
    )


def weigh(
    rec: ActionRecord, declared: Declared, obs: Observation, now: datetime, rivals: list[str]
) -> Observation:
    """What an observation proves about this record, now: absences before the request
    could land prove nothing; an observed change that another action also asked for
    cannot be attributed by a snapshot diff."""
    if obs.seen is Seen.NOT_APPLIED:
        eligible = from_text(rec.eligible_at)
        if eligible is not None and now < eligible:
            # Inside the consistency window an absence proves nothing: the effect may
            # not be visible yet. Only a check at or after eligible_at may fail it.
            return Observation(
                Seen.NOT_YET,
                obs.object_id,
                f"{obs.detail or 'not applied'} — before the consistency window ends "
                f"({rec.eligible_at}); not taken as proof",
                obs.evidence,
            )
        counts = absence_counts_from(rec, declared)
        if obs.by_absence and counts is not None and now < counts:
            return Observation(
                Seen.NOT_YET,
                obs.object_id,
                f"{obs.detail or 'absent'} — but the request could still land until "
                f"{to_text(counts)}; not taken as proof",
                obs.evidence,
            )
    if obs.seen is Seen.APPLIED and rivals:
        return Observation(
            Seen.AMBIGUOUS,
            obs.object_id,
            f"the change is there, but {', '.join(rivals)} asked for the same change; "
            "a snapshot diff cannot tell which action made it",
            obs.evidence,
        )
    return obs


def spends_budget(rec: ActionRecord, now: datetime) -> bool:
    """Whether a check of ``rec`` made now spends its verification budget (rule 15):
    one made at or after its scheduled time. Every check schedules the next at least
    ``verify_interval`` later, so the checks that count are that far apart; a check
    forced earlier (``reconcile ID``, the check before a verdict) is evidence all the
    same, but does not count towards ``verify_min_checks``."""
    due = from_text(rec.next_check_at)
    return due is None or now >= due


def check_error(obs: Observation) -> str | None:
    """Why a check could not observe anything (the provider unreachable, unusable, or
    an answer it could not read), or None when it got an answer."""
    if obs.seen is not Seen.UNKNOWN:
        return None
    return one_line(obs.detail)[:DETAIL] or "the query failed"


PAUSED = "paused: "  # how a pause's ``check_error`` begins (stats and queue tell it apart)


def paused(provider: str, answered: str) -> str:
    """The ``check_error`` of a record whose check could not be made because its
    provider asked for a pause (429/503): no attempt, none counted (rule 15), but a
    check that is failing all the same, which the gauges, ``/healthz`` and the queue
    count."""
    return f"{PAUSED}{provider} answered {answered or '429/503'}; not checked until it recovers"


def judge(
    rec: ActionRecord,
    declared: Declared,
    obs: Observation,
    now: datetime,
    *,
    owner: str | None,
    actor: str,
) -> Move:
    """Where a checked record goes: applied → CONFIRMED; provably absent → FAILED;
    anything else → checked again, every ``verify_interval``, until the verification
    budget is spent: its deadline has passed AND ``verify_min_checks`` checks that
    count were made (rule 15: time with no reconciler running spends nothing; an
    attempt that could not reach the provider counts). Then it is unresolved with the
    evidence gathered and a reason that says which of the causes it was. Never
    CONFIRMED on a budget."""
    at = to_text(now)
    shown = f" ({one_line(obs.detail)[:DETAIL]})" if obs.detail else ""
    n = rec.checks + 1
    counts = spends_budget(rec, now)
    error = check_error(obs)
    tally: dict[str, Any] = {
        "checks": n,
        "check_error": error,
        "counted_checks": rec.counted_checks + (1 if counts else 0),
    }
    evidence = {
        "seen": str(obs.seen),
        "detail": one_line(obs.detail)[:300],
        "check": n,
        "counted": counts,
        **dict(obs.evidence),
    }
    if obs.seen in (Seen.APPLIED, Seen.NOT_APPLIED):
        values: dict[str, Any] = {"lease_owner": None, "next_check_at": None, **tally}
        if obs.seen is Seen.APPLIED:
            to = Status.CONFIRMED
            reason = "effect observed by reconciliation" + (f": {shown[2:-1]}" if shown else "")
            values.update(_applied(obs, at))
        else:
            to = Status.FAILED
            reason = "reconciliation proved the effect absent" + (
                f": {shown[2:-1]}" if shown else ""
            )
            if obs.object_id:
                values["provider_object_id"] = obs.object_id
            values.update(acceptance=str(Acceptance.NOT_APPLIED), reason=reason)
        return Move(
            rec.action_id,
            rec.status,
            to,
            at,
            actor,
            EventKind.RECONCILED,
            values=values,
            detail={**evidence, "reason": reason},
            owner=owner,
        )
    deadline = from_text(rec.verify_deadline_at)
    if deadline is None and rec.checks == 0:  # expired where the provider was unknown
        deadline = plus(now, declared.verify_deadline)
        tally.update(verify_started_at=at, verify_deadline_at=to_text(deadline))
    late = deadline is None or now >= deadline
    enough = tally["counted_checks"] >= declared.verify_min_checks
    if late and enough:
        why = _given_up(rec, obs, n, error, shown)
        return unresolved(rec, now, why, evidence, owner=owner, actor=actor, tally=tally)
    # Never capped at the deadline: the checks that count stay verify_interval apart.
    nxt = plus(now, declared.verify_interval)
    scheduled = from_text(rec.next_check_at)
    if not counts and scheduled is not None:
        nxt = scheduled  # a forced check never postpones the scheduled one that counts
    eligible = from_text(rec.eligible_at)
    if eligible is not None and nxt < eligible:
        nxt = eligible  # an early (forced) check: the scheduled one still runs
    why = _waiting(rec, obs, n, error, shown)
    if late:
        why += (
            f"; past its deadline: {tally['counted_checks']} of at least "
            f"{declared.verify_min_checks} checks made"
        )
    return wait_again(rec, now, nxt, why, owner=owner, extra=tally)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _lost(rec: ActionRecord) -> bool:
    """The send got no answer (a timeout, a reset, a lost dispatcher): the reply was lost."""
    return rec.delivery is Delivery.UNKNOWN


def _waiting(rec: ActionRecord, obs: Observation, n: int, error: str | None, shown: str) -> str:
    """The reason of a record that is checked again: what its last check saw, and for
    an unresolved one why it is unresolved (the queue's ``why``)."""
    if error is not None:
        return f"could not be checked ({n} attempt{_s(n)} so far): {error}"
    if rec.status is Status.DENIED_UNRESOLVED and _lost(rec):
        return f"the send got no answer (reply lost); checked: {obs.seen}{shown}"
    return f"checked: {obs.seen}{shown}"


def _given_up(rec: ActionRecord, obs: Observation, n: int, error: str | None, shown: str) -> str:
    """Why a record's verification budget is spent, telling the causes apart: it could
    not be checked at all, its reply was lost, or it was accepted and never seen."""
    if error is not None:
        if n == 1 or rec.check_error is not None:
            return f"could not be checked after {n} attempt{_s(n)}: {error}"
        return (
            f"verification budget spent after {n} check{_s(n)}; the last could not be made: {error}"
        )
    if _lost(rec):
        what = "the send got no answer (reply lost) and the effect never became visible"
    else:
        what = "accepted but never visible"
    return f"verification budget spent after {n} check{_s(n)}: {what}; last: {obs.seen}{shown}"


def _applied(obs: Observation, at: str) -> dict[str, Any]:
    """What an observation of the effect writes: confirmed by reconciliation."""
    values: dict[str, Any] = {
        "acceptance": str(Acceptance.APPLIED),
        "delivery": str(Delivery.DELIVERED),
        "confirmed_at": at,
        "confirmed_by": "reconciliation",
        "reason": None,
        "check_error": None,
    }
    if obs.object_id:
        values["provider_object_id"] = obs.object_id
    return values


# -- a verdict weighed against the world (rule 14) -------------------------------------------


def recheck_needed(rec: ActionRecord, declared: Declared | None) -> str:
    """Whether a person's "not applied" verdict, or a retry, must first check the world
    (rule 14): "" when it must, else why no check can add anything. ``declared`` None:
    the declarations are not known here, so a check is needed (and cannot be made)."""
    if rec.requires_manual_verification or (declared is not None and not declared.queryable):
        return "no query can observe this effect"
    if rec.delivery is Delivery.FAILED and not rec.contradiction:
        return "nothing reached the provider"
    return ""


def by_evidence(
    rec: ActionRecord,
    declared: Declared,
    obs: Observation,
    now: datetime,
    *,
    actor: str,
    asked: str,
) -> Move:
    """The check made before a verdict or a retry saw the effect (rule 14): the record
    settles by that evidence. An open record is CONFIRMED as by any check; a FAILED
    one is corrected to CONFIRMED (``model.EVIDENCE_CORRECTIONS``, on its attempt);
    a CONFIRMED one whose status a later reply contradicted keeps it, the flag cleared
    by what was seen. ``asked`` says whose verdict or retry the check was made for."""
    at = to_text(now)
    if rec.status in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED):
        move = judge(rec, declared, obs, now, owner=None, actor=actor)
        return replace(move, detail={**move.detail, "recheck_for": asked})
    shown = one_line(obs.detail)[:DETAIL]
    detail = {
        "seen": str(obs.seen),
        "detail": one_line(obs.detail)[:300],
        "recheck_for": asked,
        **dict(obs.evidence),
    }
    checks = {"checks": rec.checks + 1, "check_error": None}
    if rec.status is Status.FAILED:
        reason = "effect observed by reconciliation" + (f": {shown}" if shown else "")
        values = {**_applied(obs, at), **checks, "contradiction": None, "next_check_at": None}
        return Move(
            rec.action_id,
            Status.FAILED,
            Status.CONFIRMED,
            at,
            actor,
            EventKind.RECONCILED,
            values=values,
            detail={**detail, "reason": reason},
            attempt=rec.attempt,
            by_evidence=True,
        )
    return Move(
        rec.action_id,
        rec.status,
        rec.status,
        at,
        actor,
        EventKind.NOTE,
        values={"contradiction": None, **checks},
        detail={**detail, "reason": "the effect is observed: the status stands"},
        attempt=rec.attempt,
    )


# -- callbacks (rule 16) ---------------------------------------------------------------------


def callback(pending: PendingCallback, rec: ActionRecord, now: datetime) -> Move | None:
    """Where a verified callback puts the record it names: through the predicates its
    config declares, never "any 2xx". None: keep it pending (the attempt it is about is
    in flight, so its outcome, and the object id, are not written yet).

    - ``applied``: the provider's report of the effect settles the action whatever its
      tier, partial and blind included: AWAITING_VERIFICATION or DENIED_UNRESOLVED →
      CONFIRMED (``confirmed_by = "callback:PROVIDER"``).
    - ``not_applied``: a report about the object the request made, not an absence, so
      rule 9's landing time does not hold it back: → FAILED at once.
    - ``delivered``: delivery only: the delivery axis, never the status.
    - a later-stage status never moves a record back (``sent`` after ``delivered``);
      one that contradicts a settled status is flagged (rule 9), which blocks retry.

    A callback is about the attempt it was bound to when it came (the record was in
    flight), else the latest attempt sent: the current one, or the one before when a
    retry has opened an attempt that has not been sent yet."""
    cb = pending.callback
    at = to_text(now)
    actor = f"callback:{cb.provider}"
    detail: dict[str, Any] = cb.detail()
    said = f"{cb.scheme} callback reports {cb.status!r} ({cb.reported})"
    if pending.attempt is not None:
        about = pending.attempt
    else:
        about = rec.attempt - 1 if rec.status is Status.PENDING else rec.attempt
    if about < 1:
        return _stay(rec, at, actor, detail, f"{said} for an action never sent; nothing moved")
    if about != rec.attempt:
        why = f"{said} about attempt {about}, after attempt {rec.attempt} was opened"
        if cb.reported is Reported.APPLIED:
            flag = f"{why}: both may have applied; resolve it before any retry"
            return _stay(rec, at, actor, detail, flag, {"contradiction": flag})
        return _stay(rec, at, actor, detail, why + "; nothing moved")
    if rec.status is Status.IN_FLIGHT:
        return None
    open_ = rec.status in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)
    if cb.reported is Reported.APPLIED:
        if open_:
            values = {
                "acceptance": str(Acceptance.APPLIED),
                "delivery": str(Delivery.DELIVERED),
                "confirmed_at": at,
                "confirmed_by": actor,
                "next_check_at": None,
                "lease_owner": None,
                "reason": None,
                "check_error": None,
            }
            return _moved(rec, Status.CONFIRMED, at, actor, detail, f"{said}: the effect", values)
        if rec.status is Status.FAILED:
            flag = f"{said} after the record became FAILED; resolve it before any retry"
            return _stay(rec, at, actor, detail, flag, {"contradiction": flag})
        return _stay(rec, at, actor, detail, f"{said}; it agrees with {rec.status}")
    if cb.reported is Reported.NOT_APPLIED:
        if open_:
            reason = f"the provider's {said}: not applied"
            values = {
                "acceptance": str(Acceptance.NOT_APPLIED),
                "delivery": str(Delivery.DELIVERED),
                "next_check_at": None,
                "lease_owner": None,
                "reason": reason,
                "check_error": None,
            }
            return _moved(rec, Status.FAILED, at, actor, detail, reason, values)
        if rec.status is Status.CONFIRMED:
            flag = f"{said} although the effect was observed; check what the provider holds"
            return _stay(rec, at, actor, detail, flag, {"contradiction": flag})
        return _stay(rec, at, actor, detail, f"{said}; it agrees with {rec.status}")
    if cb.reported is Reported.DELIVERED:
        if open_ and rec.delivery is not Delivery.DELIVERED:
            return _stay(
                rec,
                at,
                actor,
                detail,
                f"{said}: delivery only; acceptance is still unknown",
                {"delivery": str(Delivery.DELIVERED)},
            )
        if rec.status is Status.FAILED and rec.delivery is Delivery.FAILED:
            flag = f"{said} although the request was recorded as never delivered"
            return _stay(rec, at, actor, detail, flag, {"contradiction": flag})
        return _stay(rec, at, actor, detail, f"{said}: delivery only; nothing moved")
    return _stay(
        rec, at, actor, detail, f"{said}: none of applied, not_applied, delivered; recorded only"
    )


def _stay(
    rec: ActionRecord,
    at: str,
    actor: str,
    detail: dict[str, Any],
    reason: str,
    values: dict[str, Any] | None = None,
) -> Move:
    return Move(
        rec.action_id,
        rec.status,
        rec.status,
        at,
        actor,
        EventKind.CALLBACK,
        values=values or {},
        detail={**detail, "reason": reason},
        attempt=rec.attempt,
    )


def _moved(
    rec: ActionRecord,
    to: Status,
    at: str,
    actor: str,
    detail: dict[str, Any],
    reason: str,
    values: dict[str, Any],
) -> Move:
    return Move(
        rec.action_id,
        rec.status,
        to,
        at,
        actor,
        EventKind.CALLBACK,
        values=values,
        detail={**detail, "reason": reason},
        attempt=rec.attempt,
    )


# -- people ----------------------------------------------------------------------------------


# What a new attempt keeps of the one before: its status is the move's to set, and
# the lease and the contradiction are not the attempt's (``sending.retry_problem``
# refuses a contradicted record). Every other column a move may set starts over: the
# new attempt's own values (``reopen``), else the field's default, None where it has
# none; a field added to ``ActionRecord`` starts over too, unless it is named here.
_KEPT_BY_REOPEN = frozenset({"status", "lease_owner", "lease_expires_at", "contradiction"})
_STARTED_OVER: dict[str, Any] = {
    f.name: None if f.default is MISSING else f.default
    for f in fields(ActionRecord)
    if f.name in WRITABLE - _KEPT_BY_REOPEN
}


def reopen(
    rec: ActionRecord, declared: Declared, now: datetime, *, actor: str, recheck: str | None = None
) -> Move:
    """``FAILED → PENDING``: attempt N+1 with a new idempotency key, guarded on N.
    ``recheck`` says what the check made before it saw (rule 14), for the event."""
    attempt = rec.attempt + 1
    strategy = build_strategy(
        declared.tier,
        now,
        declared.consistency_window,
        carries_key=declared.carries_key,
        key=business_key(declared, rec.params),
        key_format=declared.key_format,
    )
    values = {
        **_STARTED_OVER,
        "attempt": attempt,
        "idempotency_key": idempotency_key(rec.action_id, attempt),
        "reconciliation_key": strategy.reconciliation_key,
        "eligible_at": to_text(strategy.eligible_at),
        "delivery": str(Delivery.PENDING),
        "acceptance": str(Acceptance.UNKNOWN),
    }
    detail: dict[str, Any] = {"attempt": attempt, "previous_idempotency_key": rec.idempotency_key}
    if recheck is not None:
        detail["recheck"] = recheck
    return Move(
        rec.action_id,
        Status.FAILED,
        Status.PENDING,
        to_text(now),
        actor,
        EventKind.RETRY,
        values=values,
        detail=detail,
        attempt=rec.attempt,
    )


def resolution(  # noqa: PLR0913  (keyword-only: the verdict's fields)
    rec: ActionRecord,
    *,
    applied: bool,
    reason: str,
    by: str,
    now: datetime,
    evidence: str | None = None,
    object_id: str | None = None,
    recheck: str | None = None,
    checked: bool = False,
    via: str | None = None,
    corrects: int | None = None,
) -> Move | None:
    """A person's attested verdict: from DENIED_UNRESOLVED; from AWAITING_VERIFICATION
    when only a person can verify it; and on a terminal record that later evidence
    contradicts (correcting its status, or clearing the flag). None: not allowed.

    ``recheck`` says what the check made before a "not applied" verdict saw, or why
    none was made (rule 14); ``checked``: that check queried the provider.

    ``via`` is the authenticated surface that vouches for the person (``api:TOKEN``,
    ``ui:token:TOKEN:SID``), made by the service, never by its caller; ``by`` is then the
    person it names ("" for none). The actor stays ``operator:BY via VIA`` (or
    ``operator:VIA``), as older readers parse it, and the event also keeps both parts
    apart (``person``, ``via``).

    ``corrects``: the id of the person's own verdict that set this terminal status, on
    the same attempt (the caller found it); the new verdict corrects it, with evidence,
    as a contradicted record's is corrected. None when it would change nothing."""
    who = attested(by, via)
    actor = f"operator:{who}"
    at = to_text(now)
    to = Status.CONFIRMED if applied else Status.FAILED
    detail = _claim(applied, reason, by, via, evidence, object_id)
    if recheck is not None:
        detail["recheck"] = recheck
    if corrects is not None:
        if not rec.terminal or rec.status is (Status.CONFIRMED if applied else Status.FAILED):
            return None
        detail["corrects"] = corrects
    tally: dict[str, Any] = {"checks": rec.checks + 1, "check_error": None} if checked else {}
    values: dict[str, Any] = {
        "next_check_at": None,
        "lease_owner": None,
        "acceptance": str(Acceptance.APPLIED if applied else Acceptance.NOT_APPLIED),
        "reason": f"resolved by {actor}: {reason}",
        "contradiction": None,
        "check_error": None,
        **tally,
    }
    if applied:
        values.update(confirmed_at=at, confirmed_by=actor, delivery=str(Delivery.DELIVERED))
    if object_id:
        values["provider_object_id"] = object_id
    if rec.terminal and (rec.contradiction or corrects is not None):
        if rec.status is to:  # the status stands: the flag is cleared, with the evidence
            return Move(
                rec.action_id,
                rec.status,
                rec.status,
                at,
                actor,
                EventKind.NOTE,
                values={"contradiction": None, **tally},
                detail=detail,
            )
        return Move(
            rec.action_id,
            rec.status,
            to,
            at,
            actor,
            EventKind.RESOLVED,
            values=values,
            detail=detail,
            correction=True,
            attempt=rec.attempt if corrects is not None else None,
            amends=corrects is not None,
        )
    allowed = rec.status is Status.DENIED_UNRESOLVED or (
        rec.status is Status.AWAITING_VERIFICATION and rec.requires_manual_verification
    )
    if not allowed:
        return None
    return Move(
        rec.action_id, rec.status, to, at, actor, EventKind.RESOLVED, values=values, detail=detail
    )


def refused_verdict(  # noqa: PLR0913  (keyword-only: the claim's fields)
    rec: ActionRecord,
    *,
    applied: bool,
    reason: str,
    by: str,
    now: datetime,
    why: str,
    evidence: str | None = None,
    object_id: str | None = None,
    via: str | None = None,
) -> Move:
    """A person's verdict that was refused, kept as a note on the record as it stands:
    who claimed what, with their reason and evidence, and why it was refused. It moves
    nothing; an audit reads it beside the verdicts that were recorded."""
    who = attested(by, via)
    detail = {"refused": why, **_claim(applied, reason, by, via, evidence, object_id)}
    return Move(
        rec.action_id,
        rec.status,
        rec.status,
        to_text(now),
        f"operator:{who}",
        EventKind.NOTE,
        detail=detail,
    )


def _claim(
    applied: bool,
    reason: str,
    by: str,
    via: str | None,
    evidence: str | None,
    object_id: str | None,
) -> dict[str, Any]:
    """What a person's verdict says, as its event keeps it, recorded or refused."""
    detail: dict[str, Any] = {
        "verdict": "applied" if applied else "not_applied",
        "reason": reason,
        "evidence": evidence,
        "object_id": object_id,
        "by": attested(by, via),
    }
    if via is not None:
        detail.update(person=by or None, via=via)
    return detail


def attested(by: str, via: str | None) -> str:
    """Who a verdict names after ``operator:``: the person, the surface that vouched for
    them (``alice via api:ops``), or the surface alone."""
    if via is None:
        return by
    return f"{by} via {via}" if by else via


def one_line(text: str) -> str:
    """Text as one line: a provider's body never carries its newlines into a reason."""
    return " ".join(text.split())


def _json(value: Any) -> str | None:
    if value is None:
        return None
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False)


__all__ = [
    "PAUSED",
    "Claim",
    "ReplyProof",
    "absence_counts_from",
    "attested",
    "backoff",
    "by_evidence",
    "callback",
    "check_error",
    "claim",
    "classify",
    "contradiction",
    "expire",
    "final_answer",
    "judge",
    "late_outcome",
    "needs_person",
    "new_record",
    "outcome",
    "paused",
    "recheck_needed",
    "refused_verdict",
    "reopen",
    "repeats",
    "request_budget",
    "request_for",
    "resolution",
    "rests_on",
    "settle_verdict",
    "spends_budget",
    "target_for",
    "throttled",
    "unresolved",
    "verification",
    "wait_again",
    "weigh",
]
