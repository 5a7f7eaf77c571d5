"""Stateful property test: Hypothesis drives random interleavings of dispatch, confirm,
reconcile, resolve, retry, time passing (lease expiry, verification budgets) and
crashes against the real sim provider, and checks the invariants after every step.

In process, with a FakeClock injected into the Dispatcher and the Reconciler. A crash is
modelled by a provider wrapper that raises a BaseException the core does not catch
(``SimulatedCrash``) before or after the real request, or inside a reconciler's query:
the claim and lease it leaves are exactly what a killed process leaves. The real-process
SIGKILL proofs are in ``test_rel_crash_points.py``.

Budget: ``SETTLED_TEST_BUDGET`` multiplies the number of examples. At budget 1 the run
is derandomized (the same examples on every CI run); above 1 it explores new ones.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pg_schemas as pg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from invariants import (
    budget,
    check,
    contradictions_block_retry,
    no_second_effect_after_a_verdict,
    scaled,
)

from settled import Ledger
from settled.clock import FakeClock, SteadyClock
from settled.crashpoints import no_probe
from settled.dispatch import Dispatcher, DispatchSettings, Outcome
from settled.errors import Conflict, EffectVisible, RecheckFailed, TransitionNotAllowed
from settled.model import Status
from settled.providers import Registry
from settled.providers.base import Observation, OperationSpec, QueryTarget, Request, WireResult
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler
from settled.resolve import resolve

pytestmark = pytest.mark.slow(seconds=95)

OPS = ("book", "send", "deliver", "notify", "set")
FAULTS = (
    "ok",
    "ok",
    "lost_after_accept",
    "bounce",
    "reject",
    "drop",
    "5xx_before",
    "5xx_after",
    "reset_after_apply",
    "timeout_after_apply",
    "garbage",
    "http:429",
    "http:799",
    "lag:30",  # applied, but not visible within any test
)
TIMEOUT = 0.1  # s per request: a hanging fault costs this much real time

STATS: Counter[str] = Counter()


class SimulatedCrash(BaseException):
    """The process died here (not an Exception: nothing in the core may catch it)."""


class Crashy:
    """Wraps the sim provider; ``arm`` makes the next call die before or after the
    real request, or during a reconciler's query."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.mode: str | None = None
        self.during_send: Any = None  # a callable run while the request is "in flight"
        self.after_reply: Any = None  # run once the reply is in, before its outcome commits
        self.last: WireResult | None = None  # what the last request did on the wire

    def operations(self) -> Mapping[str, OperationSpec]:
        return self.inner.operations()  # type: ignore[no-any-return]

    def execute(self, request: Request) -> WireResult:
        mode, self.mode = self.mode, None
        if mode == "before_send":
            raise SimulatedCrash(mode)
        if self.during_send is not None:
            hook, self.during_send = self.during_send, None
            hook()
        result: WireResult = self.inner.execute(request)
        self.last = result
        if mode == "after_send":
            raise SimulatedCrash(mode)
        if self.after_reply is not None:
            hook, self.after_reply = self.after_reply, None
            hook()
        return result

    def query(self, target: QueryTarget) -> Observation:
        if self.mode == "in_check":
            self.mode = None
            raise SimulatedCrash("in_check")
        return self.inner.query(target)  # type: ignore[no-any-return]

    def snapshot(self, operation: str, params: Any) -> Any:
        return self.inner.snapshot(operation, params)

    def close(self) -> None:
        self.inner.close()


class FakeHost:
    """A host's two clocks, as the machine drives them: a steady one that only moves
    forward with time, and a wall clock that can also be stepped."""

    def __init__(self) -> None:
        self.steady = 1000.0
        self.wall = datetime(2026, 1, 1, tzinfo=UTC)

    def advance(self, seconds: float) -> None:
        self.steady += seconds
        self.wall += timedelta(seconds=seconds)

    def step(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)

    def process_clock(self, anchor: tuple[datetime, float]) -> SteadyClock:
        """The clock a process on this host gets: the boot's anchor, then steady time."""
        return SteadyClock(*anchor, source=lambda: self.steady, system=lambda: self.wall)


class HostClock(FakeClock):
    """The FakeClock API the rules use, over a FakeHost's steady clock."""

    def __init__(self, host: FakeHost, anchor: tuple[datetime, float]) -> None:
        self.host = host
        self.inner = host.process_clock(anchor)

    def now(self) -> datetime:
        return self.inner.now()

    def sleep(self, seconds: float) -> None:
        self.host.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.host.advance(seconds)


class LedgerMachine(RuleBasedStateMachine):
    server: dict[bool, SimServer]
    client: httpx.Client
    backend = "sqlite"  # or "postgres": a fresh schema per example

    actions = Bundle("actions")

    def __init__(self) -> None:
        super().__init__()
        self.host = FakeHost()
        self.anchor = (self.host.wall, self.host.steady)  # this boot's, as the ledger keeps it
        self.clock = HostClock(self.host, self.anchor)
        self.location = ":memory:" if self.backend == "sqlite" else pg.new_schema()
        self.ledger = Ledger.open(self.location)
        self.ids: list[str] = []
        self.params: dict[str, dict[str, Any]] = {}
        self.counter = itertools.count()
        STATS["examples"] += 1

    @initialize(dedupe=st.booleans(), attempts=st.integers(1, 3))
    def setup(self, dedupe: bool, attempts: int) -> None:
        self.dedupe = dedupe
        self.sim = self.server[dedupe]
        self.sim.reset()
        conf = {
            "type": "sim",
            "base_url": self.sim.url,
            "timeout": TIMEOUT,
            "attempts": attempts,
            "dedupe": dedupe,
            "consistency_window": 1.0,
            "verify_interval": 0.5,
            "verify_deadline": 5.0,
        }
        self.registry = Registry({"sim": conf}, source="test", client=self.client)
        self.provider = Crashy(self.registry.provider("sim"))
        self.registry.add(self.provider)
        self._new_processes()

    def _new_processes(self) -> None:
        """A dispatcher and a reconciler as new processes would make them: each reads
        the host's clock from the boot's anchor."""
        self.clock = HostClock(self.host, self.anchor)
        self.dispatcher = Dispatcher(
            self.ledger,
            self.registry,
            clock=self.clock,
            settings=DispatchSettings(lease_grace=2.0, backoff=0.05),
            actor="machine",
        )
        self.reconciler = Reconciler(self.ledger, self.registry, clock=self.clock, lease=3.0)

    def teardown(self) -> None:
        try:
            if hasattr(self, "registry"):
                self._settle_everything()
        finally:
            self.ledger.close()
            if self.location != ":memory:":
                pg.drop(self.location)

    # ---------------------------------------------------------------- helpers
    def _new_id(self) -> str:
        aid = f"s{next(self.counter)}"
        self.ids.append(aid)
        return aid

    def _requests(self) -> int:
        return len(self.sim.truth()["requests"])

    def _status(self, aid: str) -> Status:
        return self.ledger.get(aid).status

    def _settle_everything(self) -> None:
        """Let every lease and budget run out; nothing may be left in flight."""
        for _ in range(40):
            self.clock.advance(10.0)
            self.reconciler.run_due()
            if all(r.next_check_at is None for r in self.ledger.query()):
                break
        pending = {r.action_id for r in self.ledger.query(statuses=["PENDING"])}
        statuses = check(
            self.ledger, self.sim, ids=self.ids, dedupes=self.dedupe, final=True, open_ok=pending
        )
        STATS.update({f"final:{k}": v for k, v in statuses.items()})

    # ---------------------------------------------------------------- rules
    @rule(
        target=actions,
        op=st.sampled_from(OPS),
        faults=st.lists(st.sampled_from(FAULTS), max_size=3),
        later=st.sampled_from([False, False, True]),
    )
    def submit(self, op: str, faults: list[str], later: bool) -> str:
        aid = self._new_id()
        params = {"name": f"n-{aid}", "value": len(faults)}
        self.params[aid] = params
        self.sim.plan(aid, *faults)
        report = self.dispatcher.submit("sim", op, params, action_id=aid, needs_confirmation=later)
        assert report.record is not None
        if later:
            assert report.outcome is Outcome.RECORDED and report.record.status is Status.PENDING
            assert self.sim.requests_for(aid) == []
        else:
            assert report.outcome is Outcome.DISPATCHED
            assert report.record.status not in (Status.PENDING, Status.IN_FLIGHT)
        STATS["submit"] += 1
        return aid

    @rule(aid=actions, same=st.booleans())
    def submit_again(self, aid: str, same: bool) -> None:
        rec = self.ledger.get(aid)
        before = self._requests()
        params = self.params[aid] if same else {**self.params[aid], "other": 1}
        if same:
            report = self.dispatcher.submit(rec.provider, rec.operation, params, action_id=aid)
            assert report.outcome is not Outcome.DISPATCHED
            assert report.record is not None and report.record.status is rec.status
        else:
            with pytest.raises(Conflict):
                self.dispatcher.submit(rec.provider, rec.operation, params, action_id=aid)
        assert self._requests() == before  # an existing id never sends
        STATS["submit_again"] += 1

    @rule(aid=actions)
    def confirm(self, aid: str) -> None:
        before = self._status(aid)
        sent_before = self._requests()
        report = self.dispatcher.confirm(aid)
        expected = {
            Status.CONFIRMED: Outcome.ALREADY_COMPLETED,
            Status.FAILED: Outcome.ALREADY_COMPLETED,
            Status.DENIED_UNRESOLVED: Outcome.BLOCKED,
            Status.PENDING: Outcome.DISPATCHED,
            Status.IN_FLIGHT: Outcome.IN_PROGRESS,
            Status.AWAITING_VERIFICATION: Outcome.IN_PROGRESS,
        }[before]
        assert report.outcome is expected, (before, report.outcome)
        if expected is not Outcome.DISPATCHED:
            assert self._requests() == sent_before
            assert self._status(aid) is before
        STATS[f"confirm:{report.outcome}"] += 1

    @rule()
    def confirm_unknown(self) -> None:
        assert self.dispatcher.confirm("no-such-action").outcome is Outcome.NOT_FOUND

    @rule(aid=actions)
    def retry(self, aid: str) -> None:
        before = self.ledger.get(aid)
        if before.status is not Status.FAILED or before.contradiction:
            sent = self._requests()
            with pytest.raises(TransitionNotAllowed):
                self.dispatcher.retry(aid)
            assert self._requests() == sent and self._status(aid) is before.status
            STATS["retry:refused"] += 1
            return
        sent = self._requests()
        try:
            report = self.dispatcher.retry(aid)
        except RecheckFailed:  # the check first could not tell (a change nobody can attribute)
            assert self._requests() == sent and self._status(aid) is Status.FAILED
            STATS["retry:refused_by_check"] += 1
            return
        except EffectVisible:
            assert self.sim.effects_for(aid) > 0 and self._status(aid) is Status.CONFIRMED
            STATS["retry:effect_visible"] += 1
            return
        assert report.record is not None and report.record.attempt == before.attempt + 1
        assert report.record.idempotency_key == f"{aid}:{before.attempt + 1}"
        STATS["retry:dispatched"] += 1

    def _one_of(self, status: str, data: st.DataObject) -> str | None:
        """One action now in ``status``, or None. The draw is the same whatever the
        ledger holds: which records a step left FAILED or PENDING can depend on timing
        (a reply racing its timeout), and a precondition or a ``sampled_from`` over them
        made Hypothesis replay an example with different draws (FlakyStrategyDefinition)."""
        pick = data.draw(st.integers(0, 63), label="pick")
        ids = [r.action_id for r in self.ledger.query(statuses=[status])]
        return ids[pick % len(ids)] if ids else None

    @rule(data=st.data())
    def retry_a_failed_one(self, data: st.DataObject) -> None:
        aid = self._one_of("FAILED", data)
        if aid is not None:
            self.retry(aid)

    @rule(data=st.data())
    def confirm_a_pending_one(self, data: st.DataObject) -> None:
        aid = self._one_of("PENDING", data)
        if aid is not None:
            self.confirm(aid)

    @rule(aid=actions, who=st.sampled_from(["alice", "bob"]))
    def resolve(self, aid: str, who: str) -> None:
        rec = self.ledger.get(aid)
        applied = self.sim.effects_for(aid) > 0  # a truthful operator
        allowed = (
            rec.status is Status.DENIED_UNRESOLVED
            or (rec.status is Status.AWAITING_VERIFICATION and rec.requires_manual_verification)
            or (rec.terminal and rec.contradiction is not None)
        )
        if not allowed:
            with pytest.raises(TransitionNotAllowed):
                resolve(
                    self.ledger,
                    aid,
                    applied=applied,
                    reason="checked",
                    by=who,
                    now=self.clock.now(),
                    registry=self.registry,
                )
            STATS["resolve:refused"] += 1
            return
        try:
            done = resolve(
                self.ledger,
                aid,
                applied=applied,
                reason="checked by hand",
                by=who,
                now=self.clock.now(),
                evidence="ticket 1",
                registry=self.registry,
            )
        except RecheckFailed:  # the check first could not tell: nothing recorded
            assert self.ledger.get(aid).status is rec.status
            STATS["resolve:refused_by_check"] += 1
            return
        assert done.status is (Status.CONFIRMED if applied else Status.FAILED)
        assert done.contradiction is None
        last = self.ledger.events(aid)[-1]
        kind = "note" if rec.terminal and rec.status is done.status else "resolved"
        assert (last.kind, last.actor) == (kind, f"operator:{who}")
        if applied and kind == "resolved":  # a note leaves who confirmed it as it was
            assert done.confirmed_by == f"operator:{who}"
        STATS["resolve:done"] += 1

    @rule(aid=actions, who=st.sampled_from(["alice", "bob"]))
    def resolve_not_applied_whatever_the_truth(self, aid: str, who: str) -> None:
        """A person under pressure says "not applied" (the incident's bulk resolve). On
        an operation with a query whose effect is applied and visible, the check made
        first refuses it and the record never ends FAILED, so no retry can send it
        twice (rule 14). Effects nobody can see yet (``lag:30``) no check can find:
        those verdicts are the truthful operator's (``resolve``)."""
        rec = self.ledger.get(aid)
        applied = [r for r in self.sim.requests_for(aid) if r["applied"]]
        queryable = rec.declared is not None and rec.declared.queryable
        if not applied or not queryable or any(r["fault"].startswith("lag") for r in applied):
            return
        with pytest.raises(TransitionNotAllowed) as refused:
            resolve(
                self.ledger,
                aid,
                applied=False,
                reason="not seen",
                by=who,
                now=self.clock.now(),
                registry=self.registry,
            )
        after = self.ledger.get(aid)
        assert after.status is not Status.FAILED, (aid, refused.value)
        if isinstance(refused.value, EffectVisible):
            assert after.status is Status.CONFIRMED
        STATS[f"wrong_verdict:{type(refused.value).__name__}"] += 1

    @rule(
        target=actions,
        op=st.sampled_from(["book", "send", "set"]),
        fault=st.sampled_from(["timeout_after_apply", "5xx_after", "reset_after_apply"]),
        retry_too=st.booleans(),
    )
    def a_lost_reply_then_a_wrong_verdict(self, op: str, fault: str, retry_too: bool) -> str:
        """The incident in one step: the reply to an applied send is lost, and a person
        says "not applied" at once (then, maybe, retries): refused, settled by the
        evidence, never sent twice."""
        aid = self._new_id()
        self.params[aid] = {"name": f"n-{aid}", "value": 0}
        self.sim.plan(aid, fault)
        self.dispatcher.submit("sim", op, self.params[aid], action_id=aid)
        if self._status(aid) is not Status.DENIED_UNRESOLVED:  # repeated under its key
            return aid
        try:
            resolve(
                self.ledger,
                aid,
                applied=False,
                reason="bounced?",
                by="carol",
                now=self.clock.now(),
                registry=self.registry,
            )
        except RecheckFailed:
            # The check made first could not be made (its 0.1 s ran out on a loaded
            # machine): the verdict is refused all the same, and nothing is recorded.
            assert self._status(aid) is Status.DENIED_UNRESOLVED
            assert self.sim.effects_for(aid) == 1
            STATS["wrong_verdict:refused_unchecked"] += 1
            return aid
        except EffectVisible:
            pass
        else:
            raise AssertionError(f"{aid}: a wrong verdict was recorded over an applied effect")
        assert self._status(aid) is Status.CONFIRMED
        if retry_too:
            with pytest.raises(TransitionNotAllowed):
                self.dispatcher.retry(aid)
        assert self.sim.effects_for(aid) == 1
        STATS["wrong_verdict:refused_by_the_effect"] += 1
        return aid

    @rule()
    def reconcile_due(self) -> None:
        report = self.reconciler.run_due()
        STATS["reconcile_due"] += 1
        STATS["reconcile_changes"] += len(report.changes)

    @rule(aid=actions)
    def reconcile_one(self, aid: str) -> None:
        self.reconciler.run_ids([aid])
        STATS["reconcile_ids"] += 1

    @rule(seconds=st.sampled_from([0.1, 0.6, 1.5, 4.0, 30.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from([-3600.0, -5.0, 5.0, 3600.0]))
    def clock_steps(self, seconds: float) -> None:
        """The system clock is stepped; processes started afterwards read the same
        ledger time (the boot's anchor plus steady time): nothing is decided by it."""
        before, drift = self.clock.now(), self.clock.inner.drift()
        self.host.step(seconds)
        self._new_processes()
        assert self.clock.now() == before
        assert abs(self.clock.inner.drift() - drift - seconds) < 1e-6
        STATS["clock_step"] += 1

    @rule(
        target=actions, op=st.sampled_from(OPS), fault=st.sampled_from(FAULTS), looked=st.booleans()
    )
    def dispatcher_stalls_past_its_lease(self, op: str, fault: str, looked: bool) -> str:
        """Stopped right after its claim commits, for longer than its lease (Ctrl-Z, a
        paused VM, slow DNS), with or without a reconciler taking the record over
        meanwhile: it never sends, and the record ends FAILED (nothing left)."""
        aid = self._new_id()
        self.params[aid] = {"name": f"n-{aid}", "value": 0}
        self.sim.plan(aid, fault)

        def stall(point: str) -> None:
            if point == "after_claim":
                self.clock.advance(60.0)
                if looked:
                    self.reconciler.run_due()

        self.dispatcher.probe = stall
        try:
            self.dispatcher.submit("sim", op, self.params[aid], action_id=aid)
        finally:
            self.dispatcher.probe = no_probe
        assert self.sim.requests_for(aid) == [], "sent after its lease lapsed"
        assert self._status(aid) is Status.FAILED
        STATS[f"stalled:looked={looked}"] += 1
        return aid

    @rule(aid=actions, where=st.sampled_from(["before_send", "after_send"]))
    def crash_while_dispatching(self, aid: str, where: str) -> None:
        if self._status(aid) is not Status.PENDING:
            return
        self.provider.mode = where
        with pytest.raises(SimulatedCrash):
            self.dispatcher.confirm(aid)
        self.provider.mode = None
        assert self._status(aid) is Status.IN_FLIGHT  # the claim stays, leased
        STATS[f"crash:{where}"] += 1

    @rule(
        target=actions,
        op=st.sampled_from(OPS),
        fault=st.sampled_from(FAULTS),
        where=st.sampled_from(["before_send", "after_send"]),
    )
    def crash_on_submit(self, op: str, fault: str, where: str) -> str:
        aid = self._new_id()
        self.params[aid] = {"name": f"n-{aid}", "value": 0}
        self.sim.plan(aid, fault)
        self.provider.mode = where
        self.provider.last = None
        with pytest.raises(SimulatedCrash):
            self.dispatcher.submit("sim", op, self.params[aid], action_id=aid)
        self.provider.mode = None
        assert self._status(aid) is Status.IN_FLIGHT
        last = self.provider.last
        if where == "after_send" and last is not None and last.written_at is not None:
            # It left: the server has it once its thread reads it, which on a loaded
            # machine can be after the client's 0.1 s gave up on the reply.
            end = time.monotonic() + 10
            while not self.sim.requests_for(aid) and time.monotonic() < end:
                time.sleep(0.01)
            assert len(self.sim.requests_for(aid)) == 1
        else:  # crashed before sending, or nothing could be written
            assert self.sim.requests_for(aid) == []
        STATS[f"crash:{where}"] += 1
        return aid

    @rule(
        target=actions,
        op=st.sampled_from(OPS),
        faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=4),
        repeat=st.booleans(),
        concurrency=st.sampled_from([1, 3]),
        crash=st.sampled_from([None, None, "before_send", "after_send"]),
    )
    def submit_bulk(
        self, op: str, faults: list[str], repeat: bool, concurrency: int, crash: str | None
    ) -> Any:
        """A bulk dispatch (groups of 2): each new line is sent at most once and
        settles past IN_FLIGHT; a line repeating an existing id sends nothing; a crash
        of one send leaves that action claimed and the rest of what was sent written."""
        from settled.bulk import Line

        new = [self._new_id() for _ in faults]
        lines = []
        for n, (aid, fault) in enumerate(zip(new, faults, strict=True), 1):
            self.params[aid] = {"name": f"n-{aid}", "value": n}
            self.sim.plan(aid, fault)
            lines.append(Line(n, aid, self.params[aid]))
        old = [a for a in self.ids if a not in new and self.ledger.get(a).operation == op]
        if repeat and old:
            lines.append(Line(len(lines) + 1, old[0], self.params[old[0]]))
        before_old = {a: len(self.sim.requests_for(a)) for a in old}
        if crash is not None:
            # In turn, so that what a crash leaves recorded (the bundle) is the same on
            # every run of an example: from a pool, how far the claims got is timing.
            concurrency = 1
        d = Dispatcher(
            self.ledger,
            self.registry,
            clock=self.clock,
            settings=DispatchSettings(lease_grace=2.0, backoff=0.05, group=2),
            actor="bulk",
        )
        self.provider.mode = crash
        try:
            results = list(d.submit_many("sim", op, lines, concurrency=concurrency))
        except SimulatedCrash:
            results = None
            STATS[f"bulk_crash:{crash}"] += 1
            # The crash stopped the run: a later group was never claimed, and never sent.
            for aid in [a for a in new if self.ledger.find(a) is None]:
                assert self.sim.requests_for(aid) == []
                self.ids.remove(aid)
                new.remove(aid)
        finally:
            self.provider.mode = None
        for a in old:
            assert len(self.sim.requests_for(a)) == before_old[a]  # an existing id never sends
        for aid in new:
            assert len(self.sim.requests_for(aid)) <= max(1, len(faults) * 3)
            if results is not None:
                assert self._status(aid) not in (Status.PENDING, Status.IN_FLIGHT), aid
        if results is not None:
            assert sorted(r.line for r in results) == [line.number for line in lines]
            STATS["submit_bulk"] += 1
        return multiple(*new)

    @rule()
    def reconcile_due_concurrently(self) -> None:
        r = Reconciler(self.ledger, self.registry, clock=self.clock, lease=3.0, concurrency=3)
        report = r.run_due()
        STATS["reconcile_concurrently"] += 1
        STATS["reconcile_changes"] += len(report.changes)

    @rule()
    def crash_while_reconciling(self) -> None:
        self.provider.mode = "in_check"
        try:
            self.reconciler.run_due()
        except SimulatedCrash:
            STATS["crash:in_check"] += 1
        finally:
            self.provider.mode = None

    @rule(target=actions, op=st.sampled_from(OPS), fault=st.sampled_from(FAULTS))
    def lease_expires_during_send(self, op: str, fault: str) -> str:
        """A dispatcher so slow that its lease expires and a reconciler takes the record
        over while the request is still on its way; the late reply is still evidence."""
        aid = self._new_id()
        params = {"name": f"n-{aid}", "value": 0}
        self.params[aid] = params
        self.sim.plan(aid, fault)

        def meanwhile() -> None:
            self.clock.advance(60.0)
            self.reconciler.run_due()
            assert self._status(aid) is Status.DENIED_UNRESOLVED

        self.provider.during_send = meanwhile
        self.dispatcher.submit("sim", op, params, action_id=aid)
        self.provider.during_send = None
        STATS["late_outcome"] += 1
        return aid

    @rule(
        target=actions,
        name=st.sampled_from(["tz", "lang"]),
        value=st.sampled_from(["a", "b"]),
        faults=st.tuples(st.sampled_from(FAULTS), st.sampled_from(FAULTS)),
        second_later=st.booleans(),
        interleave=st.booleans(),
    )
    def two_sets_of_the_same_change(
        self, name: str, value: str, faults: tuple[str, str], second_later: bool, interleave: bool
    ) -> Any:
        """Two actions ask for the same setting change (snapshot attribution): whatever
        their faults, an observed change is confirmed for one only when no other action
        could have made it. With ``interleave`` the second is sent between the first's
        snapshot and its request, so both snapshots predate both effects."""
        params = {"name": f"shared-{name}", "value": value}
        first, second = self._new_id(), self._new_id()
        for aid, fault in zip((first, second), faults, strict=True):
            self.params[aid] = params
            self.sim.plan(aid, fault)

        def send_second() -> None:
            self.dispatcher.submit(
                "sim", "set", params, action_id=second, needs_confirmation=second_later
            )

        if interleave:  # after the first's snapshot, before its request
            self.provider.during_send = send_second
        self.dispatcher.submit("sim", "set", params, action_id=first)
        self.provider.during_send = None
        if not interleave:
            send_second()
        STATS["same_change"] += 1
        return multiple(first, second)

    @rule(
        target=actions,
        op=st.sampled_from(OPS),
        fault=st.sampled_from(FAULTS),
        check_too=st.booleans(),
    )
    def lease_expires_before_the_outcome_commits(self, op: str, fault: str, check_too: bool) -> str:
        """The reply is in, but before the dispatcher commits its outcome its lease
        expires and a reconciler takes the record over (and, with ``check_too``, checks
        it again): the late outcome may settle an unresolved record with what it
        proves, never move one a reconciler already settled."""
        aid = self._new_id()
        params = {"name": f"n-{aid}", "value": 0}
        self.params[aid] = params
        self.sim.plan(aid, fault)
        seen: dict[str, Status] = {}

        def meanwhile() -> None:
            self.clock.advance(60.0)
            self.reconciler.run_due()
            if check_too:
                self.reconciler.run_ids([aid])
            seen["status"] = self._status(aid)
            assert seen["status"] is not Status.IN_FLIGHT

        self.provider.after_reply = meanwhile
        report = self.dispatcher.submit("sim", op, params, action_id=aid)
        self.provider.after_reply = None
        if "status" not in seen:  # the dispatcher never got a reply to race with
            return aid
        after = self._status(aid)
        assert report.record is not None and report.record.status is after
        if seen["status"] is not Status.DENIED_UNRESOLVED:
            assert after is seen["status"], (seen["status"], after)
        kinds = [e.kind for e in self.ledger.events(aid)]
        assert "lease_expired" in kinds and kinds.count("outcome") == 0, kinds
        STATS[f"late_outcome:{seen['status']}->{after}"] += 1
        return aid

    # ---------------------------------------------------------------- invariants
    @invariant()
    def ledger_agrees_with_ground_truth(self) -> None:
        if hasattr(self, "sim"):
            check(self.ledger, self.sim, ids=self.ids, dedupes=self.dedupe, final=False)
            assert no_second_effect_after_a_verdict(self.ledger, self.sim) == []
            STATS["contradictions"] = contradictions_block_retry(
                self.ledger, self.dispatcher, self.sim
            )
            STATS["steps_checked"] += 1


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[bool, SimServer]]:
    with SimServer(hang=0.5, honour_keys=True) as on, SimServer(hang=0.5, honour_keys=False) as off:
        yield {True: on, False: off}


@pytest.mark.slow
def test_random_interleavings_keep_the_invariants(
    servers: dict[bool, SimServer], backend: str
) -> None:
    STATS.clear()
    LedgerMachine.backend = backend
    # The rules and the policy are the same code on both backends; the PostgreSQL run
    # proves its dialect keeps the invariants under the same kind of interleavings, in
    # fewer examples (each costs about four times a SQLite one: a fresh schema, and the
    # full-ledger check after every step over the wire).
    examples = scaled(100 if backend == "sqlite" else 40)
    with httpx.Client(trust_env=False) as client:
        LedgerMachine.server = servers
        LedgerMachine.client = client
        run_state_machine_as_test(
            LedgerMachine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=30,
                deadline=None,
                derandomize=budget() <= 1,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    print("\nstateful figures:", dict(sorted(STATS.items())))
    assert STATS["examples"] >= examples
    assert STATS["steps_checked"] > 0
