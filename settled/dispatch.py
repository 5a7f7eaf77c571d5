"""The dispatcher and the confirmation handler.

Every path that sends (dispatch, confirm, retry) goes through ``Dispatcher._send``:
claim (one guarded write, committed with its lease before anything leaves), then the
one retry budget, then the outcome written under the same lease. What each reply
means and where the record goes is ``settled.policy``'s to say; this module only
fetches, calls and writes. The caller that loses the claim never calls the provider.

The bulk path (``settled.bulk``, behind ``submit_many`` and ``retry_many``) claims and
commits in groups but sends through the same steps, the dispatcher's public seam:
``declared_for`` (what governs a record), ``send_claimed`` (one claimed attempt's tries,
writing nothing), ``outcome_move`` (where they put the record), ``finish`` (the report
once that move is written) and ``not_recorded`` (what a failed write means). The words
both paths share (``Report``, ``Attempt``, ``as_found``…) live in ``settled.sending``.

Before every try the dispatcher checks its lease on the ledger's steady clock, and
hands the provider the instant the lease lapses (``Request.send_by``): a process
paused after its claim (Ctrl-Z, a stopped VM, slow DNS) never starts a request its
lease no longer covers, which is what lets an absence count as proof once the lease
and the consistency window are over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import crashpoints, policy, tracing
from .clock import Clock, from_text, steady
from .crashpoints import Probe, no_probe
from .errors import Conflict, LedgerError, OutcomeNotRecorded, SettledError, TransitionNotAllowed
from .intent import intended_id, intent_conflict
from .model import ActionRecord, Declared, Move, Status, WireResult, check_action_id
from .policy import ReplyProof
from .providers.base import Provider, Providers
from .sending import (
    DEFAULT_BACKOFF,
    DEFAULT_LEASE_GRACE,
    EXISTS,
    RESULT_BY_STATUS,
    Attempt,
    DispatchSettings,
    Outcome,
    Report,
    Result,
    as_found,
    check_params_json,
    retry_problem,
    with_reason,
)
from .storage import Ledger
from .throttle import Gate

if TYPE_CHECKING:
    from .bulk import Line, Settled
    from .reconcile import Recheck


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
        if action_id is not None:
            check_action_id(action_id)
        spec = self.registry.operation(provider, operation)
        needs_confirmation = needs_confirmation or bool(getattr(spec, "needs_confirmation", False))
        check_params_json(params)
        action_id = intended_id(spec, params, action_id)
        # A provider may refuse params it could never send: nothing is recorded.
        self.registry.check_params(provider, operation, params)
        rec = policy.new_record(
            action_id=action_id,
            provider=provider,
            operation=operation,
            params=params,
            declared=Declared.of(spec),
            now=self.clock.now(),
        )
        try:
            if needs_confirmation:
                record, created = self.ledger.record(rec, actor=self.actor)
                if not created:
                    return as_found(record, EXISTS)
                return Report(
                    Outcome.RECORDED,
                    record,
                    message="recorded; run `settled confirm` to dispatch it",
                )
            return self._record_and_send(rec)
        except Conflict:
            if not spec.action_key:
                raise
            raise Conflict(
                intent_conflict(spec.action_key, self.ledger.find(rec.action_id))
            ) from None

    def submit_many(
        self,
        provider: str,
        operation: str,
        lines: Iterable[Line],
        *,
        concurrency: int = 1,
        group: int | None = None,
        gate: Gate | None = None,
        stop_requested: Callable[[], bool] | None = None,
    ) -> Iterator[Settled]:
        """Bulk dispatch (``settled.bulk``): record and claim ``lines`` in groups, each
        group committed before any of its requests leaves; send them from
        ``concurrency`` threads (at most ``gate``'s limit in flight to the provider);
        commit their outcomes in groups. Yields one ``Settled`` per line, each after
        the commit that made it durable. The lines are read as the work goes, never
        all at once; an unknown provider or operation raises before anything. Once
        ``stop_requested()`` is true no further line is read or started; what was
        claimed is still reported (``FAILED``, never sent, when it never started)."""
        from .bulk import DEFAULT_GROUP, BulkDispatch

        bulk = BulkDispatch(
            self,
            provider,
            operation,
            concurrency=concurrency,
            group=group or self.settings.group or DEFAULT_GROUP,
            gate=gate,
            stop_requested=stop_requested,
        )
        return bulk.run(lines)

    def retry_many(
        self,
        action_ids: Iterable[str],
        *,
        recheck: bool = True,
        concurrency: int | Mapping[str, int] = 1,
        group: int | None = None,
    ) -> Iterator[Settled]:
        """Bulk retry (``settled.bulk.BulkRetry``): each FAILED record is checked first
        (rule 14, as ``retry``), then reopened and claimed in groups, each group
        committed before any of its requests leaves, and sent from ``concurrency``
        threads (per provider, when a mapping). Yields one ``Settled`` per id, in
        provider order, each after the commit that made it durable: refused ones
        (not FAILED, contradicted, the effect visible, no check possible) with why,
        unknown ids as ``missing``. A provider that cannot be built here fails its
        records' lines (nothing sent for them); the others go on."""
        from .bulk import DEFAULT_GROUP, BulkRetry, Line, Settled

        lines: dict[str, list[Line]] = {}
        for n, aid in enumerate(dict.fromkeys(action_ids), 1):
            rec = self.ledger.find(aid)
            if rec is None:
                yield Settled(n, aid, problem=f"no action {aid!r}", missing=True)
                continue
            lines.setdefault(rec.provider, []).append(Line(n, aid))
        size = group or self.settings.group or DEFAULT_GROUP
        for provider, todo in lines.items():
            threads = concurrency if isinstance(concurrency, int) else concurrency.get(provider, 1)
            try:
                bulk = BulkRetry(
                    self,
                    provider,
                    recheck=recheck,
                    concurrency=threads,
                    group=size,
                    gate=Gate(threads),
                )
            except SettledError as exc:  # not configured here, or cannot be built
                for line in todo:
                    yield Settled(line.number, line.action_id, problem=f"not sent: {exc}")
                continue
            yield from bulk.run(todo)

    def confirm(self, action_id: str, *, params_hash: str | None = None) -> Report:
        """Rule 8 (docs/rules.md): the late-confirmation race, answered honestly.

        ``params_hash`` binds an approval to the params a person was shown: when the
        record's params are no longer those (a redaction), the approval is refused
        (``Conflict``) and nothing is sent; a new approval must be asked."""
        record = self.ledger.find(action_id)
        if record is None:
            return Report(
                Outcome.NOT_FOUND, None, message=f"no action {action_id!r}", action_id=action_id
            )
        if params_hash is not None and record.params_hash != params_hash:
            raise Conflict(
                f"action {action_id!r} no longer has the params the person approved; nothing "
                "was sent: ask for a new approval"
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

    def decline(self, action_id: str, why: str) -> Report:
        """A person (or whoever was asked for them) did not approve ``action_id``: the
        refusal is an event on the PENDING record, and nothing is sent. The record
        stays PENDING: only a later confirmation sends it, once. A record that has
        moved on is returned as it stands, with nothing written."""
        record = self.ledger.get(action_id)
        if record.status is not Status.PENDING:
            return as_found(record, f"not declined: already {record.status}")
        moved = self.ledger.move(policy.declined(record, self.clock.now(), self.actor, why))
        if moved is None:  # confirmed (or retried) by another caller meanwhile
            return as_found(self.ledger.get(action_id), "not declined: confirmed elsewhere")
        return Report(Outcome.RECORDED, moved, None, f"declined: {why}; nothing sent")

    def retry(self, action_id: str, *, recheck: bool = True) -> Report:
        """Open attempt N+1 (new idempotency key) — only from FAILED, i.e. after
        evidence that the previous attempt did not apply — and dispatch it.

        On an operation that has a query, the world is checked first (rule 14): when
        the effect of the last attempt is visible, the retry is refused
        (``EffectVisible``) and the record is corrected to CONFIRMED by that evidence;
        when the check cannot be made or cannot tell, it is refused (``RecheckFailed``)
        unless ``recheck`` is false, which the retry's event records."""
        record = self.ledger.get(action_id)
        problem = retry_problem(record)
        if problem:
            raise TransitionNotAllowed(problem)
        declared = self.declared_for(record)
        note = self.recheck(record, recheck=recheck).note
        reopened = self.ledger.move(
            policy.reopen(record, declared, self.clock.now(), actor=self.actor, recheck=note)
        )
        if reopened is None:  # someone else retried first
            return Report(
                Outcome.IN_PROGRESS, self.ledger.get(action_id), None, "retried elsewhere"
            )
        return self._send(reopened)

    def recheck(self, record: ActionRecord, *, recheck: bool = True) -> Recheck:
        """The check before a retry of ``record`` (rule 14), raising when it refuses
        the retry; ``recheck`` false skips it (its note says so)."""
        from .reconcile import Recheck, Reconciler

        if not recheck:
            return Recheck("skipped", "skipped (--no-recheck)", record)
        checker = Reconciler(
            self.ledger, self.registry, clock=self.clock, actor="recheck", probe=self.probe
        )
        seen = checker.recheck(record, self.clock.now(), asked=f"{self.actor} (retry)")
        if seen.refuses:
            raise seen.refusal("the retry")
        return seen

    # ---------------------------------------------------------------- the send
    def declared_for(self, record: ActionRecord) -> Declared:
        """The declarations that govern ``record``: those stored with it (rule 11);
        today's config only for records made before declarations were stored. Part of
        the seam the bulk path sends through."""
        if record.declared is not None:
            return record.declared
        return Declared.of(self.registry.operation(record.provider, record.operation))

    def _record_and_send(self, rec: ActionRecord) -> Report:
        """Record and claim in one durable transaction (the ``recorded`` and ``claimed``
        events, in that order), committed before the request leaves: one fsync fewer
        than recording first. The caller that finds the id taken claims nothing."""
        declared = self.declared_for(rec)
        provider = self.registry.provider(rec.provider)
        snapshot = None
        if declared.snapshots:
            # A snapshot is a query: never spend one on an id that already exists.
            if self.ledger.find(rec.action_id) is not None:
                record, _ = self.ledger.record(rec, actor=self.actor)  # Conflict or the same
                return as_found(record, EXISTS)
            snapshot = provider.snapshot(rec.operation, rec.params)
        taken = self._claim(rec, declared, snapshot)
        self.probe("before_claim")
        claimed, created = self.ledger.record_and_claim(rec, actor=self.actor, claim=taken.move)
        if not created:
            return as_found(claimed, EXISTS)
        self.probe("after_claim")
        return self._execute(claimed, declared, provider, taken)

    def _send(self, record: ActionRecord) -> Report:
        declared = self.declared_for(record)
        provider = self.registry.provider(record.provider)
        snapshot = (
            provider.snapshot(record.operation, record.params) if declared.snapshots else None
        )
        taken = self._claim(record, declared, snapshot)
        self.probe("before_claim")
        claimed = self.ledger.move(taken.move, record=record)  # not read back: we hold it
        if claimed is None:  # another caller won the claim: report what it left
            current = self.ledger.get(record.action_id)
            return as_found(current, f"claimed by another caller; now {current.status}")
        self.probe("after_claim")
        return self._execute(claimed, declared, provider, taken)

    def _claim(self, rec: ActionRecord, declared: Declared, snapshot: Any) -> policy.Claim:
        return policy.claim(
            rec,
            declared,
            self.clock.now(),
            actor=self.actor,
            grace=self.settings.lease_grace,
            default_backoff=self.settings.backoff,
            snapshot=snapshot,
        )

    def _execute(
        self, claimed: ActionRecord, declared: Declared, provider: Provider, taken: policy.Claim
    ) -> Report:
        """Send a claimed action within the one retry budget; write its outcome."""
        named = tracing.record(claimed.action_id, claimed.provider, claimed.operation, claimed.tier)
        with tracing.span("settled.dispatch", {**named, "settled.attempt": claimed.attempt}) as s:
            sent = self.send_claimed(claimed, declared, provider, taken)
            move = self.outcome_move(sent)
            try:
                report = self.finish(sent, move, self.ledger.move(move, record=claimed))
            except LedgerError as exc:
                tracing.failed(s, "the outcome could not be recorded")
                raise self.not_recorded(sent, move, exc) from None
            rec = report.record
            tracing.note(
                s,
                **{
                    "settled.outcome": str(report.outcome),
                    "settled.status": None if rec is None else str(rec.status),
                    "settled.result": None if report.result is None else str(report.result),
                },
            )
            return report

    def send_claimed(
        self,
        claimed: ActionRecord,
        declared: Declared,
        provider: Provider,
        taken: policy.Claim,
        gate: Gate | None = None,
    ) -> Attempt:
        """The tries of one claimed attempt, within its retry budget and its lease. Reads
        and writes no ledger, so the bulk path runs it on several threads at once; a
        ``gate`` holds the provider's limit on requests in flight and its Retry-After.
        Its outcome is ``outcome_move``'s to say and the caller's to write."""
        sent = Attempt(claimed, declared, taken)
        named = tracing.record(claimed.action_id, claimed.provider, claimed.operation, claimed.tier)
        for n in range(1, max(1, declared.attempts) + 1):
            with _slot(gate):
                left = self._lease_left(taken)
                if gate is not None and left > 0:
                    left = gate.wait(left)  # a provider that asked us to wait: within the lease
                    sent.held = left <= 0
                if left <= 0:  # paused or slow past the lease: this try must not start
                    sent.lapsed = True
                    break
                send_by = steady() + left
                with (
                    tracing.span("settled.try", {**named, "settled.try": n}) as s,
                    crashpoints.active(self.probe),
                ):
                    wire = provider.execute(policy.request_for(claimed, declared, send_by))
                    verdict = policy.classify(declared, wire)
                    tracing.note(s, **{"settled.outcome": str(verdict)})
            self.probe("after_reply")
            sent.wire = wire
            if wire.written_at is not None and wire.written_at > send_by:
                sent.late_send = True  # written after the lease lapsed (a pause at the last moment)
            sent.verdicts.append(verdict)
            sent.tries.append(_try_detail(n, wire, verdict))
            pause = policy.backoff(declared, self.settings.backoff, n)
            if gate is not None:  # every request to this provider waits, not only this one
                hold = policy.throttled(wire.status_code, wire.retry_after, pause)
                if hold is not None:
                    gate.hold(hold, f"HTTP {wire.status_code}")
            if not policy.repeats(declared, verdict) or n >= declared.attempts:
                break
            if wire.retry_after is not None:
                pause = max(pause, wire.retry_after)
            if pause >= self._lease_left(taken):
                sent.tries[-1]["stopped"] = (
                    f"the next try would start after the lease ({pause:g} s pause)"
                )
                break
            self.clock.sleep(pause)
        return sent

    def outcome_move(self, sent: Attempt) -> Move:
        """Where the attempt's tries put the record (``policy.outcome``), not written.
        An attempt that never started (``lapsed`` with no try) is FAILED, never sent."""
        never_started = sent.lapsed and not sent.verdicts
        if never_started:
            sent.tries.append(
                {
                    "try": len(sent.tries) + 1,
                    "verdict": str(ReplyProof.NEVER_SENT),
                    "detail": "not sent: the lease lapsed before the request could start",
                }
            )
            sent.wire = None
        move = policy.outcome(
            sent.claimed,
            sent.declared,
            sent.verdict,
            sent.wire,
            self.clock.now(),
            owner=sent.taken.owner,
            actor=self.actor,
            tries=sent.tries,
            late_send=sent.late_send,
        )
        if never_started:
            why = (
                "never sent: the provider asked for a pause (429/503 Retry-After) that outlasts "
                "the lease"
                if sent.held
                else "never sent: the lease lapsed before the request could start"
            )
            move = with_reason(move, why)
        return move

    def finish(self, sent: Attempt, move: Move, written: ActionRecord | None) -> Report:
        """The report of an attempt whose outcome ``move`` was written (``written``), or
        whose guard failed (None: the lease lapsed and the record moved on; a late
        reply is still written as evidence). A ``LedgerError`` here is the caller's to
        turn into ``not_recorded``."""
        final = written
        if final is None:
            now = from_text(move.at) or self.clock.now()
            final = self._late(sent.claimed, move, sent.verdict, sent.late_send, now)
        elif sent.verdict is ReplyProof.CONFLICT and final.status is Status.AWAITING_VERIFICATION:
            try:
                final = self._verify_now(final)
            except LedgerError:
                pass  # the outcome is recorded; the check runs at its scheduled time
        final = self._kept_callbacks(final)
        reason = str(move.detail.get("reason", ""))
        return Report(Outcome.DISPATCHED, final, RESULT_BY_STATUS.get(final.status), reason)

    def _kept_callbacks(self, record: ActionRecord) -> ActionRecord:
        """Apply the callbacks kept while this outcome was being written (a provider
        that calls back before its reply reaches us). The ledger serialises this with
        the callback's own transaction, so one of the two always sees the other; a
        ledger error here leaves them pending for the next reconciler pass."""
        if record.provider not in self.settings.callbacks:
            return record
        try:
            if self.ledger.match_callbacks(record, policy.callback, now=self.clock.now()):
                return self.ledger.get(record.action_id)
        except LedgerError:
            pass  # the request has left: its report stands; a pass matches them later
        return record

    def _lease_left(self, taken: policy.Claim) -> float:
        return (taken.lease_until - self.clock.now()).total_seconds()

    def not_recorded(self, sent: Attempt, move: Move, exc: LedgerError) -> OutcomeNotRecorded:
        """What a ledger failure after the claim means: "nothing was changed" would be
        false once a request may have left, so the record's status is the answer."""
        claimed = sent.claimed
        cause = str(exc).split("; ")[0]  # what failed, not what it meant for its caller
        lease = claimed.lease_expires_at or move.values.get("lease_expires_at")
        left = bool(sent.verdicts)  # a try started: the request left (or may have)
        what = "the request was sent" if left else "no request left (its lease lapsed first)"
        return OutcomeNotRecorded(
            f"action {claimed.action_id}: {what}, but its outcome could not be recorded "
            f"({cause}); it stays IN_FLIGHT until its lease lapses at {lease}, then "
            "reconciliation settles it",
            claimed.action_id,
            record=claimed,
            sent=left,
        )

    def _late(
        self, claimed: ActionRecord, move: Move, verdict: ReplyProof, late_send: bool, now: datetime
    ) -> ActionRecord:
        """Our lease lapsed and the record moved on: our reply is still evidence."""
        for _ in range(3):  # each guard that fails means the record moved again: look again
            current = self.ledger.get(claimed.action_id)
            late = policy.late_outcome(
                current,
                move,
                verdict,
                now,
                attempt=claimed.attempt,
                actor=self.actor,
                late_send=late_send,
            )
            moved = self.ledger.move(late)
            if moved is not None:
                return moved
        return self.ledger.get(claimed.action_id)

    def _verify_now(self, record: ActionRecord) -> ActionRecord:
        """A conditional-write conflict is never proof (rule 10): read the resource now."""
        from .reconcile import Reconciler

        Reconciler(
            self.ledger, self.registry, clock=self.clock, actor=self.actor, probe=self.probe
        ).run_ids([record.action_id])
        return self.ledger.get(record.action_id)


_NO_GATE = nullcontext()  # reusable: the single path holds no provider slot


def _slot(gate: Gate | None) -> AbstractContextManager[object]:
    return gate.slot() if gate is not None else _NO_GATE


def _try_detail(n: int, wire: WireResult, verdict: ReplyProof) -> dict[str, Any]:
    return {
        "try": n,
        "wire": str(wire.wire),
        "status_code": wire.status_code,
        "verdict": str(verdict),
        "detail": policy.one_line(wire.detail)[:300],
    }


classify = policy.classify  # the one place wire results get their meaning, re-exported

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_LEASE_GRACE",
    "EXISTS",
    "RESULT_BY_STATUS",
    "Attempt",
    "DispatchSettings",
    "Dispatcher",
    "Outcome",
    "ReplyProof",
    "Report",
    "Result",
    "check_params_json",
    "classify",
    "retry_problem",
]
