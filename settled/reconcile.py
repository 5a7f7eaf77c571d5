"""The verifier: settles what dispatch left open, by evidence.

One pass takes the records due when it starts (``next_check_at <= start``) in bounded
batches, each at most once. Leasing a batch (``Ledger.lease_due``) moves each row's
``next_check_at`` forward by the reconciler's lease and stamps ``lease_owner``, so
another reconciler's due scan no longer sees it: two reconcilers never query the same
row for the same due time. A reconciler that dies leaves rows that fall due again
when its lease ends.

The results of a batch are committed together (group commit, ``_Group``): one
durable transaction per batch instead of one per row, at the end of the batch (with
the next batch's lease), or before the next check once the oldest unwritten result is
``flush_after`` seconds old, so slow queries do not hold results back. Each write is
still guarded by status and lease owner. Nothing is reported before its commit:
``on_change`` and ``on_check`` see only what is durable.

What each observation means is ``settled.policy``'s to say (``weigh``, ``judge``);
this module fetches, calls and writes:

- ``IN_FLIGHT`` past its lease: the dispatcher was lost → ``DENIED_UNRESOLVED``.
- ``AWAITING_VERIFICATION``, partial tier: past the window, a person must verify.
- queryable records: the query reads the real effect; applied → ``CONFIRMED``;
  provably not applied → ``FAILED``; anything else → checked again until the
  verification budget is spent → ``DENIED_UNRESOLVED``. Never ``CONFIRMED`` on a budget.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import policy, tracing
from .clock import Clock, freeze_start_up, from_text, plus, to_text
from .crashpoints import Probe, no_probe
from .errors import (
    EffectVisible,
    RecheckFailed,
    SettledError,
    TransitionNotAllowed,
    UnknownProvider,
)
from .model import ActionRecord, Declared, Delivery, Move, Observation, Seen, Status
from .providers.base import OperationSpec, Providers
from .storage import DUE_STATUSES, Ledger
from .throttle import Gate, Gates

DEFAULT_BATCH = 25  # rows one claim leases: the slice daemons sharing a ledger take in turn
DEFAULT_LEASE = 60.0  # s a reconciler holds a row; at least 2 × the query timeout
DEFAULT_FLUSH_AFTER = 0.2  # s an observed result may wait for its batch's commit
DEFAULT_QUERY_HOLD = 1.0  # s a provider is left alone after a 429/503 without Retry-After

log = logging.getLogger("settled.reconcile")

__all__ = ["DUE_STATUSES", "Change", "PassReport", "Recheck", "Reconciler", "why_unchecked"]


@dataclass
class Change:
    """One thing a pass did to one record (a line of the daemon's log)."""

    action_id: str
    from_status: str
    to_status: str
    kind: str
    reason: str
    next_check_at: str | None = None
    at: str | None = None
    seen: str | None = None  # what the check observed, when a check ran
    provider: str = ""
    operation: str = ""
    error: str | None = None  # why this attempt could not check anything (it still counts)
    paused: str = ""  # not checked: what asked for a pause ("HTTP 503"); no attempt

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "action_id": self.action_id,
            "from": self.from_status,
            "to": self.to_status,
            "kind": self.kind,
            "reason": self.reason,
            "next_check_at": self.next_check_at,
            "seen": self.seen,
            "error": self.error,
        }


@dataclass
class PassReport:
    examined: int = 0
    changes: list[Change] = field(default_factory=list)  # status moves
    waiting: list[Change] = field(default_factory=list)  # checked; the next check is scheduled
    skipped: list[Change] = field(default_factory=list)  # not checked, and why
    stopped: bool = False  # stop_requested() ended the pass early; the rest was handed back
    callbacks_expired: int = 0  # kept callbacks that outlived their pending_expiry this pass
    # Providers configured here that could not be built (a missing ${VAR}...): name → why.
    # Their records' checks were attempts that failed; a provider simply not configured
    # here is not one of them (another host has it).
    unusable: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ch in self.changes:
            out[ch.to_status] = out.get(ch.to_status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "examined": self.examined,
            "changes": [c.to_json() for c in self.changes],
            "waiting": [c.to_json() for c in self.waiting],
            "skipped": [c.to_json() for c in self.skipped],
            "counts": self.counts(),
            "stopped": self.stopped,
            "callbacks_expired": self.callbacks_expired,
            "unusable": dict(self.unusable),
        }


@dataclass(frozen=True)
class Recheck:
    """What the check made before a person's "not applied" verdict, or before a retry,
    saw (rule 14). ``found``:

    - ``visible``: the effect is there; the record has settled by that evidence
      (``record`` as it now stands) and the verdict or retry must be refused;
    - ``unclear``: something changed that cannot be attributed; refused;
    - ``impossible``: no check could be made here now (unreachable, unusable, not
      configured here, throttled); refused;
    - ``absent`` (proof of absence), ``not_visible`` (nothing yet): go ahead;
    - ``not_needed``: no query can observe the effect, or nothing was delivered;
    - ``skipped``: the caller said not to check (``--no-recheck``).

    ``note`` says it in words, for the event and the messages; ``queried``: the
    provider was asked."""

    found: str
    note: str
    record: ActionRecord
    queried: bool = False

    @property
    def refuses(self) -> bool:
        return self.found in ("visible", "unclear", "impossible")

    def refusal(self, what: str) -> SettledError:
        """The error that refuses ``what`` ("the verdict", "the retry")."""
        aid = self.record.action_id
        if self.found == "visible":
            by = self.record.confirmed_by or "reconciliation"
            return EffectVisible(
                f"action {aid}: {what} is refused: the check made first sees the effect "
                f"({self.note}); the record is now {self.record.status} (confirmed_by {by})",
                self.record,
            )
        sure = "add --no-recheck only if you are sure nothing was applied"
        if self.found == "unclear":
            return RecheckFailed(
                f"action {aid}: {what} is refused: the check made first cannot tell "
                f"({self.note}); nothing recorded; look at the provider, then {sure}"
            )
        return RecheckFailed(
            f"action {aid}: {what} is refused: the check made first could not be made "
            f"({self.note}); nothing recorded; try again when it can, or {sure}"
        )


class _Group:
    """Check results queued for one durable commit, and what to report once it holds."""

    def __init__(self, ledger: Ledger, flush_after: float) -> None:
        self.ledger = ledger
        self.flush_after = flush_after
        self.moves: list[Move] = []
        self.after: list[Callable[[bool], None]] = []
        self.since = 0.0

    def add(self, move: Move, after: Callable[[bool], None]) -> None:
        if not self.moves:
            self.since = time.monotonic()
        self.moves.append(move)
        self.after.append(after)

    def stale(self) -> bool:
        return bool(self.moves) and time.monotonic() - self.since >= self.flush_after

    def due_in(self) -> float:
        """Seconds until the oldest queued result is due for its commit."""
        return max(0.0, self.since + self.flush_after - time.monotonic())

    def take(self) -> tuple[list[Move], list[Callable[[bool], None]]]:
        taken = (self.moves, self.after)
        self.moves, self.after = [], []
        return taken

    def flush(self) -> None:
        moves, after = self.take()
        for held, report in zip(self.ledger.commit(moves), after, strict=True):
            report(held)


@dataclass
class _Job:
    """One leased record whose check is a query."""

    rec: ActionRecord
    declared: Declared
    owner: str
    gate: Gate


class Reconciler:
    """Runs passes over due records (``run_due``) or checks given ones now (``run_ids``).

    ``clock`` defaults to the ledger's. ``on_change(Change)`` is called for every
    status move and ``on_check(Change)`` for every check that moved nothing, each
    after the commit that made it durable. ``stop_requested()`` is asked before each
    record. ``probe`` is a crash-point hook for tests.

    ``concurrency`` > 1 runs a batch's queries from that many threads, at most
    ``limits[provider]`` (its ``max_in_flight``) at once to one provider; deciding and
    writing stay on the calling thread, grouped as in a pass in turn. A provider that
    answers a query with 429 or 503 is left alone for its Retry-After (or
    ``DEFAULT_QUERY_HOLD``): the rows of the batch still waiting for it are put back
    to that time, their budget unspent."""

    def __init__(  # noqa: PLR0913  (options, all defaulted, as httpx.Client's are)
        self,
        ledger: Ledger,
        registry: Providers,
        clock: Clock | None = None,
        actor: str = "reconciler",
        batch: int = DEFAULT_BATCH,
        lease: float = DEFAULT_LEASE,
        on_change: Callable[[Change], None] | None = None,
        on_check: Callable[[Change], None] | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
        flush_after: float = DEFAULT_FLUSH_AFTER,
        probe: Probe = no_probe,
        concurrency: int = 1,
        limits: Mapping[str, int] | None = None,
        hold: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.clock = clock if clock is not None else ledger.clock()
        self.actor = actor
        self.batch = batch
        self.lease = lease
        self.on_change = on_change
        self.on_check = on_check
        self.stop_requested = stop_requested
        self.flush_after = flush_after
        self.probe = probe
        self.concurrency = max(1, concurrency)
        # A heartbeat's lease (a daemon's interval): on a ledger threads may share, each
        # slice is leased for ``hold`` s and renewed by a thread of its own while the
        # pass holds it, so a killed daemon's slice is due again within ``hold``.
        self.hold = hold if hold is not None and ledger.thread_safe else None
        self.gates = Gates(limits)
        self._specs: dict[tuple[str, str], tuple[OperationSpec | None, str]] = {}
        self._today: dict[tuple[str, str], tuple[Declared | None, str]] = {}  # per pass
        self._unusable: dict[str, str] = {}  # per pass: providers that could not be built

    # ------------------------------------------------------------ passes
    def run_due(self, limit: int | None = None) -> PassReport:
        """Settle the records due when the pass starts (at most ``limit``), batch by
        batch. A record is checked at most once per pass: a check that finds nothing
        schedules the next one after the pass's start, so a pass always ends. An
        expired ``IN_FLIGHT`` lease becomes ``DENIED_UNRESOLVED`` and, when it can be
        queried, is checked later in the same pass.

        When ``stop_requested()`` turns true, the check in hand is finished and the
        rest of the batch is handed back (lease released, due time unchanged) so that
        another reconciler takes it at once."""
        report = PassReport()
        self._new_pass()
        group = _Group(self.ledger, self.flush_after)
        cutoff = to_text(self.clock.now())
        taken = 0
        self._sweep_callbacks(report)  # evidence first: a kept callback may settle a row due now
        lease = self.lease if self.hold is None else self.hold
        beat = None if self.hold is None else _Heartbeat(self.ledger, self.clock, self.hold)

        def lease_next() -> tuple[list[ActionRecord], str] | None:
            """Lease the next batch (committing the results in hand with it)."""
            nonlocal taken
            if limit is not None and taken >= limit:
                return None
            if self.stop_requested():
                report.stopped = True
                return None
            size = self.batch if limit is None else min(self.batch, limit - taken)
            now = self.clock.now()
            owner = "r-" + uuid.uuid4().hex
            pending, after = group.take()  # the previous batch's results: one commit for both
            batch = self.ledger.lease_due(
                now=now,
                cutoff=cutoff,
                size=size,
                owner=owner,
                until=(until := to_text(plus(now, lease))),
                expire=self._expire_at(now),
                pending=pending,
            )
            if beat is not None and batch.leased:
                beat.hold(owner, until)
            for held, tell in zip(batch.committed, after, strict=True):
                tell(held)
            for rec, m in batch.expired:
                report.examined += 1
                self._note_move(report, m, True, rec=rec)
            for rec, _ in batch.expired:  # a callback kept while it was in flight settles it now
                self._match_kept(rec.action_id, report)
            taken += len(batch.expired) + len(batch.leased)
            if not batch.selected:
                return None
            return batch.leased, owner

        try:
            if beat is not None:
                beat.start()
            if self.concurrency > 1:
                self._check_concurrently(lease_next, report, group)
            else:
                while (leased := lease_next()) is not None:
                    self._check_in_turn(*leased, report, group)
                    if report.stopped:
                        break
        finally:
            try:
                group.flush()
            finally:
                if beat is not None:
                    beat.stop()
            report.unusable = dict(self._unusable)
        freeze_start_up()
        return report

    def _match_kept(self, action_id: str, report: PassReport) -> None:
        rec = self.ledger.find(action_id)
        if rec is None:
            return
        for move in self.ledger.match_callbacks(rec, policy.callback, now=self.clock.now()):
            self._note_move(report, move, True, rec=rec)

    def _sweep_callbacks(self, report: PassReport) -> None:
        """Kept callbacks (rule 16) whose record can take them now: one whose outcome
        was written by a dispatcher that did not match it, one whose record got the
        object id it names (a late reply, a person's ``--object-id``) or left
        ``IN_FLIGHT`` by its lease. One bounded batch per pass, before the due rows (a
        callback that settles one spares it a query or a person); the rest next pass."""
        sweep = self.ledger.sweep_callbacks(policy.callback, now=self.clock.now(), size=self.batch)
        report.callbacks_expired += sweep.expired
        for _, move in sweep.matched:
            rec = self.ledger.find(move.action_id)
            if rec is not None:
                self._note_move(report, move, True, rec=rec)

    def _new_pass(self) -> None:
        """Declarations are looked up once per operation and pass."""
        self._specs.clear()
        self._today.clear()
        self._unusable.clear()

    def _check_in_turn(
        self, leased: list[ActionRecord], owner: str, report: PassReport, group: _Group
    ) -> None:
        for i, rec in enumerate(leased):
            if self.stop_requested():
                report.stopped = True
                group.flush()
                self.ledger.hand_back(leased[i:], owner=owner)
                return
            if group.stale():
                group.flush()
            report.examined += 1
            self._check(rec, owner, report, group)

    def _check_concurrently(
        self,
        lease_next: Callable[[], tuple[list[ActionRecord], str] | None],
        report: PassReport,
        group: _Group,
    ) -> None:
        """The pass's queries from ``concurrency`` threads, at most a provider's
        ``max_in_flight`` at once to it; deciding and writing stay on this thread, in
        the same group commits as a pass in turn (see ``_Fanout``)."""
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="settled-check") as pool:
            fan = _Fanout(self, pool, lease_next, report, group, self._steps())
            fan.run()
        fan.hand_back_unchecked()
        if fan.failure is not None:
            raise fan.failure

    def run_ids(self, action_ids: Iterable[str]) -> PassReport:
        """Check these records now, whatever their schedule. Unknown ids raise
        ``NotFound`` before anything is checked. With ``concurrency`` > 1 their queries
        run from that many threads, as a pass's do (``_check_concurrently``)."""
        ids = list(dict.fromkeys(action_ids))
        for aid in ids:
            self.ledger.get(aid)
        report = PassReport()
        self._new_pass()
        if self.concurrency > 1 and len(ids) > 1:
            self._ids_concurrently(ids, report)
            report.unusable = dict(self._unusable)
            return report
        for aid in ids:
            if self.stop_requested():
                report.stopped = True
                break
            report.examined += 1
            self._check_one(aid, report)
        report.unusable = dict(self._unusable)
        return report

    def _ids_concurrently(self, ids: list[str], report: PassReport) -> None:
        """``run_ids`` from threads: the records are admitted (and leased) a few at a
        time on this thread, as a pass leases its batches, so no query waits for the
        whole list to be leased."""
        group = _Group(self.ledger, self.flush_after)
        left = deque(ids)

        def lease_next() -> tuple[list[ActionRecord], str] | None:
            if not left:
                return None
            if self.stop_requested():
                report.stopped = True
                return None
            owner = "r-" + uuid.uuid4().hex
            admitted: list[ActionRecord] = []
            while left and len(admitted) < 2 * self.concurrency:
                rec = self._admit(left.popleft(), report, owner)
                if rec is None:
                    report.examined += 1  # looked at, left alone (said why) or expired only
                else:
                    admitted.append(rec)  # counted when its check starts
            return admitted, owner

        try:
            self._check_concurrently(lease_next, report, group)
        finally:
            group.flush()

    def _check_one(self, aid: str, report: PassReport) -> None:
        owner = "r-" + uuid.uuid4().hex
        rec = self._admit(aid, report, owner)
        if rec is None:
            return
        group = _Group(self.ledger, self.flush_after)
        self._check(rec, owner, report, group)
        group.flush()

    def _admit(self, aid: str, report: PassReport, owner: str) -> ActionRecord | None:
        """The record, leased to ``owner`` for a check now; or None when it is left
        alone (``why_unchecked``: the reason is in ``report.skipped``), another
        reconciler holds it, or its lapsed dispatch lease was all there was to settle."""
        rec = self.ledger.get(aid)
        now = self.clock.now()
        for move in self.ledger.match_callbacks(rec, policy.callback, now=now):
            self._note_move(report, move, True, rec=rec)  # kept callbacks first: evidence
            rec = self.ledger.get(aid)
        why = why_unchecked(rec, now)
        if why:
            self._skip(report, rec, why)
            return None
        if rec.status is Status.IN_FLIGHT:  # its dispatch lease has lapsed
            expire = self._expire_at(now)(rec)
            self._note_move(report, expire, self.ledger.move(expire), rec=rec)
            rec = self.ledger.get(aid)
            due = from_text(rec.next_check_at)
            if rec.status is not Status.DENIED_UNRESOLVED or due is None or due > now:
                return None
            why = why_unchecked(rec, now)
            if why:
                self._skip(report, rec, why)
                return None
        if not self.ledger.lease_one(
            rec, owner=owner, until=to_text(plus(now, self.lease)), now=to_text(now)
        ):
            self._skip(report, rec, "another reconciler holds it")
            return None
        rec.lease_owner = owner
        return rec

    # ------------------------------------------------------------ rule 14
    def recheck(self, rec: ActionRecord, now: datetime, *, asked: str) -> Recheck:
        """One more check of ``rec`` before a person's "not applied" verdict on it is
        recorded, or before ``retry`` opens a new attempt (rule 14): the same query,
        weighed by the same policy as any check (``weigh``: an absence before the
        request could land proves nothing). When it sees the effect, the record
        settles by that evidence here (``policy.by_evidence``); nothing else is
        written: the caller records the verdict or the retry with ``note``, or is
        refused. ``asked`` names who asked (the event says it)."""
        ready = self._recheck_job(rec)
        if isinstance(ready, Recheck):
            return ready
        return self._recheck_seen(ready, self._recheck_query(ready), now, asked)

    def recheck_many(
        self, records: list[ActionRecord], now: datetime, *, asked: str, pool: Executor
    ) -> list[Recheck]:
        """``recheck`` for many records: the queries from ``pool``, everything else
        (deciding, writing) on this thread. One result per record, in order."""
        ready = [self._recheck_job(rec) for rec in records]
        jobs = [r for r in ready if isinstance(r, _Job)]
        seen = dict(zip((id(j) for j in jobs), pool.map(self._recheck_query, jobs), strict=True))
        return [
            r if isinstance(r, Recheck) else self._recheck_seen(r, seen[id(r)], now, asked)
            for r in ready
        ]

    def _recheck_job(self, rec: ActionRecord) -> Recheck | _Job:
        """What checking ``rec`` before a verdict takes: nothing (not needed, or not
        possible here, the answer), or a query (the job)."""
        declared, problem = self._declared(rec)
        why_not = policy.recheck_needed(rec, declared)
        if why_not and rec.status is Status.FAILED and rec.delivery is not Delivery.FAILED:
            # No query can check it, so a retry rests on what made it FAILED: only a
            # final answer lets it go without a person's --no-recheck (rule 20).
            basis = self._failed_by(rec)
            if basis is None:
                return Recheck(
                    "impossible",
                    "its FAILED rests on no final answer of the provider (recorded before "
                    "settled kept what a failure rests on, or an error that may come after "
                    f"the effect) and {why_not}",
                    rec,
                )
            return Recheck("not_needed", f"not needed: {why_not}; FAILED on {basis}", rec)
        if why_not:
            return Recheck("not_needed", f"not needed: {why_not}", rec)
        spec, spec_problem = self._spec(rec)
        if declared is None or spec is None or not spec.queryable:
            why = (
                problem
                or spec_problem
                or (f"the current config of {rec.provider}.{rec.operation} has no query")
            )
            return Recheck("impossible", why, rec)
        return _Job(rec, declared, "", self.gates[rec.provider])

    def _failed_by(self, rec: ActionRecord) -> str | None:
        """What ``rec``'s FAILED status rests on (``policy.rests_on``): its last event
        that made it FAILED."""
        for event in reversed(self.ledger.events(rec.action_id)):
            if event.to_status == Status.FAILED and event.from_status != Status.FAILED:
                return policy.rests_on(event)
        return None

    def _recheck_query(self, job: _Job) -> Observation | None:
        """The query (any thread); None when the provider's pause is not over."""
        if job.gate.closed_for() > 0:
            return None
        self.probe("before_check")
        with job.gate.slot(), _check_span(job.rec, "verdict") as s:
            obs = self.registry.provider(job.rec.provider).query(policy.target_for(job.rec))
            tracing.note(s, **{"settled.outcome": _seen(obs)})
            return obs

    def _recheck_seen(
        self, job: _Job, obs: Observation | None, now: datetime, asked: str
    ) -> Recheck:
        """What the observation means for the verdict or retry (this thread)."""
        rec, declared = job.rec, job.declared
        if obs is None:
            return Recheck("impossible", f"{rec.provider} asked for a pause (429/503)", rec)
        hold = _hold(obs)
        if hold is not None:
            job.gate.hold(hold, _answered(obs))
            return Recheck(
                "impossible", f"{rec.provider} asked for a pause: {obs.detail}", rec, queried=True
            )
        error = policy.check_error(obs)
        if error is not None:
            return Recheck("impossible", error, rec, queried=True)
        rivals: list[str] = []
        if obs.seen is Seen.APPLIED and declared.snapshots and not declared.carries_key:
            rivals = self.ledger.rivals(rec)
        obs = policy.weigh(rec, declared, obs, now, rivals)
        note = str(obs.seen) + (f" ({policy.one_line(obs.detail)[:200]})" if obs.detail else "")
        if obs.seen is Seen.APPLIED:
            moved = self.ledger.move(
                policy.by_evidence(rec, declared, obs, now, actor=self.actor, asked=asked)
            )
            if moved is None:
                current = self.ledger.get(rec.action_id)
                raise TransitionNotAllowed(
                    f"action {rec.action_id} changed to {current.status} while it was being "
                    "checked; see `settled show`"
                )
            return Recheck("visible", note, moved, queried=True)
        if obs.seen is Seen.AMBIGUOUS:
            return Recheck("unclear", note, rec, queried=True)
        found = "absent" if obs.seen is Seen.NOT_APPLIED else "not_visible"
        return Recheck(found, note, rec, queried=True)

    # ------------------------------------------------------------ checking
    def _expire_at(self, now: datetime) -> Callable[[ActionRecord], Move]:
        def expire(rec: ActionRecord) -> Move:
            declared, _ = self._declared(rec)
            _, problem = self._spec(rec)
            if rec.provider in self._unusable:
                # Configured here but broken: its checks are attempts that fail, and
                # they count (rule 15), so the budget starts now as for any record.
                problem = ""
            return policy.expire(
                rec, declared, now, actor=self.actor, problem=problem, recheck=self.lease
            )

        return expire

    def _spec(self, rec: ActionRecord) -> tuple[OperationSpec | None, str]:
        """Today's declaration of the record's operation, or None and why (not
        configured here, or its provider section is wrong): such a record waits, it
        is never guessed about."""
        key = (rec.provider, rec.operation)
        found = self._specs.get(key)
        if found is None:
            try:
                found = (self.registry.operation(rec.provider, rec.operation), "")
            except UnknownProvider:
                found = (None, f"provider {rec.provider}.{rec.operation} is not configured here")
            except SettledError as exc:
                found = (None, f"provider {rec.provider} cannot be used: {exc}")
                self._unusable[rec.provider] = found[1]
            self._specs[key] = found
        return found

    def _declared(self, rec: ActionRecord) -> tuple[Declared | None, str]:
        """The declarations that govern ``rec`` (rule 11): stored with it, else today's."""
        if rec.declared is not None:
            return rec.declared, ""
        key = (rec.provider, rec.operation)
        found = self._today.get(key)
        if found is None:
            spec, problem = self._spec(rec)
            found = self._today[key] = ((Declared.of(spec) if spec is not None else None), problem)
        return found

    def _check(self, rec: ActionRecord, owner: str, report: PassReport, group: _Group) -> None:
        job = self._prepare(rec, owner, report, group)
        if job is not None:
            self._conclude(job, self._query(job), report, group)

    def _prepare(
        self, rec: ActionRecord, owner: str, report: PassReport, group: _Group
    ) -> _Job | None:
        """Decide what checking ``rec`` takes: a query (the job), or a move queued now."""
        now = self.clock.now()
        if rec.requires_manual_verification:
            self._queue(
                report, group, rec, policy.needs_person(rec, now, owner=owner, actor=self.actor)
            )
            return None
        declared, problem = self._declared(rec)
        spec, spec_problem = self._spec(rec)
        if declared is not None and not declared.queryable:
            why = "no query can observe this effect; needs a person"
            self._queue(
                report,
                group,
                rec,
                policy.unresolved(rec, now, why, {}, owner=owner, actor=self.actor),
            )
            return None
        if declared is not None and spec is None and rec.provider in self._unusable:
            # Configured here, but it cannot even be built (a ${VAR} missing from this
            # environment): a check that failed. It counts (rule 15), so that a broken
            # verifier reaches the queue instead of waiting for ever.
            broken = Observation(
                Seen.UNKNOWN, detail=spec_problem, evidence={"error": "provider_unusable"}
            )
            move = policy.judge(rec, declared, broken, now, owner=owner, actor=self.actor)
            self._queue(report, group, rec, move, str(Seen.UNKNOWN))
            return None
        if declared is None or spec is None or not spec.queryable:
            # The query that verifies it is not available here now (another host has the
            # provider, or the config changed): wait, without spending its budget.
            why = (
                problem
                or spec_problem
                or (
                    f"the current config of {rec.provider}.{rec.operation} has no query; "
                    f"it was recorded as {rec.tier}"
                )
            )
            until = plus(now, self.lease)
            self._queue(report, group, rec, policy.wait_again(rec, now, until, why, owner=owner))
            return None
        return _Job(rec, declared, owner, self.gates[rec.provider])

    def _steps(self) -> _Steps:
        return _Steps(self._prepare, self._query, self._conclude)

    def _query(self, job: _Job) -> Observation | None:
        """The query (any thread): None when the provider asked for a pause, before
        or in its answer (429/503): no attempt was made, and none is counted."""
        if job.gate.closed_for() > 0:
            return None
        self.probe("before_check")
        with job.gate.slot(), _check_span(job.rec, "reconcile") as s:
            obs = self.registry.provider(job.rec.provider).query(policy.target_for(job.rec))
            tracing.note(s, **{"settled.outcome": _seen(obs)})
        hold = _hold(obs)
        if hold is not None:
            job.gate.hold(hold, _answered(obs))  # every query to it waits, not only this row's
            return None
        return obs

    def _conclude(
        self, job: _Job, obs: Observation | None, report: PassReport, group: _Group
    ) -> None:
        """What the observation proves (``policy.weigh``, ``policy.judge``), queued for
        the group commit (the writing thread)."""
        rec, declared = job.rec, job.declared
        now = self.clock.now()
        if obs is None:
            until = plus(now, max(job.gate.closed_for(), 0.001))
            answered = job.gate.why or "429/503"
            why = f"{rec.provider} asked for a pause ({answered}); checked after {to_text(until)}"
            error = {"check_error": policy.paused(rec.provider, answered)}
            move = policy.wait_again(rec, now, until, why, owner=job.owner, extra=error)
            self._queue(report, group, rec, move, paused=answered)
            return
        rivals: list[str] = []
        if obs.seen is Seen.APPLIED and declared.snapshots and not declared.carries_key:
            # Attributed by snapshot diff alone: another action asking for the same
            # change could have made it, and the diff cannot tell which one did.
            rivals = self.ledger.rivals(rec)
        obs = policy.weigh(rec, declared, obs, now, rivals)
        move = policy.judge(rec, declared, obs, now, owner=job.owner, actor=self.actor)
        self._queue(report, group, rec, move, str(obs.seen))

    # ------------------------------------------------------------ results
    def _queue(
        self,
        report: PassReport,
        group: _Group,
        rec: ActionRecord,
        move: Move,
        seen: str | None = None,
        *,
        paused: str = "",
    ) -> None:
        def after(held: bool) -> None:
            if move.kind is None:
                if held:
                    ch = _change(rec, move, seen, "waiting")
                    ch.paused = paused
                    report.waiting.append(ch)
                    if self.on_check is not None:
                        self.on_check(ch)
            else:
                self._note_move(report, move, held, seen, rec=rec)

        group.add(move, after)

    def _note_move(
        self,
        report: PassReport,
        move: Move,
        held: object,
        seen: str | None = None,
        *,
        rec: ActionRecord,
    ) -> None:
        """Report a move that is now durable (``held``: its guard held)."""
        if held is None or held is False:
            return
        ch = _change(rec, move, seen, str(move.kind))
        ch.reason = str(move.detail.get("reason") or move.values.get("reason") or "")
        report.changes.append(ch)
        if self.on_change is not None:
            self.on_change(ch)

    def _skip(self, report: PassReport, rec: ActionRecord, why: str) -> None:
        report.skipped.append(
            Change(
                rec.action_id,
                str(rec.status),
                str(rec.status),
                "skipped",
                why,
                rec.next_check_at,
                to_text(self.clock.now()),
                provider=rec.provider,
                operation=rec.operation,
            )
        )


def why_unchecked(rec: ActionRecord, now: datetime) -> str:
    """Why checking ``rec`` now would leave it alone ("" when it would be checked, or
    its lapsed dispatch lease expired first): what ``run_ids`` does, asked without
    writing anything (a command's preview asks it too)."""
    if rec.status is Status.IN_FLIGHT:
        expires = from_text(rec.lease_expires_at)
        if expires is not None and expires > now:
            return f"dispatch in progress; lease until {rec.lease_expires_at}"
        return ""
    if rec.status not in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED):
        return f"nothing to reconcile: {rec.status}"
    if rec.requires_manual_verification:
        if rec.status is Status.DENIED_UNRESOLVED:
            return "needs a person: `settled resolve`"
        eligible = from_text(rec.eligible_at)
        if eligible is not None and eligible > now:
            return f"partial tier: a person verifies it; it joins the queue at {rec.eligible_at}"
    return ""


def _change(rec: ActionRecord, move: Move, seen: str | None, kind: str) -> Change:
    return Change(
        rec.action_id,
        str(move.frm),
        str(move.to),
        kind,
        str(move.values.get("reason") or ""),
        move.values.get("next_check_at"),
        move.at,
        seen,
        rec.provider,
        rec.operation,
        move.values.get("check_error"),
    )


def _check_span(rec: ActionRecord, why: str) -> AbstractContextManager[Any]:
    """The ``settled.check`` span of one query about ``rec`` (``why``: a reconciliation
    pass, or the check before a verdict or a retry)."""
    named = tracing.record(rec.action_id, rec.provider, rec.operation, rec.tier)
    return tracing.span("settled.check", {**named, "settled.check": why})


def _seen(obs: Observation) -> str:
    """A check's outcome on its span: what it saw, or ``paused`` (429/503)."""
    return "paused" if _hold(obs) is not None else str(obs.seen)


def _answered(obs: Observation) -> str:
    """The answer that asked for a pause, as the log and the record name it."""
    code = obs.evidence.get("status_code")
    return f"HTTP {code}" if isinstance(code, int) else "429/503"


def _hold(obs: Observation) -> float | None:
    """How long a query's answer asks us to leave its provider alone (429/503), or None."""
    code = obs.evidence.get("status_code")
    return policy.throttled(
        code if isinstance(code, int) else None,
        getattr(obs, "retry_after", None),
        DEFAULT_QUERY_HOLD,
    )


@dataclass(frozen=True)
class _Steps:
    """The steps of checking one record, which a concurrent pass (``_Fanout``) drives:
    ``prepare`` on the pass's thread, ``query`` on the pool, ``conclude`` on the pass's
    thread again (``Reconciler._prepare``, ``_query`` and ``_conclude``)."""

    prepare: Callable[[ActionRecord, str, PassReport, _Group], _Job | None]
    query: Callable[[_Job], Observation | None]
    conclude: Callable[[_Job, Observation | None, PassReport, _Group], None]


class _Heartbeat:
    """Renews the slices a pass holds (``Ledger.renew_leases``), every fifth of
    ``hold``, from a thread of its own (a ledger threads may share: PostgreSQL), so
    that a slice is held while its holder lives, however long its checks take, and due
    again within ``hold`` of its holder's death. A renewal that fails is retried at the
    next beat; a slice not renewed in time may be checked by another reconciler, whose
    lease then refuses this one's writes (each is guarded by its lease owner): a check
    repeated, never a result written twice or a request sent."""

    def __init__(self, ledger: Ledger, clock: Clock, hold: float) -> None:
        self.ledger = ledger
        self.clock = clock
        self.every = hold / 5
        self.hold_for = hold
        self._held: dict[str, str] = {}  # owner -> the time its slice's lease runs to
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="settled-lease", daemon=True)

    def hold(self, owner: str, until: str) -> None:
        with self._lock:
            self._held[owner] = until

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                held = list(self._held.items())
            if not held:
                continue
            until = to_text(plus(self.clock.now(), self.hold_for))
            try:
                still = self.ledger.renew_leases(held, until=until)
            except SettledError as exc:
                log.warning("could not renew the check leases, retrying: %s", exc)
                continue
            with self._lock:
                for owner, n in still.items():
                    if n:
                        self._held[owner] = until
                    else:  # every row of that slice was written or handed back
                        self._held.pop(owner, None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


class _Fanout:
    """One concurrent pass's bookkeeping. This thread leases rows, prepares each one
    (judging what needs no query), starts its query on the pool when its provider has
    a free slot, and concludes each observation as it comes back. The next batch is
    leased as soon as the last one has no row left to start, so the threads are not
    left idle while a batch's slowest queries finish. Rows not checked when the pass
    stops (or a query raised) are handed back, due again at once."""

    def __init__(
        self,
        owner: Reconciler,
        pool: ThreadPoolExecutor,
        lease_next: Callable[[], tuple[list[ActionRecord], str] | None],
        report: PassReport,
        group: _Group,
        steps: _Steps,
    ) -> None:
        self.r = owner
        self.steps = steps
        self.pool = pool
        self.lease_next = lease_next
        self.report = report
        self.group = group
        self.done: queue.SimpleQueue[tuple[_Job, Observation | BaseException | None]] = (
            queue.SimpleQueue()
        )
        self.rows: deque[tuple[ActionRecord, str]] = deque()  # leased, not yet looked at
        self.backlog: dict[str, deque[_Job]] = {}  # waiting for a provider's free slot
        self.running: dict[str, int] = {}
        self.total = 0
        self.exhausted = False
        self.failure: BaseException | None = None
        # A query waits in the pool's queue while this thread leases the next batch or
        # writes a group: twice as many started as there are threads keeps them busy.
        # A provider's limit counts queries started, so it never has more in flight.
        self.ahead = 2 * owner.concurrency

    def run(self) -> None:
        while True:
            self._start_backlog()
            self._fill()
            if self.total == 0:
                return
            timeout = self.group.due_in() if self.group.moves else None
            try:
                job, obs = self.done.get(timeout=timeout)
            except queue.Empty:
                self.group.flush()
                continue
            self.total -= 1
            self.running[job.rec.provider] -= 1
            if isinstance(obs, BaseException):
                self.failure = self.failure or obs
            else:
                self.steps.conclude(job, obs, self.report, self.group)
            if self.group.stale():
                self.group.flush()

    def _going(self) -> bool:
        return self.failure is None and not self.report.stopped

    def _free(self, provider: str) -> bool:
        cap = self.r.gates.limit(provider) or self.ahead
        return self.total < self.ahead and self.running.get(provider, 0) < cap

    def _start(self, job: _Job) -> None:
        self.running[job.rec.provider] = self.running.get(job.rec.provider, 0) + 1
        self.total += 1
        self.pool.submit(self._query, job)

    def _query(self, job: _Job) -> None:
        try:
            self.done.put((job, self.steps.query(job)))
        except BaseException as exc:  # handed to the pass's thread, which raises it
            self.done.put((job, exc))

    def _start_backlog(self) -> None:
        for waiting in self.backlog.values():
            while waiting and self._free(waiting[0].rec.provider) and self._going():
                self._start(waiting.popleft())

    def _fill(self) -> None:
        """Start queries until ``ahead`` are in flight or no row is left."""
        while self.total < self.ahead and self._going():
            if (
                len(self.rows) < self.r.concurrency
                and not self.exhausted
                and not any(self.backlog.values())
            ):
                leased = self.lease_next()
                if leased is None:
                    self.exhausted = True
                else:
                    self.rows.extend((rec, leased[1]) for rec in leased[0])
                continue
            if not self.rows:
                return
            if self.r.stop_requested():
                self.report.stopped = True
                return
            rec, owner = self.rows.popleft()
            self.report.examined += 1
            job = self.steps.prepare(rec, owner, self.report, self.group)
            if job is None:
                continue
            if self._free(rec.provider):
                self._start(job)
            else:
                self.backlog.setdefault(rec.provider, deque()).append(job)

    def hand_back_unchecked(self) -> None:
        rest = [(job.rec, job.owner) for waiting in self.backlog.values() for job in waiting]
        self.report.examined -= len(rest)
        rest += list(self.rows)
        if not rest:
            return
        self.group.flush()
        owners: dict[str, list[ActionRecord]] = {}
        for rec, owner in rest:
            owners.setdefault(owner, []).append(rec)
        for owner, recs in owners.items():
            self.r.ledger.hand_back(recs, owner=owner)
