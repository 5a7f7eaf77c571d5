"""The dispatcher and the confirmation handler.

Every path that sends (dispatch, confirm, retry) goes through ``Dispatcher._send``:
claim (one guarded write, committed with its lease before anything leaves), then the
one retry budget, then the outcome classified as DESIGN.md rule 3 says and written
under the same lease. The caller that loses the claim never calls the provider.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import faults
from .clock import Clock, from_text, plus, to_text
from .errors import LedgerBusy, TransitionNotAllowed, UsageError
from .ledger import Ledger
from .model import (
    Acceptance,
    ActionRecord,
    Delivery,
    Status,
    Tier,
    build_strategy,
    idempotency_key,
    params_hash,
)
from .providers.base import OperationSpec, Request, Wire, WireResult

DEFAULT_LEASE_GRACE = 30.0
DEFAULT_BACKOFF = 0.05  # s before the first repeat; doubles, capped at 2 s


class Outcome(StrEnum):
    """What a dispatch/confirm call did (DESIGN.md rule 8)."""

    DISPATCHED = "dispatched"
    RECORDED = "recorded"  # dispatch --needs-confirmation: waiting for confirm
    ALREADY_COMPLETED = "already_completed"
    IN_PROGRESS = "in_progress"
    BLOCKED = "blocked"
    NOT_FOUND = "not_found"


class Result(StrEnum):
    """The real result of a call this process made."""

    SUCCEEDED = "succeeded"  # CONFIRMED: the effect was observed
    ACCEPTED = "accepted"  # AWAITING_VERIFICATION: accepted, not yet observed
    FAILED = "failed"  # FAILED: provably not applied
    UNRESOLVED = "unresolved"  # DENIED_UNRESOLVED: nobody knows yet


RESULT_BY_STATUS = {
    Status.CONFIRMED: Result.SUCCEEDED,
    Status.AWAITING_VERIFICATION: Result.ACCEPTED,
    Status.FAILED: Result.FAILED,
    Status.DENIED_UNRESOLVED: Result.UNRESOLVED,
}



@dataclass
class Report:
    """A call's answer: the record as it now stands, what happened, and why."""

    outcome: Outcome
    record: ActionRecord | None
    result: Result | None = None
    message: str = ""
    action_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.record.to_json() if self.record else {"action_id": self.action_id}
        data["outcome"] = str(self.outcome)
        data["result"] = str(self.result) if self.result else None
        data["message"] = self.message
        return data


class Verdict(StrEnum):
    PROVEN = "proven"  # the reply proves the effect
    ACCEPTED = "accepted"  # delivered; the effect is not proven
    REJECTED = "rejected"  # provably not applied
    NEVER_SENT = "never_sent"  # nothing left this machine
    AMBIGUOUS = "ambiguous"  # it may or may not have applied


def classify(spec: OperationSpec, wire: WireResult) -> Verdict:
    """DESIGN.md rule 3, in one place."""
    if wire.wire is Wire.NOT_CONNECTED:
        return Verdict.NEVER_SENT
    if wire.wire is Wire.NO_ANSWER:
        return Verdict.AMBIGUOUS
    code = wire.status_code or 0
    if wire.applied is True:
        return Verdict.PROVEN if spec.tier is Tier.FULL else Verdict.ACCEPTED
    if 200 <= code <= 299:
        return Verdict.REJECTED if wire.applied is False else Verdict.ACCEPTED
    if code in (408, 429) or 500 <= code <= 599:
        return Verdict.AMBIGUOUS
    if 400 <= code <= 499:
        return Verdict.REJECTED
    return Verdict.AMBIGUOUS  # 1xx, 3xx and codes outside RFC ranges prove nothing


@dataclass
class DispatchSettings:
    lease_grace: float = DEFAULT_LEASE_GRACE
    backoff: float = DEFAULT_BACKOFF


@dataclass
class Dispatcher:
    ledger: Ledger
    registry: Any  # settled.providers.Registry (anything with .operation() and .provider())
    clock: Clock = field(default_factory=Clock)
    settings: DispatchSettings = field(default_factory=DispatchSettings)
    actor: str = "dispatcher"

    # ---------------------------------------------------------------- entry points
    def submit(
        self,
        provider: str,
        operation: str,
        params: Any,
        *,
        action_id: str | None = None,
        needs_confirmation: bool = False,
    ) -> Report:
        """Record an action and (unless it needs confirmation) dispatch it.

        An existing ``action_id`` with the same params returns that record and sends
        nothing; with other params it raises ``Conflict``."""
        spec = self.registry.operation(provider, operation)
        # A provider may refuse params it could never send (UsageError): nothing is recorded.
        check = getattr(self.registry.provider(provider), "check_params", None)
        if check is not None:
            check(operation, params)
        now = self.clock.now()
        at = to_text(now)
        strategy = build_strategy(
            spec.tier, now, spec.consistency_window, carries_key=spec.carries_key
        )
        aid = action_id or "act-" + uuid.uuid4().hex[:20]
        row = {
            "action_id": aid,
            "provider": provider,
            "operation": operation,
            "params": _params_json(params),
            "params_hash": params_hash(params),
            "tier": str(spec.tier),
            "reconciliation_key": strategy.reconciliation_key,
            "eligible_at": to_text(strategy.eligible_at),
            "requires_manual_verification": int(strategy.requires_manual_verification),
            "attempt": 1,
            "idempotency_key": idempotency_key(aid, 1),
            "status": str(Status.PENDING),
            "delivery": str(Delivery.PENDING),
            "acceptance": str(Acceptance.UNKNOWN),
            "created_at": at,
            "updated_at": at,
            "checks": 0,
        }
        if needs_confirmation:
            record, created = self.ledger.record(row, actor=self.actor, at=at)
            if not created:
                return _as_found(record, EXISTS)
            return Report(
                Outcome.RECORDED,
                record,
                message="recorded; run `settled confirm` to dispatch it",
            )
        return self._record_and_send(row, spec)

    def _record_and_send(self, row: dict[str, Any], spec: OperationSpec) -> Report:
        """Record and claim in one durable transaction (the ``recorded`` and ``claimed``
        events, in that order), committed before the request leaves: one fsync fewer
        than recording first. The caller that finds the id taken claims nothing."""
        aid, at = row["action_id"], row["created_at"]
        provider = self.registry.provider(row["provider"])
        snapshot = None
        if spec.snapshots:
            # A snapshot is a query: never spend one on an id that already exists.
            if self.ledger.find(aid) is not None:
                record, _ = self.ledger.record(row, actor=self.actor, at=at)  # Conflict or same
                return _as_found(record, EXISTS)
            snapshot = provider.snapshot(row["operation"], json.loads(row["params"]))
        now = self.clock.now()  # the lease runs from here, after any snapshot
        plan = self._claim_plan(spec, now, row["idempotency_key"], row["eligible_at"], snapshot)
        faults.point("before_claim")
        with self.ledger.write() as c:
            existing = self.ledger.insert(c, row, actor=self.actor, at=at)  # Conflict: rolled back
            if existing is None:
                claimed = self.ledger.apply(
                    c, aid, Status.PENDING, Status.IN_FLIGHT, actor=self.actor,
                    kind="claimed", at=to_text(now), detail=plan.detail, values=plan.values,
                )
                assert claimed is not None  # inserted PENDING in this very transaction
        if existing is not None:
            return _as_found(existing, EXISTS)
        assert claimed is not None
        faults.point("after_claim")
        return self._execute(claimed, spec, provider, plan)

    def confirm(self, action_id: str) -> Report:
        """DESIGN.md rule 8: the late-confirmation race, answered honestly."""
        record = self.ledger.find(action_id)
        if record is None:
            return Report(
                Outcome.NOT_FOUND, None, message=f"no action {action_id!r}", action_id=action_id
            )
        if record.terminal:
            return Report(
                Outcome.ALREADY_COMPLETED,
                record,
                RESULT_BY_STATUS[record.status],
                f"already {record.status}",
            )
        if record.status is Status.DENIED_UNRESOLVED:
            return Report(
                Outcome.BLOCKED,
                record,
                Result.UNRESOLVED,
                "prior dispatch unresolved — reconcile before retry",
            )
        if record.status is Status.PENDING:
            return self._send(record)
        return Report(Outcome.IN_PROGRESS, record, None, f"already {record.status}")

    def retry(self, action_id: str) -> Report:
        """Open attempt N+1 (new idempotency key) — only from FAILED, i.e. after
        evidence that the previous attempt did not apply — and dispatch it."""
        record = self.ledger.get(action_id)
        if record.status is Status.DENIED_UNRESOLVED:
            raise TransitionNotAllowed(
                f"action {action_id} is DENIED_UNRESOLVED: the last attempt may have applied; "
                "run `settled reconcile` or `settled resolve` first"
            )
        if record.status is not Status.FAILED:
            raise TransitionNotAllowed(
                f"action {action_id} is {record.status}; retry is allowed only from FAILED"
            )
        spec = self.registry.operation(record.provider, record.operation)
        now = self.clock.now()
        at = to_text(now)
        attempt = record.attempt + 1
        strategy = build_strategy(
            spec.tier, now, spec.consistency_window, carries_key=spec.carries_key
        )
        values = {
            "attempt": attempt,
            "idempotency_key": idempotency_key(action_id, attempt),
            "reconciliation_key": strategy.reconciliation_key,
            "eligible_at": to_text(strategy.eligible_at),
            "delivery": str(Delivery.PENDING),
            "acceptance": str(Acceptance.UNKNOWN),
            "dispatch_id": None,
            "provider_object_id": None,
            "dispatched_at": None,
            "confirmed_at": None,
            "confirmed_by": None,
            "next_check_at": None,
            "verify_started_at": None,
            "verify_deadline_at": None,
            "checks": 0,
            "reason": None,
            "snapshot": None,
        }
        # Guarded on the attempt read above, in one write transaction: two concurrent
        # retries of attempt N never both open (and send) N+1, and a retry that read
        # attempt N never reuses key N+1 after attempt N+1 has failed as well.
        reopened = None
        with self.ledger.write() as c:
            row = c.execute("SELECT attempt FROM actions WHERE action_id = ?", (action_id,))
            if row.fetchone() == (record.attempt,):
                reopened = self.ledger.apply(
                    c, action_id, Status.FAILED, Status.PENDING, actor=self.actor,
                    kind="retry", at=at, values=values,
                    detail={"attempt": attempt, "previous_idempotency_key": record.idempotency_key},
                )
        if reopened is None:  # someone else retried first
            return Report(Outcome.IN_PROGRESS, self.ledger.get(action_id), None, "retried elsewhere")
        return self._send(reopened)

    # ---------------------------------------------------------------- the send
    def _send(self, record: ActionRecord) -> Report:
        spec = self.registry.operation(record.provider, record.operation)
        provider = self.registry.provider(record.provider)
        snapshot = provider.snapshot(record.operation, record.params) if spec.snapshots else None
        now = self.clock.now()
        plan = self._claim_plan(spec, now, record.idempotency_key, record.eligible_at, snapshot)
        faults.point("before_claim")
        claimed = self.ledger.transition(
            record.action_id,
            Status.PENDING,
            Status.IN_FLIGHT,
            actor=self.actor,
            kind="claimed",
            at=to_text(now),
            detail=plan.detail,
            values=plan.values,
        )
        if claimed is None:  # another caller won the claim: report what it left
            current = self.ledger.get(record.action_id)
            return _as_found(current, f"claimed by another caller; now {current.status}")
        faults.point("after_claim")
        return self._execute(claimed, spec, provider, plan)

    def _claim_plan(
        self,
        spec: OperationSpec,
        now: Any,
        key: str,
        eligible_at: str | None,
        snapshot: Any,
    ) -> _Claim:
        """The claim's lease, event detail and fields."""
        at = to_text(now)
        budget = spec.timeout * spec.attempts + self._backoff_total(spec.attempts)
        lease_until = to_text(plus(now, budget + self.settings.lease_grace))
        owner = "d-" + uuid.uuid4().hex
        eligible = None
        if eligible_at is not None:  # the window runs from the real dispatch time
            eligible = to_text(plus(now, spec.consistency_window if spec.tier is not Tier.FULL else 0))
        return _Claim(
            owner,
            lease_until,
            {"lease_expires_at": lease_until, "idempotency_key": key},
            {
                "delivery": str(Delivery.IN_FLIGHT),
                "dispatch_id": owner,
                "lease_owner": owner,
                "lease_expires_at": lease_until,
                "next_check_at": lease_until,  # a lost dispatcher is found by the due scan
                "dispatched_at": at,
                "eligible_at": eligible,
                "snapshot": _dumps(snapshot) if snapshot is not None else None,
            },
        )

    def _execute(self, claimed: ActionRecord, spec: OperationSpec, provider: Any, plan: _Claim) -> Report:
        """Send a claimed action within the one retry budget; write its outcome."""
        owner, lease_until = plan.owner, plan.lease_until
        tries: list[dict[str, Any]] = []
        maybe_applied = False
        verdict = Verdict.AMBIGUOUS
        wire = WireResult(Wire.NO_ANSWER)
        for n in range(1, max(1, spec.attempts) + 1):
            wire = provider.execute(
                Request(
                    action_id=claimed.action_id,
                    operation=claimed.operation,
                    params=claimed.params,
                    idempotency_key=claimed.idempotency_key,
                    reconciliation_key=claimed.reconciliation_key,
                    attempt=claimed.attempt,
                    timeout=spec.timeout,
                )
            )
            faults.point("after_reply")
            verdict = classify(spec, wire)
            tries.append(
                {
                    "try": n,
                    "wire": str(wire.wire),
                    "status_code": wire.status_code,
                    "verdict": str(verdict),
                    "detail": wire.detail[:300],
                }
            )
            if verdict is Verdict.AMBIGUOUS:
                maybe_applied = True
            repeat = verdict is Verdict.NEVER_SENT or (
                verdict is Verdict.AMBIGUOUS and spec.dedupes_keys
            )
            if not repeat or n >= spec.attempts:
                break
            self.clock.sleep(min(self.settings.backoff * 2 ** (n - 1), 2.0))

        # An earlier try may have applied: a later "never sent" or rejection cannot
        # prove the effect absent, so the evidence only allows "unresolved".
        if maybe_applied and verdict in (Verdict.NEVER_SENT, Verdict.REJECTED):
            verdict = Verdict.AMBIGUOUS
        done = self.clock.now()
        to, values, reason = _outcome(spec, claimed, verdict, wire, done)
        values.update({"lease_owner": None, "lease_expires_at": None})
        detail = {"verdict": str(verdict), "tries": tries, "reason": reason}
        try:
            final = self.ledger.transition(
                claimed.action_id,
                Status.IN_FLIGHT,
                to,
                actor=self.actor,
                kind="outcome",
                at=to_text(done),
                detail=detail,
                values=values,
                owner=owner,
            )
        except LedgerBusy:
            # The request has left: "nothing was changed" would be false here.
            raise LedgerBusy(
                f"action {claimed.action_id}: the request was sent, but the ledger stayed "
                f"locked (waited {self.ledger.busy_timeout:g} s) so its outcome is not "
                f"recorded; it stays IN_FLIGHT until its lease expires at {lease_until}, "
                "then reconciliation settles it"
            ) from None
        if final is None:
            final = self._late_outcome(claimed.action_id, to, values, detail, done)
        return Report(Outcome.DISPATCHED, final, RESULT_BY_STATUS.get(final.status), reason)

    def _late_outcome(
        self, action_id: str, to: Status, values: dict[str, Any], detail: dict[str, Any], now: Any
    ) -> ActionRecord:
        """Our lease expired and a reconciler already moved the record on. Our reply is
        still evidence: apply it where the table allows, else append it."""
        current = self.ledger.get(action_id)
        if current.status is Status.DENIED_UNRESOLVED and to in (Status.CONFIRMED, Status.FAILED):
            values = {k: v for k, v in values.items() if k not in ("lease_owner", "lease_expires_at")}
            moved = self.ledger.transition(
                action_id,
                Status.DENIED_UNRESOLVED,
                to,
                actor=self.actor,
                kind="late_outcome",
                at=to_text(now),
                detail=detail,
                values={**values, "next_check_at": None},
            )
            return moved or self.ledger.get(action_id)
        if current.status is Status.DENIED_UNRESOLVED:
            self.ledger.transition(
                action_id,
                Status.DENIED_UNRESOLVED,
                Status.DENIED_UNRESOLVED,
                actor=self.actor,
                kind="late_outcome",
                at=to_text(now),
                detail=detail,
            )
            return self.ledger.get(action_id)
        return current

    def _backoff_total(self, attempts: int) -> float:
        return float(
            sum(min(self.settings.backoff * 2**i, 2.0) for i in range(max(0, attempts - 1)))
        )


def _outcome(
    spec: OperationSpec, rec: ActionRecord, verdict: Verdict, wire: WireResult, now: Any
) -> tuple[Status, dict[str, Any], str]:
    """Map a verdict to the new status and the fields that go with it."""
    at = to_text(now)
    values: dict[str, Any] = {}
    if wire.object_id:
        values["provider_object_id"] = wire.object_id
    code = f" (HTTP {wire.status_code})" if wire.status_code is not None else ""

    def verify_from(start_text: str | None) -> None:
        start = max(now, from_text(start_text) or now)
        values["verify_started_at"] = to_text(start)
        values["verify_deadline_at"] = to_text(plus(start, spec.verify_deadline))
        values["next_check_at"] = to_text(start)

    if verdict is Verdict.PROVEN:
        values.update(
            delivery=str(Delivery.DELIVERED),
            acceptance=str(Acceptance.ACCEPTED),
            confirmed_at=at,
            confirmed_by="provider",
            next_check_at=None,
            reason=None,
        )
        return Status.CONFIRMED, values, f"the provider's reply proves the effect{code}"
    if verdict is Verdict.REJECTED:
        values.update(
            delivery=str(Delivery.DELIVERED),
            acceptance=str(Acceptance.REJECTED),
            next_check_at=None,
            reason=f"rejected by the provider: {wire.detail[:200]}"
            if wire.detail
            else f"rejected by the provider{code}",
        )
        return Status.FAILED, values, values["reason"]
    if verdict is Verdict.NEVER_SENT:
        values.update(
            delivery=str(Delivery.FAILED),
            acceptance=str(Acceptance.REJECTED),
            next_check_at=None,
            reason=f"never reached the provider: {wire.detail[:200]}",
        )
        return Status.FAILED, values, values["reason"]
    if verdict is Verdict.ACCEPTED:
        values.update(delivery=str(Delivery.DELIVERED), acceptance=str(Acceptance.UNKNOWN))
        if spec.tier is Tier.BLIND:
            values.update(
                next_check_at=None,
                reason="blind operation: nothing can observe the effect; a person must verify it",
            )
            return Status.DENIED_UNRESOLVED, values, values["reason"]
        if spec.tier is Tier.PARTIAL:
            values.update(
                next_check_at=rec.eligible_at,
                reason="delivered; only a person can verify acceptance (partial tier)",
            )
            return Status.AWAITING_VERIFICATION, values, values["reason"]
        if spec.queryable:
            verify_from(rec.eligible_at)
            values["reason"] = f"accepted{code}, not yet observed; verification at {values['next_check_at']}"
            return Status.AWAITING_VERIFICATION, values, values["reason"]
        values.update(
            next_check_at=None,
            reason=f"accepted{code} but the reply proves nothing and there is no query",
        )
        return Status.DENIED_UNRESOLVED, values, values["reason"]
    # AMBIGUOUS
    values.update(delivery=str(Delivery.UNKNOWN), acceptance=str(Acceptance.UNKNOWN))
    why = f"outcome unknown{code}: {wire.detail[:200]}".rstrip(": ")
    if not spec.dedupes_keys:
        why += "; not repeated because the provider does not deduplicate keys"
    if spec.queryable and spec.tier is not Tier.PARTIAL:
        verify_from(rec.eligible_at)
        values["reason"] = why + "; reconciliation will query the provider"
    else:
        values.update(next_check_at=None, reason=why + "; needs a person")
    return Status.DENIED_UNRESOLVED, values, values["reason"]


EXISTS = "action already exists with the same params; nothing sent"


@dataclass
class _Claim:
    owner: str
    lease_until: str
    detail: dict[str, Any]
    values: dict[str, Any]


def _as_found(record: ActionRecord, msg: str) -> Report:
    """Rule 8's answers for a record this caller did not send."""
    if record.terminal:
        return Report(Outcome.ALREADY_COMPLETED, record, RESULT_BY_STATUS[record.status], msg)
    if record.status is Status.DENIED_UNRESOLVED:
        return Report(Outcome.BLOCKED, record, Result.UNRESOLVED, msg)
    return Report(Outcome.IN_PROGRESS, record, None, msg)


def _params_json(params: Any) -> str:
    """Params as stored and sent: strict JSON (no NaN/Infinity, valid UTF-8), checked
    before anything is recorded, so that a request can never fail to encode after
    its claim."""
    try:
        text = json.dumps(params, sort_keys=True, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise UsageError(f"params are not valid JSON: {exc}") from None
    return text


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


__all__ = ["DispatchSettings", "Dispatcher", "Outcome", "Report", "Result", "classify"]
