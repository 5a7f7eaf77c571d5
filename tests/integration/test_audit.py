"""``settled providers audit`` on ledgers seeded with known outcomes, through the real
dispatcher and reconciler (a scripted in-process provider and a fake clock), and once
end to end through the CLI against the sim server."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.audit import MIN_EVIDENCE, answer, audit
from settled.clock import FakeClock
from settled.dispatch import Dispatcher
from settled.model import Status, Tier
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
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler


class Scripted(BaseProvider):
    """Replies and visibility decided per action by its params:
    ``visible_after`` (s after dispatch; absent = never), ``bounce``, ``proof``."""

    name = "api"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: dict[str, tuple[datetime, Mapping[str, Any]]] = {}
        common = {"verify_interval": 10.0, "attempts": 1, "predicate": True}
        self._ops = {
            "send": OperationSpec(
                "send",
                Tier.RECONCILABLE,
                30.0,
                queryable=True,
                carries_key=True,
                verify_deadline=300.0,
                verifies="GET",
                **common,
            ),
            "lookup": OperationSpec(
                "lookup",
                Tier.RECONCILABLE,
                0.0,
                queryable=True,
                carries_key=True,
                verify_deadline=20.0,
                verifies="GET",
                **common,
            ),
            "create": OperationSpec(
                "create",
                Tier.FULL,
                0.0,
                queryable=True,
                carries_key=True,
                proof="201",
                verify_deadline=20.0,
                **common,
            ),
            "notify": OperationSpec("notify", Tier.BLIND, **common),
            "broken": OperationSpec("broken", Tier.RECONCILABLE, 0.0, **common),
        }

    def operations(self) -> Mapping[str, OperationSpec]:
        return self._ops

    def execute(self, request: Request) -> WireResult:
        self.sent[request.reconciliation_key or request.action_id] = (
            self.clock.now(),
            request.params,
        )
        if request.operation == "create":
            proved = request.params.get("proof", False)
            return WireResult(
                Wire.ANSWERED, 201 if proved else 200, applied=True if proved else None
            )
        return WireResult(Wire.ANSWERED, 202)

    def query(self, target: QueryTarget) -> Observation:
        at, params = self.sent[target.reconciliation_key or target.action_id]
        if params.get("bounce"):
            return Observation(Seen.NOT_APPLIED, detail="bounced")
        after = params.get("visible_after")
        if after is not None and (self.clock.now() - at).total_seconds() >= after:
            return Observation(Seen.APPLIED, detail="there")
        return Observation(Seen.NOT_YET)


@pytest.fixture
def seeded(ledger: Ledger) -> tuple[Ledger, dict[tuple[str, str], OperationSpec]]:
    clock = FakeClock()
    provider = Scripted(clock)
    registry = Registry()
    registry.add(provider)
    d = Dispatcher(ledger, registry, clock=clock)
    n = 0

    def send(op: str, **params: Any) -> None:
        nonlocal n
        n += 1
        d.submit("api", op, params, action_id=f"{op}-{n}")

    for _ in range(10):
        send("send", visible_after=25)  # visible at the first check (30 s)
    for _ in range(10):
        send("send", visible_after=48)  # checks at 30 and 40 s see nothing; 50 s sees it
    for _ in range(2):
        send("send", bounce=True)
    for _ in range(6):
        send("lookup")  # never visible: the query reads the wrong thing
    for i in range(8):
        send("create", proof=i < 2, visible_after=0)
    send("notify")
    reconciler = Reconciler(ledger, registry, clock=clock, lease=5.0)
    for _ in range(40):  # 400 s of fake time, in 10 s steps
        clock.advance(10)
        reconciler.run_due()
    specs = {("api", name): spec for name, spec in provider.operations().items()}
    return ledger, specs


def test_seeded_figures(seeded: tuple[Ledger, dict[tuple[str, str], OperationSpec]]) -> None:
    ledger, specs = seeded
    report = audit(ledger, specs)
    ops = {o.operation: o for o in report.operations}
    send = ops["send"].figures
    assert (send.total, send.confirmed, send.failed, send.unresolved) == (22, 20, 2, 0)
    assert (send.first_seen_n, send.first_seen_p50, send.first_seen_p95) == (20, 30.0, 50.0)
    assert send.late == 10 and send.reconciled_absent == 2 and send.accepted_then_absent == 2
    lookup = ops["lookup"].figures
    assert (lookup.total, lookup.unresolved, lookup.checked, lookup.observed) == (6, 6, 6, 0)
    assert lookup.budget_spent == 6 and lookup.unresolved_rate == 1.0
    create = ops["create"].figures
    assert (create.proven_replies, create.unproven_replies, create.confirmed_by_provider) == (
        2,
        6,
        2,
    )
    assert create.confirmed_by_reconciliation == 6


def test_seeded_flags_and_suggestions(
    seeded: tuple[Ledger, dict[tuple[str, str], OperationSpec]],
) -> None:
    ledger, specs = seeded
    report = audit(ledger, specs)
    ops = {o.operation: o for o in report.operations}
    assert report.debt == ["api.broken", "api.lookup"]
    assert ops["lookup"].answers[1].answer == "no"
    assert (
        "declared reconcilable but 0 of 6 ever observed: is the query pointing at the real effect?"
        in ops["lookup"].suggestions
    )
    assert any(
        s.startswith(
            "window 30 s but p95 visibility 50 s (10 of 20 not visible at the first check): raise consistency_window to about 50 s"
        )
        for s in ops["send"].suggestions
    )
    assert any("2 accepted request(s) never took effect" in s for s in ops["send"].suggestions)
    assert not ops["send"].debt
    assert any("6 of 8 2xx replies proved nothing" in s for s in ops["create"].suggestions)
    assert ops["create"].answers[0].answer == "partly" and not ops["create"].debt
    assert [a.answer for a in ops["notify"].answers[:3]] == ["manual"] * 3
    assert not ops["notify"].debt and "manual verification" in ops["notify"].suggestions[0]
    assert ops["broken"].answers[1].why.startswith("declared reconcilable but has no query")
    data = json.loads(json.dumps(report.to_json()))
    assert data["debt"] == ["api.broken", "api.lookup"]


@pytest.mark.parametrize(
    ("spec", "q", "expected"),
    [
        (
            OperationSpec("x", Tier.RECONCILABLE, queryable=True, query_by_object_id=True),
            "q2",
            "partly",
        ),
        (OperationSpec("x", Tier.FULL), "q1", "partly"),
        (OperationSpec("x", Tier.FULL, proof="201"), "q2", "partly"),
        (OperationSpec("x", Tier.PARTIAL), "q2", "manual"),
        (
            OperationSpec("x", Tier.RECONCILABLE, attempts=3, dedupes_keys=True, queryable=True),
            "q5",
            "yes",
        ),
    ],
)
def test_declared_answers(spec: OperationSpec, q: str, expected: str) -> None:
    found = {a.question: a for a in answer(spec)}[q]
    assert found.answer == expected and not found.debt


def test_attempts_without_dedupe_is_one_budget() -> None:
    q5 = answer(OperationSpec("x", Tier.FULL, attempts=3))[4]
    assert (q5.answer, q5.debt) == ("yes", False) and "never connected" in q5.why


def test_history_needs_enough_evidence(mem_ledger: Ledger) -> None:
    spec = OperationSpec("x", Tier.RECONCILABLE, queryable=True, predicate=True)
    report = audit(mem_ledger, {("p", "x"): spec})
    assert report.debt == [] and MIN_EVIDENCE > 1


@pytest.mark.parametrize("tier", [Tier.FULL, Tier.RECONCILABLE])
def test_a_query_without_a_predicate_is_debt(tier: Tier) -> None:
    """Rule 10: a query that only checks that something answers at its path
    measures nothing; the audit says so."""
    q3 = answer(OperationSpec("x", tier, queryable=True, proof="201"))[2]
    assert (q3.answer, q3.debt) == ("partly", True) and "no predicate" in q3.why
    fine = answer(OperationSpec("x", tier, queryable=True, proof="201", predicate=True))[2]
    assert (fine.answer, fine.debt) == ("yes", False)


def test_cli_audit_exit_code_and_json(tmp_path: Path, ledger: Ledger) -> None:
    with SimServer(hang=0.5) as server:
        # One check past the budget gives it up: the audit, not rule 15, is what this proves.
        conf = sim_conf(server, verify_deadline=0.2, verify_min_checks=1, attempts=1)
        cfg = write_config(tmp_path / "settled.toml", {"sim": dict(conf)})
        with Registry({"sim": conf}) as reg:
            d = Dispatcher(ledger, reg)
            for i in range(MIN_EVIDENCE):
                server.plan(f"s{i}", "lost_after_accept")
                d.submit("sim", "send", {}, action_id=f"s{i}")
            d.submit("sim", "book", {}, action_id="b0")
            time.sleep(0.25)  # past the 0.2 s verification budget
            Reconciler(ledger, reg).run_ids([f"s{i}" for i in range(MIN_EVIDENCE)])
        assert all(
            ledger.get(f"s{i}").status is Status.DENIED_UNRESOLVED for i in range(MIN_EVIDENCE)
        )
        ledger.close()
        out = run_cli("--config", str(cfg), "providers", "audit", "--json")
        assert out.returncode == 4, out.stderr
        data = json.loads(out.stdout)
        assert data["debt"] == ["sim.send"]
        rows = {o["operation"]: o for o in data["operations"]}
        assert rows["book"]["figures"]["confirmed_by_provider"] == 1
        assert rows["send"]["figures"]["budget_spent"] == MIN_EVIDENCE
        text = run_cli("--config", str(cfg), "providers", "audit")
        assert text.returncode == 4 and f"0 of {MIN_EVIDENCE} ever observed" in text.stdout
        assert "completion-ownership debt: sim.send" in text.stdout
