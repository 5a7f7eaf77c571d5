"""The dispatcher and the confirmation handler against a real sim server."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import popen_cli, sim_conf

from settled import Ledger
from settled.cli.common import report_exit
from settled.clock import FakeClock
from settled.dispatch import Dispatcher, Outcome, ReplyProof, Result, classify
from settled.errors import Conflict, TransitionNotAllowed, UnknownProvider
from settled.model import Status, Tier
from settled.providers import Registry
from settled.providers.base import OperationSpec, Wire, WireResult
from settled.providers.sim_server import SimServer


def make(ledger: Ledger, sim: SimServer, **conf: object) -> tuple[Dispatcher, Registry]:
    reg = Registry({"sim": sim_conf(sim, **conf)}, source="test")
    return Dispatcher(ledger, reg, clock=FakeClock(), actor="test"), reg


@pytest.fixture
def d(ledger: Ledger, sim: SimServer) -> Iterator[Dispatcher]:
    disp, reg = make(ledger, sim)
    yield disp
    reg.close()


FULL = OperationSpec("x", Tier.FULL)
REC = OperationSpec("x", Tier.RECONCILABLE)


@pytest.mark.parametrize(
    ("spec", "wire", "verdict"),
    [
        (FULL, WireResult(Wire.ANSWERED, 201, applied=True), ReplyProof.PROVEN),
        (FULL, WireResult(Wire.ANSWERED, 200), ReplyProof.ACCEPTED),
        (REC, WireResult(Wire.ANSWERED, 202), ReplyProof.ACCEPTED),
        (REC, WireResult(Wire.ANSWERED, 200, applied=True), ReplyProof.ACCEPTED),
        (REC, WireResult(Wire.ANSWERED, 200, applied=False), ReplyProof.REJECTED),
        (REC, WireResult(Wire.ANSWERED, 422), ReplyProof.REJECTED),
        (REC, WireResult(Wire.ANSWERED, 404), ReplyProof.REJECTED),
        (REC, WireResult(Wire.ANSWERED, 408), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.ANSWERED, 429), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.ANSWERED, 500), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.ANSWERED, 503), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.ANSWERED, 302), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.ANSWERED, 799), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.NO_ANSWER), ReplyProof.AMBIGUOUS),
        (REC, WireResult(Wire.NOT_CONNECTED), ReplyProof.NEVER_SENT),
    ],
)
def test_classification_is_rule_3(
    spec: OperationSpec, wire: WireResult, verdict: ReplyProof
) -> None:
    assert classify(spec, wire) is verdict


def test_full_ok_is_confirmed_by_the_provider(d: Dispatcher, sim: SimServer) -> None:
    rep = d.submit("sim", "book", {"slot": "9:00"}, action_id="b1")
    assert (rep.outcome, rep.result, rep.record.status) == (
        Outcome.DISPATCHED,
        Result.SUCCEEDED,
        Status.CONFIRMED,
    )
    assert rep.record.confirmed_by == "provider" and rep.record.provider_object_id
    assert report_exit(rep) == 0
    reqs = sim.requests_for("b1")
    assert len(reqs) == 1 and reqs[0]["idempotency_key"] == "b1:1"


def test_a_202_is_accepted_not_done(d: Dispatcher, sim: SimServer) -> None:
    rep = d.submit("sim", "send", {"to": "x"}, action_id="s1")
    assert rep.record.status is Status.AWAITING_VERIFICATION
    assert rep.result is Result.ACCEPTED and report_exit(rep) == 3
    assert rep.record.reconciliation_key and rep.record.next_check_at
    assert rep.record.confirmed_at is None


def test_full_reply_that_proves_nothing_is_not_confirmed(d: Dispatcher, sim: SimServer) -> None:
    sim.plan("b2", "lost_after_accept")  # book answers 202 "queued"
    rep = d.submit("sim", "book", {}, action_id="b2")
    assert rep.record.status is Status.AWAITING_VERIFICATION


def test_rejection_is_failed(d: Dispatcher, sim: SimServer) -> None:
    sim.plan("r1", "reject")
    rep = d.submit("sim", "send", {}, action_id="r1")
    assert (rep.record.status, rep.record.acceptance, report_exit(rep)) == (
        Status.FAILED,
        "REJECTED",
        5,
    )
    assert "422" in (rep.record.reason or "")


@pytest.mark.parametrize(
    "fault",
    [
        "timeout_after_apply",
        "reset_after_apply",
        "5xx_after",
        "5xx_before",
        "drop",
        "http:429",
        "http:799",
    ],
)
def test_ambiguous_without_dedupe_is_unresolved_after_one_request(
    d: Dispatcher, sim: SimServer, fault: str
) -> None:
    sim.plan("u1", fault)
    rep = d.submit("sim", "send", {}, action_id="u1")
    assert rep.record.status is Status.DENIED_UNRESOLVED
    assert rep.result is Result.UNRESOLVED and report_exit(rep) == 4
    assert len(sim.requests_for("u1")) == 1
    assert rep.record.next_check_at  # queryable: reconciliation takes it from here


def test_ambiguous_with_dedupe_repeats_with_the_same_key(ledger: Ledger, sim: SimServer) -> None:
    d, reg = make(ledger, sim, dedupe=True, attempts=3)
    try:
        sim.plan("k1", "timeout_after_apply", "ok")
        rep = d.submit("sim", "book", {}, action_id="k1")
    finally:
        reg.close()
    reqs = sim.requests_for("k1")
    assert [r["idempotency_key"] for r in reqs] == ["k1:1", "k1:1"]
    assert sim.effects_for("k1") == 1
    assert rep.record.status is Status.CONFIRMED


def test_never_connected_is_retried_then_failed(ledger: Ledger) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when we leave: nothing listens
    reg = Registry(
        {
            "sim": {
                "type": "sim",
                "base_url": f"http://127.0.0.1:{port}",
                "attempts": 3,
                "timeout": 0.3,
            }
        },
        source="test",
    )
    clock = FakeClock()
    try:
        rep = Dispatcher(ledger, reg, clock=clock).submit("sim", "send", {}, action_id="n1")
    finally:
        reg.close()
    assert rep.record.status is Status.FAILED and rep.record.delivery == "FAILED"
    tries = ledger.events("n1")[-1].detail["tries"]
    assert [t["wire"] for t in tries] == ["not_connected"] * 3


def test_blind_is_unresolved_at_once_and_never_auto_checked(d: Dispatcher) -> None:
    rep = d.submit("sim", "notify", {}, action_id="bl")
    r = rep.record
    assert (r.status, r.eligible_at, r.next_check_at, r.requires_manual_verification) == (
        Status.DENIED_UNRESOLVED,
        None,
        None,
        True,
    )


def test_existing_id_same_params_sends_nothing(d: Dispatcher, sim: SimServer) -> None:
    d.submit("sim", "book", {"a": 1}, action_id="e1")
    rep = d.submit("sim", "book", {"a": 1}, action_id="e1")
    assert rep.outcome is Outcome.ALREADY_COMPLETED and len(sim.requests_for("e1")) == 1
    with pytest.raises(Conflict):
        d.submit("sim", "book", {"a": 2}, action_id="e1")
    assert len(sim.requests_for("e1")) == 1


def test_a_dispatch_records_and_claims_in_one_transaction(
    d: Dispatcher, ledger: Ledger, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two durable transactions per dispatch (record + claim, then the outcome); a
    recorded action waiting for confirmation takes one, its confirmation two."""
    cls = type(ledger)
    # where a transaction begins: SQLite's write transaction; PostgreSQL's and its
    # one-statement transaction (its ``_write`` picks one of those two)
    names = ["_tx", "_one"] if hasattr(cls, "_tx") else ["_write"]
    opened = []

    def counting(write: Any) -> Any:
        def opening(self: Ledger, doing: str, **how: Any) -> object:
            opened.append(doing)
            return write(self, doing, **how)

        return opening

    for name in names:
        monkeypatch.setattr(cls, name, counting(getattr(cls, name)))
    d.submit("sim", "book", {"a": 1}, action_id="one")
    assert len(opened) == 2 and len(sim.requests_for("one")) == 1
    opened.clear()
    d.submit("sim", "book", {"a": 1}, action_id="later", needs_confirmation=True)
    assert len(opened) == 1 and ledger.get("later").status is Status.PENDING
    d.confirm("later")
    assert len(opened) == 3 and ledger.get("later").status is Status.CONFIRMED


def test_existing_id_of_a_snapshot_operation_sends_nothing(d: Dispatcher, sim: SimServer) -> None:
    first = d.submit("sim", "set", {"name": "tz", "value": "UTC"}, action_id="s1")
    again = d.submit("sim", "set", {"name": "tz", "value": "UTC"}, action_id="s1")
    assert again.record is not None and again.record.status is first.record.status  # type: ignore[union-attr]
    assert "nothing sent" in again.message
    with pytest.raises(Conflict):
        d.submit("sim", "set", {"name": "tz", "value": "CET"}, action_id="s1")
    assert len(sim.requests_for("s1")) == 1


def test_processes_racing_one_id_send_it_once(sim_config: Path, sim: SimServer) -> None:
    """Real processes dispatch the same id at once, some with other params: one records,
    claims and sends it; the others find it, or are refused when their params differ."""
    params = ['{"a": 1}'] * 3 + ['{"a": 2}'] * 2
    procs = [
        popen_cli("dispatch", "sim", "book", "--action-id", "race", "--params", p, "--json")
        for p in params
    ]
    done = [(p.communicate(timeout=60), p.returncode) for p in procs]
    won = [
        i
        for i, ((out, _), _) in enumerate(done)
        if out and json.loads(out)["outcome"] == "dispatched"
    ]
    assert len(won) == 1
    for i, ((out, err), code) in enumerate(done):
        if i in won:
            continue
        if params[i] == params[won[0]]:
            assert json.loads(out)["outcome"] != "dispatched" and code in (0, 3), (code, err)
        else:
            assert code == 7 and "different params" in err, (code, err)
    assert len(sim.requests_for("race")) == 1
    with Ledger.open(os.environ["SETTLED_DB"]) as ledger:
        events = ledger.events("race")
    assert [e.kind for e in events] == ["recorded", "claimed", "outcome"]
    assert events[0].at <= events[1].at <= events[2].at


def test_unknown_provider_and_operation(d: Dispatcher, ledger: Ledger) -> None:
    with pytest.raises(UnknownProvider):
        d.submit("nope", "book", {})
    with pytest.raises(UnknownProvider):
        d.submit("sim", "nope", {})
    assert ledger.query() == []


def test_confirmation_outcomes_follow_rule_8(d: Dispatcher, sim: SimServer) -> None:
    assert d.confirm("missing").outcome is Outcome.NOT_FOUND
    assert report_exit(d.confirm("missing")) == 6
    rec = d.submit("sim", "book", {}, action_id="c1", needs_confirmation=True)
    assert rec.outcome is Outcome.RECORDED and report_exit(rec) == 3
    assert sim.requests_for("c1") == []
    first = d.confirm("c1")
    assert (first.outcome, first.result) == (Outcome.DISPATCHED, Result.SUCCEEDED)
    second = d.confirm("c1")
    assert (second.outcome, report_exit(second)) == (Outcome.ALREADY_COMPLETED, 0)
    assert len(sim.requests_for("c1")) == 1

    d.submit("sim", "send", {}, action_id="c2", needs_confirmation=True)
    assert d.confirm("c2").result is Result.ACCEPTED  # the real result, not "dispatched"
    again = d.confirm("c2")
    assert (again.outcome, report_exit(again)) == (Outcome.IN_PROGRESS, 3)

    sim.plan("c3", "timeout_after_apply")
    d.submit("sim", "send", {}, action_id="c3", needs_confirmation=True)
    assert d.confirm("c3").result is Result.UNRESOLVED
    blocked = d.confirm("c3")
    assert (blocked.outcome, report_exit(blocked)) == (Outcome.BLOCKED, 4)
    assert "reconcile before retry" in blocked.message
    assert len(sim.requests_for("c3")) == 1

    sim.plan("c4", "reject")
    d.submit("sim", "send", {}, action_id="c4", needs_confirmation=True)
    assert d.confirm("c4").result is Result.FAILED
    done = d.confirm("c4")
    assert (done.outcome, report_exit(done)) == (Outcome.ALREADY_COMPLETED, 5)


def test_retry_only_from_failed_with_a_new_key(d: Dispatcher, sim: SimServer) -> None:
    sim.plan("t1", "reject", "ok")
    assert d.submit("sim", "book", {}, action_id="t1").record.status is Status.FAILED
    rep = d.retry("t1")
    assert rep.record.status is Status.CONFIRMED and rep.record.attempt == 2
    assert [r["idempotency_key"] for r in sim.requests_for("t1")] == ["t1:1", "t1:2"]
    with pytest.raises(TransitionNotAllowed):
        d.retry("t1")  # CONFIRMED
    sim.plan("t2", "timeout_after_apply")
    d.submit("sim", "send", {}, action_id="t2")
    with pytest.raises(TransitionNotAllowed, match="reconcile"):
        d.retry("t2")
    assert len(sim.requests_for("t2")) == 1


def test_every_move_is_an_event_in_order(d: Dispatcher, ledger: Ledger) -> None:
    d.submit("sim", "book", {}, action_id="ev")
    ev = ledger.events("ev")
    assert [(e.kind, e.from_status, e.to_status) for e in ev] == [
        ("recorded", None, "PENDING"),
        ("claimed", "PENDING", "IN_FLIGHT"),
        ("outcome", "IN_FLIGHT", "CONFIRMED"),
    ]


def test_an_operation_declared_to_need_confirmation_only_records(
    ledger: Ledger, sim: SimServer
) -> None:
    ops = {
        "send": {
            "tier": "full",
            "attempts": 1,
            "needs_confirmation": True,
            "request": {"method": "POST", "path": "/v1/book"},
            "object_id": "/id",
        }
    }
    with Registry({"api": {"type": "http", "base_url": sim.url, "operations": ops}}) as reg:
        d = Dispatcher(ledger, reg)
        rep = d.submit("api", "send", {"action_id": "nc"}, action_id="nc")
        assert rep.outcome is Outcome.RECORDED and sim.requests_for("nc") == []
        assert reg.operation("api", "send").to_json()["needs_confirmation"] is True
        assert d.confirm("nc").outcome is Outcome.DISPATCHED
    assert len(sim.requests_for("nc")) == 1
