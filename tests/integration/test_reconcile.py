"""The reconciliation pass as a library, against a real sim server on loopback.

Scheduling is driven by a FakeClock; the sim shows effects at once (no lag), so every
check's answer is known in advance and each test counts the queries the server saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from records import transition
from support import sim_conf

from settled import Ledger
from settled.clock import FakeClock, from_text, plus, to_text
from settled.dispatch import Dispatcher
from settled.model import EventKind, Status
from settled.providers import Registry
from settled.providers.base import Request
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_registry(sim: SimServer, **over: Any) -> Registry:
    return Registry({"sim": sim_conf(sim, **over)}, source="test")


@pytest.fixture
def reg(sim: SimServer) -> Iterator[Registry]:
    r = make_registry(sim, consistency_window=10.0, verify_interval=5.0, verify_deadline=60.0)
    yield r
    r.close()


def send(d: Dispatcher, sim: SimServer, aid: str, *faults: str, op: str = "send") -> Any:
    if faults:
        sim.plan(aid, *faults)
    return d.submit("sim", op, {"to": "x@example.com"}, action_id=aid).record


def test_lost_after_accept_is_checked_once_per_pass_until_the_budget(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    rec = send(d, sim, "a1", "lost_after_accept")
    assert rec.status is Status.AWAITING_VERIFICATION
    r = Reconciler(mem_ledger, reg, clock=clock)
    assert r.run_due().examined == 0  # inside the window: not due
    clock.advance(10)
    report = r.run_due()
    assert report.examined == 1 and not report.changes
    assert sim.queries_for(rec.reconciliation_key) == 1  # one pass, one query
    now = mem_ledger.get("a1")
    assert now.status is Status.AWAITING_VERIFICATION and now.checks == 1
    assert now.next_check_at == to_text(plus(clock.now(), 5.0)) and now.lease_owner is None
    for _ in range(20):
        clock.advance(5)
        r.run_due()
    final = mem_ledger.get("a1")
    assert final.status is Status.DENIED_UNRESOLVED  # never CONFIRMED on a budget
    assert final.confirmed_by is None and final.next_check_at is None
    assert "verification budget spent" in (final.reason or "")
    assert sim.queries_for(rec.reconciliation_key) == final.checks
    assert len(sim.requests_for("a1")) == 1


def test_a_pass_ends_even_when_checks_reschedule_inside_it(
    mem_ledger: Ledger, sim: SimServer, clock: FakeClock
) -> None:
    reg = make_registry(sim, verify_interval=0.001, verify_deadline=60.0)
    try:
        d = Dispatcher(mem_ledger, reg, clock=clock)
        keys = [send(d, sim, f"a{i}", "lost_after_accept").reconciliation_key for i in range(5)]

        class Ticking(FakeClock):  # every reading moves time on, as a slow pass would
            def now(self) -> Any:
                self.advance(0.01)
                return super().now()

        tick = Ticking(clock.now())
        report = Reconciler(mem_ledger, reg, clock=tick, batch=2).run_due()
        assert report.examined == 5
        assert [sim.queries_for(k) for k in keys] == [1] * 5
    finally:
        reg.close()


def test_expired_lease_becomes_unresolved_then_is_confirmed_in_the_same_pass(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    rec = d.submit("sim", "send", {"to": "x"}, action_id="a1", needs_confirmation=True).record
    # A dispatcher claims, sends, and dies before recording the outcome.
    claimed = transition(
        mem_ledger,
        "a1",
        Status.PENDING,
        Status.IN_FLIGHT,
        kind=EventKind.CLAIMED,
        at=to_text(clock.now()),
        lease_owner="d-1",
        lease_expires_at=to_text(plus(clock.now(), 30)),
        next_check_at=to_text(plus(clock.now(), 30)),
        eligible_at=to_text(plus(clock.now(), 10)),
    )
    assert claimed is not None
    reg.provider("sim").execute(Request("a1", "send", {}, "a1:1", rec.reconciliation_key, 1, 0.3))
    r = Reconciler(mem_ledger, reg, clock=clock)
    clock.advance(20)
    assert r.run_due().examined == 0 and mem_ledger.get("a1").status is Status.IN_FLIGHT
    clock.advance(11)
    report = r.run_due()
    moves = [(c.from_status, c.to_status, c.kind) for c in report.changes]
    assert moves == [
        ("IN_FLIGHT", "DENIED_UNRESOLVED", "lease_expired"),
        ("DENIED_UNRESOLVED", "CONFIRMED", "reconciled"),
    ]
    final = mem_ledger.get("a1")
    assert final.confirmed_by == "reconciliation" and final.checks == 1
    assert len(sim.requests_for("a1")) == 1  # never re-sent
    kinds = [e.kind for e in mem_ledger.events("a1")]
    assert kinds == ["recorded", "claimed", "lease_expired", "reconciled"]
    assert "dispatcher lost" in mem_ledger.events("a1")[2].detail["reason"]


def test_stop_finishes_the_check_in_hand_and_hands_back_the_rest(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    for i in range(4):
        send(d, sim, f"a{i}")
    due = {
        r.action_id: r.next_check_at for r in mem_ledger.query(statuses=["AWAITING_VERIFICATION"])
    }
    clock.advance(10)
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 2  # before the pass, before record 1: go on; then stop

    report = Reconciler(mem_ledger, reg, clock=clock, batch=10, stop_requested=stop).run_due()
    assert report.stopped and report.examined == 1
    rows = mem_ledger.query(statuses=["AWAITING_VERIFICATION", "CONFIRMED"])
    assert sum(r.status is Status.CONFIRMED for r in rows) == 1
    for r in rows:
        assert r.lease_owner is None
        if r.status is Status.AWAITING_VERIFICATION:
            assert r.next_check_at == due[r.action_id]  # due again at once, for anyone
    assert Reconciler(mem_ledger, reg, clock=clock).run_due().counts() == {"CONFIRMED": 3}


def test_a_forced_check_inside_the_window_never_fails_on_absence(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    rec = send(d, sim, "a1", "bounce")
    r = Reconciler(mem_ledger, reg, clock=clock)
    report = r.run_ids(["a1"])
    assert not report.changes
    now = mem_ledger.get("a1")
    assert now.status is Status.AWAITING_VERIFICATION
    assert now.next_check_at == rec.eligible_at  # the scheduled check still runs
    assert "not taken as proof" in (now.reason or "")
    clock.advance(10)
    assert r.run_due().counts() == {"FAILED": 1}
    assert sim.queries_for(rec.reconciliation_key) == 2


def test_partial_waits_its_window_then_needs_a_person(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "p1", op="deliver")
    r = Reconciler(mem_ledger, reg, clock=clock)
    early = r.run_ids(["p1"])
    assert not early.changes and "joins the queue" in early.skipped[0].reason
    assert mem_ledger.get("p1").status is Status.AWAITING_VERIFICATION
    clock.advance(10)
    report = r.run_due()
    assert [(c.to_status, c.kind) for c in report.changes] == [("DENIED_UNRESOLVED", "unresolved")]
    rec = mem_ledger.get("p1")
    assert rec.next_check_at is None and rec.confirmed_by is None
    events = len(mem_ledger.events("p1"))
    again = r.run_ids(["p1"])
    assert "needs a person" in again.skipped[0].reason
    assert len(mem_ledger.events("p1")) == events


def test_a_provider_missing_here_waits_and_says_why(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "a1")
    clock.advance(10)
    other = Registry({}, source="test")
    report = Reconciler(mem_ledger, other, clock=clock, lease=60).run_due()
    rec = mem_ledger.get("a1")
    assert not report.changes and rec.status is Status.AWAITING_VERIFICATION
    assert "not configured here" in (rec.reason or "")
    assert from_text(rec.next_check_at) == plus(clock.now(), 60)
    assert rec.lease_owner is None


def test_unknown_id_raises_before_anything_is_checked(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    from settled.errors import NotFound

    d = Dispatcher(mem_ledger, reg, clock=clock)
    rec = send(d, sim, "a1")
    clock.advance(10)
    with pytest.raises(NotFound):
        Reconciler(mem_ledger, reg, clock=clock).run_ids(["a1", "nope"])
    assert sim.queries_for(rec.reconciliation_key) == 0


def test_a_stale_retry_never_reopens_an_attempt_twice(
    mem_ledger: Ledger,
    reg: Registry,
    sim: SimServer,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    stale = send(d, sim, "a1", "reject", "reject", op="book")
    assert stale.status is Status.FAILED
    assert d.retry("a1").record.attempt == 2  # attempt 2 is rejected as well
    # A second retry that read the record before attempt 2 existed:
    monkeypatch.setattr(mem_ledger, "get", lambda aid: stale if aid == "a1" else None)
    report = d.retry("a1")
    monkeypatch.undo()
    assert report.outcome == "in_progress" and report.message == "retried elsewhere"
    assert [r["idempotency_key"] for r in sim.requests_for("a1")] == ["a1:1", "a1:2"]
    assert mem_ledger.get("a1").attempt == 2


def test_a_lost_dispatch_expired_where_the_provider_is_unknown_waits_for_one_that_knows(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    d.submit("sim", "send", {"to": "x"}, action_id="a1", needs_confirmation=True)
    transition(
        mem_ledger,
        "a1",
        Status.PENDING,
        Status.IN_FLIGHT,
        kind=EventKind.CLAIMED,
        at=to_text(clock.now()),
        lease_owner="d-1",
        lease_expires_at=to_text(clock.now()),
        next_check_at=to_text(clock.now()),
        eligible_at=to_text(clock.now()),
    )
    clock.advance(1)
    elsewhere = Registry({}, source="test")
    Reconciler(mem_ledger, elsewhere, clock=clock, lease=30).run_due()
    rec = mem_ledger.get("a1")
    assert rec.status is Status.DENIED_UNRESOLVED and rec.next_check_at is not None
    assert "a reconciler that has it will check it" in (rec.reason or "")
    clock.advance(30)
    report = Reconciler(mem_ledger, reg, clock=clock).run_due()  # nothing was sent: not yet
    rec = mem_ledger.get("a1")
    assert not report.changes and rec.status is Status.DENIED_UNRESOLVED
    assert rec.verify_deadline_at == to_text(plus(clock.now(), 60.0))  # budget from here
    assert rec.next_check_at == to_text(plus(clock.now(), 5.0))


@pytest.mark.sqlite_only  # PostgreSQL's plan: test_postgres.py
def test_the_due_scan_walks_the_due_index(ledger: Ledger, reg: Registry, clock: FakeClock) -> None:
    """The batch select reads the due rows in due order from the due index: never
    every row in a status, sorted per batch (which grows with the ledger)."""
    d = Dispatcher(ledger, reg, clock=clock)
    d.submit("sim", "send", {"to": "x"}, action_id="due-scan")
    seen: list[str] = []
    ledger.conn.set_trace_callback(seen.append)
    try:
        clock.advance(3600)
        Reconciler(ledger, reg, clock=clock).run_due()
    finally:
        ledger.conn.set_trace_callback(None)
    scans = [s for s in seen if "FROM actions WHERE next_check_at" in s]
    assert scans
    plan = " ".join(str(r[-1]) for r in ledger.conn.execute("EXPLAIN QUERY PLAN " + scans[0]))
    assert "actions_due" in plan and "TEMP B-TREE" not in plan, plan


def test_moves_that_never_commit_are_never_reported(
    ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    """The daemon logs a transition from ``on_change``: it must only ever hear of moves
    that are durable. When the commit of a batch's results fails, nothing is reported
    and the rows are checked again once the lease ends."""
    from settled.errors import LedgerBusy

    d = Dispatcher(ledger, reg, clock=clock)
    for aid in ("c1", "c2"):
        d.submit("sim", "send", {"to": "x"}, action_id=aid)

    class CommitFails:
        """The same ledger, but every commit of results fails (alone, or with the next
        batch's lease)."""

        def __init__(self, inner: Ledger) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def commit(self, moves: Any) -> list[bool]:
            raise LedgerBusy("ledger x is locked by another writer; commit results did not happen")

        def lease_due(self, **kw: Any) -> Any:
            if kw.get("pending"):
                raise LedgerBusy("ledger x is locked by another writer; lease did not happen")
            return self.inner.lease_due(**kw)

    broken: Any = CommitFails(ledger)
    heard: list[str] = []
    clock.advance(11)  # past the window: both are due
    with pytest.raises(LedgerBusy):
        Reconciler(
            broken,
            reg,
            clock=clock,
            on_change=lambda ch: heard.append(ch.action_id),
            on_check=lambda ch: heard.append(ch.action_id),
        ).run_due()
    assert heard == []
    assert sim.queries_for(ledger.get("c1").reconciliation_key) == 1  # it was checked
    assert {ledger.get(a).status for a in ("c1", "c2")} == {Status.AWAITING_VERIFICATION}
    clock.advance(120)  # the reconciler's lease ends: checked again, and now reported
    Reconciler(ledger, reg, clock=clock, on_change=lambda ch: heard.append(ch.action_id)).run_due()
    assert sorted(heard) == ["c1", "c2"]
    assert {ledger.get(a).status for a in ("c1", "c2")} == {Status.CONFIRMED}
