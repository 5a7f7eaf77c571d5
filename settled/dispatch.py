"""The dispatcher and the confirmation handler.

Every path that sends (dispatch, confirm, retry) goes through ``Dispatcher._send``:
claim (one guarded write, committed with its lease before anything leaves), then the
one retry budget, then the outcome written under the same lease. What each reply
means and where the record goes is ``settled.policy``'s to say; this module only
fetches, calls and writes. The caller that loses the claim never calls the provider.

Before every try the dispatcher checks its lease on the ledger's steady clock, and
hands the provider the instant the lease lapses (``Request.send_by``): a process
paused after its claim (Ctrl-Z, a stopped VM, slow DNS) never starts a request its
lease no longer covers, which is what lets an absence count as proof once the lease
and the consistency window are over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from . import crashpoints, policy
from .clock import Clock, steady
from .crashpoints import Probe, no_probe
from .errors import InvalidInput, LedgerError, OutcomeNotRecorded, TransitionNotAllowed
from .model import ActionRecord, Declared, Status
from .policy import Verdict
from .providers.base import Provider, Providers, WireResult
from .storage import Ledger, Move

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
    ACCEPTED = "accepted"  # AWAITING_VERIFICATION: taken by the provider, not yet observed
    FAILED = "failed"  # FAILED: provably not applied
    UNRESOLVED = "unresolved"  # DENIED_UNRESOLVED: nobody knows yet


RESULT_BY_STATUS = {
    Status.CONFIRMED: Result.SUCCEEDED,
    Status.AWAITING_VERIFICATION: Result.ACCEPTED,
    Status.FAILED: Result.FAILED,
    Status.DENIED_UNRESOLVED: Result.UNRESOLVED,
}
EXISTS = "action already exists with the same params; nothing sent"


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


@dataclass
class DispatchSettings:
    lease_grace: float = DEFAULT_LEASE_GRACE
    backoff: float = DEFAULT_BACKOFF


class Dispatcher:
    """Records, claims and sends actions. ``clock`` defaults to the ledger's (steady
    on one host); ``probe`` is a crash-point hook for tests (``settled.crashpoints``)."""

    def __init__(
        self,
        ledger: Ledger,
        registry: Providers,
        clock: Clock | None = None,
        settings: DispatchSettings | None = None,
        actor: str = "dispatcher",
        probe: Probe = no_probe,
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.clock = clock if clock is not None else ledger.clock()
        self.settings = settings or DispatchSettings()
        self.actor = actor
        self.probe = probe

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
        """Record an action and (unless it needs confirmation, asked here or declared
        by the operation) dispatch it.

        An existing ``action_id`` with the same params returns that record and sends
        nothing; with other params it raises ``Conflict``."""
        spec = self.registry.operation(provider, operation)
        needs_confirmation = needs_confirmation or bool(getattr(spec, "needs_confirmation", False))
        check_params_json(params)
        # A provider may refuse params it could never send: nothing is recorded.
        self.registry.check_params(provider, operation, params)
        rec = policy.new_record(
            action_id=action_id, provider=provider, operation=operation, params=params,
            declared=Declared.of(spec), now=self.clock.now(),
        )  # fmt: skip
        if needs_confirmation:
            record, created = self.ledger.record(rec, actor=self.actor)
            if not created:
                return _as_found(record, EXISTS)
            return Report(
                Outcome.RECORDED, record, message="recorded; run `settled confirm` to dispatch it"
            )
        return self._record_and_send(rec)

    def confirm(self, action_id: str) -> Report:
        """DESIGN.md rule 8: the late-confirmation race, answered honestly."""
        record = self.ledger.find(action_id)
        if record is None:
            return Report(
                Outcome.NOT_FOUND, None, message=f"no action {action_id!r}", action_id=action_id
            )
        if record.terminal:
            return Report(Outcome.ALREADY_COMPLETED, record, RESULT_BY_STATUS[record.status],
                          f"already {record.status}")  # fmt: skip
        if record.status is Status.DENIED_UNRESOLVED:
            return Report(Outcome.BLOCKED, record, Result.UNRESOLVED,
                          "prior dispatch unresolved — reconcile before retry")  # fmt: skip
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
        if record.contradiction:
            raise TransitionNotAllowed(
                f"action {action_id} is FAILED, but later evidence contradicts it "
                f"({record.contradiction}); `settled resolve` it first"
            )
        declared = self._declared(record)
        reopened = self.ledger.move(policy.reopen(record, declared, self.clock.now(), actor=self.actor))
        if reopened is None:  # someone else retried first
            return Report(Outcome.IN_PROGRESS, self.ledger.get(action_id), None, "retried elsewhere")
        return self._send(reopened)

    # ---------------------------------------------------------------- the send
    def _declared(self, record: ActionRecord) -> Declared:
        """The declarations that govern ``record``: those stored with it (rule 11);
        today's config only for records made before declarations were stored."""
        if record.declared is not None:
            return record.declared
        return Declared.of(self.registry.operation(record.provider, record.operation))

    def _record_and_send(self, rec: ActionRecord) -> Report:
        """Record and claim in one durable transaction (the ``recorded`` and ``claimed``
        events, in that order), committed before the request leaves: one fsync fewer
        than recording first. The caller that finds the id taken claims nothing."""
        declared = self._declared(rec)
        provider = self.registry.provider(rec.provider)
        snapshot = None
        if declared.snapshots:
            # A snapshot is a query: never spend one on an id that already exists.
            if self.ledger.find(rec.action_id) is not None:
                record, _ = self.ledger.record(rec, actor=self.actor)  # Conflict or the same
                return _as_found(record, EXISTS)
            snapshot = provider.snapshot(rec.operation, rec.params)
        taken = self._claim(rec, declared, snapshot)
        self.probe("before_claim")
        claimed, created = self.ledger.record_and_claim(rec, actor=self.actor, claim=taken.move)
        if not created:
            return _as_found(claimed, EXISTS)
        self.probe("after_claim")
        return self._execute(claimed, declared, provider, taken)

    def _send(self, record: ActionRecord) -> Report:
        declared = self._declared(record)
        provider = self.registry.provider(record.provider)
        snapshot = provider.snapshot(record.operation, record.params) if declared.snapshots else None
        taken = self._claim(record, declared, snapshot)
        self.probe("before_claim")
        claimed = self.ledger.move(taken.move)
        if claimed is None:  # another caller won the claim: report what it left
            current = self.ledger.get(record.action_id)
            return _as_found(current, f"claimed by another caller; now {current.status}")
        self.probe("after_claim")
        return self._execute(claimed, declared, provider, taken)

    def _claim(self, rec: ActionRecord, declared: Declared, snapshot: Any) -> policy.Claim:
        return policy.claim(
            rec, declared, self.clock.now(), actor=self.actor, grace=self.settings.lease_grace,
            default_backoff=self.settings.backoff, snapshot=snapshot,
        )  # fmt: skip

    def _execute(
        self, claimed: ActionRecord, declared: Declared, provider: Provider, taken: policy.Claim
    ) -> Report:
        """Send a claimed action within the one retry budget; write its outcome."""
        tries: list[dict[str, Any]] = []
        verdicts: list[Verdict] = []
        wire: WireResult | None = None
        late_send = False
        lapsed = False
        for n in range(1, max(1, declared.attempts) + 1):
            left = self._lease_left(taken)
            if left <= 0:  # paused or slow past the lease: this try must not start
                lapsed = True
                break
            send_by = steady() + left
            with crashpoints.active(self.probe):
                wire = provider.execute(policy.request_for(claimed, declared, send_by))
            self.probe("after_reply")
            if wire.written_at is not None and wire.written_at > send_by:
                late_send = True  # written after the lease lapsed (a pause at the last moment)
            verdict = policy.classify(declared, wire)
            verdicts.append(verdict)
            tries.append(_try_detail(n, wire, verdict))
            if not policy.repeats(declared, verdict) or n >= declared.attempts:
                break
            pause = policy.backoff(declared, self.settings.backoff, n)
            if wire.retry_after is not None:
                pause = max(pause, wire.retry_after)
            if pause >= self._lease_left(taken):
                tries[-1]["stopped"] = f"the next try would start after the lease ({pause:g} s pause)"
                break
            self.clock.sleep(pause)

        verdict = policy.settle_verdict(verdicts)
        if lapsed and not verdicts:
            tries.append({"try": len(tries) + 1, "verdict": str(Verdict.NEVER_SENT),
                          "detail": "not sent: the lease lapsed before the request could start"})  # fmt: skip
            wire = None
        done = self.clock.now()
        move = policy.outcome(
            claimed, declared, verdict, wire, done, owner=taken.owner, actor=self.actor,
            tries=tries, late_send=late_send,
        )  # fmt: skip
        if lapsed and not verdicts:
            move = _reason(move, "never sent: the lease lapsed before the request could start")
        final = self._write_outcome(claimed, move, taken)
        if final is None:
            final = self._late(claimed, move, verdict, late_send, done)
        elif verdict is Verdict.CONFLICT and final.status is Status.AWAITING_VERIFICATION:
            final = self._verify_now(final)
        reason = str(move.detail.get("reason", ""))
        return Report(Outcome.DISPATCHED, final, RESULT_BY_STATUS.get(final.status), reason)

    def _lease_left(self, taken: policy.Claim) -> float:
        return (taken.lease_until - self.clock.now()).total_seconds()

    def _write_outcome(
        self, claimed: ActionRecord, move: Move, taken: policy.Claim
    ) -> ActionRecord | None:
        try:
            return self.ledger.move(move)
        except LedgerError as exc:
            # The request has left: "nothing was changed" would be false here.
            cause = str(exc).split("; ")[0]  # what failed, not what it meant for its caller
            raise OutcomeNotRecorded(
                f"action {claimed.action_id}: the request was sent, but its outcome could not "
                f"be recorded ({cause}); it stays IN_FLIGHT until its lease lapses at "
                f"{move.values.get('lease_expires_at') or taken.move.values['lease_expires_at']},"
                " then reconciliation settles it",
                claimed.action_id,
            ) from None

    def _late(
        self, claimed: ActionRecord, move: Move, verdict: Verdict, late_send: bool, now: datetime
    ) -> ActionRecord:
        """Our lease lapsed and the record moved on: our reply is still evidence."""
        for _ in range(3):  # each guard that fails means the record moved again: look again
            current = self.ledger.get(claimed.action_id)
            late = policy.late_outcome(
                current, move, verdict, now, attempt=claimed.attempt, actor=self.actor,
                late_send=late_send,
            )  # fmt: skip
            moved = self.ledger.move(late)
            if moved is not None:
                return moved
        return self.ledger.get(claimed.action_id)

    def _verify_now(self, record: ActionRecord) -> ActionRecord:
        """A conditional-write conflict is never proof (rule 10): read the resource now."""
        from .reconcile import Reconciler

        Reconciler(self.ledger, self.registry, clock=self.clock, actor=self.actor,
                   probe=self.probe).run_ids([record.action_id])  # fmt: skip
        return self.ledger.get(record.action_id)


def _try_detail(n: int, wire: WireResult, verdict: Verdict) -> dict[str, Any]:
    return {
        "try": n,
        "wire": str(wire.wire),
        "status_code": wire.status_code,
        "verdict": str(verdict),
        "detail": policy.one_line(wire.detail)[:300],
    }


def _reason(move: Move, reason: str) -> Move:
    from dataclasses import replace

    values = {**move.values, "reason": reason}
    return replace(move, values=values, detail={**move.detail, "reason": reason})


def _as_found(record: ActionRecord, msg: str) -> Report:
    """Rule 8's answers for a record this caller did not send."""
    if record.terminal:
        return Report(Outcome.ALREADY_COMPLETED, record, RESULT_BY_STATUS[record.status], msg)
    if record.status is Status.DENIED_UNRESOLVED:
        return Report(Outcome.BLOCKED, record, Result.UNRESOLVED, msg)
    return Report(Outcome.IN_PROGRESS, record, None, msg)


def check_params_json(params: Any) -> str:
    """Params as stored and sent: strict JSON (no NaN/Infinity, valid UTF-8), checked
    before anything is recorded, so that a request can never fail to encode after
    its claim."""
    try:
        text = json.dumps(params, sort_keys=True, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidInput(f"params are not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("params are nested too deeply") from None
    return text


classify = policy.classify  # the one place wire results get their meaning, re-exported

__all__ = ["DispatchSettings", "Dispatcher", "Outcome", "Report", "Result", "Verdict", "classify"]
