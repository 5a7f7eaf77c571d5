"""The ledger's and the reconciler's fast paths behave exactly like the plain ones:
UPDATE … RETURNING against UPDATE then SELECT, and a batch's results committed
together against one commit per check."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
from records import new_record, transition

from settled.clock import FakeClock, to_text
from settled.model import EventKind, Status, Tier
from settled.providers import Registry
from settled.providers.base import (
    BaseProvider,
    Observation,
    OperationSpec,
    QueryTarget,
    Request,
    Seen,
    Wire,
    WireResult,
)
from settled.reconcile import Reconciler
from settled.storage import Ledger
from settled.storage import sqlite as ledger_mod

AT = "2026-01-01T00:00:00.000000Z"


class Scripted(BaseProvider):
    """Answers each query with what the test scripted for that action."""

    name = "scripted"

    def __init__(self, seen: dict[str, Seen]) -> None:
        self.seen = seen
        self.queries: list[str] = []

    def operations(self) -> Mapping[str, OperationSpec]:
        return {
            "send": OperationSpec(
                "send",
                Tier.RECONCILABLE,
                consistency_window=0.0,
                queryable=True,
                carries_key=True,
                verify_interval=1.0,
                verify_deadline=60.0,
            )
        }

    def execute(self, request: Request) -> WireResult:
        return WireResult(Wire.ANSWERED, 202, "obj", None, "HTTP 202")

    def query(self, target: QueryTarget) -> Observation:
        self.queries.append(target.action_id)
        return Observation(self.seen[target.action_id], detail="scripted")


def _record(led: Ledger, aid: str) -> None:
    led.record(
        new_record(aid, tier=Tier.RECONCILABLE, provider="scripted", operation="send"), actor="test"
    )


@pytest.mark.sqlite_only  # SQLite's two paths; PostgreSQL always returns the row
@pytest.mark.parametrize("returning", [True, False])
def test_transition_returns_the_new_row_or_none(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, returning: bool
) -> None:
    dialect = dataclasses.replace(ledger_mod.DIALECT, returning=returning)
    monkeypatch.setattr(ledger_mod.SqliteLedger, "DIALECT", dialect)
    with Ledger.open(db_path) as led:
        _record(led, "a")
        moved = transition(
            led,
            "a",
            Status.PENDING,
            Status.IN_FLIGHT,
            kind=EventKind.CLAIMED,
            lease_owner="me",
            delivery="IN_FLIGHT",
        )
        assert moved is not None
        assert (moved.status, moved.lease_owner, moved.delivery) == ("IN_FLIGHT", "me", "IN_FLIGHT")
        assert moved == led.get("a")
        # the guard: not PENDING any more, and the wrong owner
        assert (
            transition(led, "a", Status.PENDING, Status.IN_FLIGHT, kind=EventKind.CLAIMED) is None
        )
        assert (
            transition(
                led,
                "a",
                Status.IN_FLIGHT,
                Status.FAILED,
                kind=EventKind.OUTCOME,
                owner="someone-else",
            )
            is None
        )
        assert [e.kind for e in led.events("a")] == ["recorded", "claimed"]
        assert led.get("a").status == "IN_FLIGHT"


def _awaiting(led: Ledger, aids: list[str], clock: FakeClock) -> None:
    now = to_text(clock.now())
    for aid in aids:
        _record(led, aid)
        transition(
            led,
            aid,
            Status.PENDING,
            Status.IN_FLIGHT,
            kind=EventKind.CLAIMED,
            at=now,
            lease_owner="d",
        )
        transition(
            led,
            aid,
            Status.IN_FLIGHT,
            Status.AWAITING_VERIFICATION,
            kind=EventKind.OUTCOME,
            at=now,
            owner="d",
            lease_owner=None,
            next_check_at=now,
            verify_started_at=now,
            verify_deadline_at=to_text(clock.now().replace(year=2027)),
        )


@pytest.mark.parametrize("batch", [1, 2, 50])
def test_a_batch_settles_each_row_as_its_check_says(db_path: Path, batch: int) -> None:
    seen = {
        "ok-1": Seen.APPLIED,
        "gone": Seen.NOT_APPLIED,
        "later": Seen.NOT_YET,
        "ok-2": Seen.APPLIED,
        "odd": Seen.AMBIGUOUS,
    }
    provider = Scripted(seen)
    reg = Registry({}, source="test")
    reg.add(provider)
    clock = FakeClock()
    changes: list[str] = []
    with Ledger.open(db_path) as led:
        _awaiting(led, list(seen), clock)
        report = Reconciler(
            led, reg, clock=clock, batch=batch, on_change=lambda ch: changes.append(ch.action_id)
        ).run_due()
        status = {aid: led.get(aid).status for aid in seen}
        assert status == {
            "ok-1": "CONFIRMED",
            "gone": "FAILED",
            "later": "AWAITING_VERIFICATION",
            "ok-2": "CONFIRMED",
            "odd": "AWAITING_VERIFICATION",
        }
        assert sorted(provider.queries) == sorted(seen)  # each checked once
        assert report.examined == 5
        assert sorted(c.action_id for c in report.changes) == ["gone", "ok-1", "ok-2"]
        assert sorted(changes) == ["gone", "ok-1", "ok-2"]
        assert sorted(c.action_id for c in report.waiting) == ["later", "odd"]
        for aid in ("later", "odd"):  # rescheduled, lease released, no event
            rec = led.get(aid)
            assert rec.lease_owner is None and rec.checks == 1
            assert rec.next_check_at is not None and rec.next_check_at > to_text(clock.now())
            assert [e.kind for e in led.events(aid)][-1] == "outcome"
        assert led.events("ok-1")[-1].kind == "reconciled"
        assert led.get("ok-1").confirmed_by == "reconciliation"
        # nothing is due any more: a second pass checks nothing
        assert Reconciler(led, reg, clock=clock, batch=batch).run_due().examined == 0


def test_results_gathered_before_a_crash_in_the_batch_are_committed(db_path: Path) -> None:
    class Boom(Scripted):
        def query(self, target: QueryTarget) -> Observation:
            if target.action_id == "b":
                raise RuntimeError("provider bug")
            return super().query(target)

    reg = Registry({}, source="test")
    reg.add(Boom({"a": Seen.APPLIED, "c": Seen.APPLIED}))
    clock = FakeClock()
    with Ledger.open(db_path) as led:
        _awaiting(led, ["a", "b", "c"], clock)
        with pytest.raises(RuntimeError):
            Reconciler(led, reg, clock=clock, batch=10).run_due()
        assert led.get("a").status == "CONFIRMED"  # checked before the bug: kept
        assert led.get("b").status == "AWAITING_VERIFICATION"  # still leased, checked later
        assert led.get("b").lease_owner is not None
        assert led.get("c").status == "AWAITING_VERIFICATION"


def test_results_are_committed_before_a_slow_check_once_old_enough(db_path: Path) -> None:
    """flush_after bounds how long an observed result waits for its batch's commit:
    a later, slow query does not hold it back."""
    seen_status: dict[str, str] = {}

    class Slow(Scripted):
        def query(self, target: QueryTarget) -> Observation:
            if self.queries:  # by now, the previous check's result must be committed
                with Ledger.open(db_path) as other:
                    seen_status[self.queries[-1]] = other.get(self.queries[-1]).status
            return super().query(target)

    reg = Registry({}, source="test")
    reg.add(Slow({"a": Seen.APPLIED, "b": Seen.APPLIED}))
    clock = FakeClock()
    with Ledger.open(db_path) as led:
        _awaiting(led, ["a", "b"], clock)
        Reconciler(led, reg, clock=clock, batch=10, flush_after=0.0).run_due()
        assert list(seen_status.values()) == ["CONFIRMED"]
        assert led.get("a").status == led.get("b").status == "CONFIRMED"
