"""The flows end to end: real `settled` processes, a real ledger file, a real sim
server on loopback. Every test checks the ledger's verdict against the server's ground
truth: nothing CONFIRMED without an applied effect, never two sends of one key."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support import SHORT, popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.clock import from_text, utcnow
from settled.providers.sim_server import SimServer


def configure(
    tmp_path: Path, sim: SimServer, *, dispatch: dict[str, Any] | None = None, **over: Any
) -> Path:
    sections = {"dispatch": dispatch} if dispatch else {}
    return write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, **over)}, **sections)


def record(db_path: Path, aid: str) -> dict[str, Any]:
    with Ledger.open(db_path) as led:
        rec = led.get(aid).to_json()
        rec["events"] = [e.to_json() for e in led.events(aid)]
        return rec


def dispatch(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    out = run_cli("dispatch", *args, "--json", env=env)
    assert out.stderr == "" or out.returncode in (3, 4, 5), out.stderr
    return out.returncode, json.loads(out.stdout)


def test_lost_after_accept_ends_unresolved_never_confirmed(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, verify_deadline=0.4)
    sim.plan("lost", "lost_after_accept")
    code, out = dispatch("sim", "send", "--action-id", "lost", "--wait", "--wait-timeout", "20")
    assert code == 4
    assert out["status"] == "DENIED_UNRESOLVED" and out["confirmed_by"] is None
    assert out["result"] == "accepted"  # what the call did: accepted, never "succeeded"
    assert "verification budget spent" in out["reason"]
    assert len(sim.requests_for("lost")) == 1 and sim.effects_for("lost") == 0
    assert sim.queries_for(out["reconciliation_key"]) == record(db_path, "lost")["checks"] >= 1


def test_visibility_lag_inside_the_window_is_confirmed(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, consistency_window=0.5)
    sim.plan("lag", "lag:0.3")
    code, out = dispatch("sim", "send", "--action-id", "lag", "--wait", "--wait-timeout", "20")
    assert code == 0 and out["status"] == "CONFIRMED"
    assert out["confirmed_by"] == "reconciliation" and out["provider_object_id"]
    assert "--wait: AWAITING_VERIFICATION → CONFIRMED" in out["message"]
    # checked at eligible_at, not before: the lag never showed as "not yet"
    assert sim.queries_for(out["reconciliation_key"]) == 1
    assert from_text(out["confirmed_at"]) >= from_text(out["eligible_at"])


def test_a_bounce_is_failed(tmp_path: Path, sim: SimServer) -> None:
    configure(tmp_path, sim)
    sim.plan("b", "bounce")
    code, out = dispatch("sim", "send", "--action-id", "b", "--wait", "--wait-timeout", "20")
    assert code == 5 and out["status"] == "FAILED" and out["acceptance"] == "REJECTED"
    assert "bounced" in out["reason"] and sim.effects_for("b") == 0


def test_timeout_after_apply_without_dedupe_is_unresolved_then_reconciled(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    # The send times out (SHORT, under the server's hang: the client gives up first);
    # the check is made later, with the timeout a reply that comes back never outlasts.
    configure(tmp_path, sim, dedupe=False, attempts=3, timeout=SHORT)
    sim.plan("t", "timeout_after_apply")
    code, out = dispatch("sim", "send", "--action-id", "t")
    assert code == 4 and out["status"] == "DENIED_UNRESOLVED" and out["result"] == "unresolved"
    assert "does not deduplicate" in out["reason"]
    assert "timed out" in out["reason"] or "Timeout" in out["reason"], out["reason"]
    configure(tmp_path, sim, dedupe=False, attempts=3)
    rec = run_cli("reconcile", "--due", "--json")
    assert rec.returncode == 0, rec.stderr
    changes = json.loads(rec.stdout)["changes"]
    assert [(c["action_id"], c["from"], c["to"]) for c in changes] == [
        ("t", "DENIED_UNRESOLVED", "CONFIRMED")
    ]
    final = record(db_path, "t")
    assert final["status"] == "CONFIRMED" and final["confirmed_by"] == "reconciliation"
    assert len(sim.requests_for("t")) == 1 and sim.effects_for("t") == 1


def wait_past(text: str | None) -> None:
    """Sleep until the stored time ``text`` has passed: bounded by how far off it is
    (a lease is the whole request budget plus grace), plus room for a loaded machine."""
    assert text is not None
    ahead = (from_text(text) - utcnow()).total_seconds()  # type: ignore[operator]
    end = time.monotonic() + max(ahead, 0.0) + 30.0
    while utcnow() <= from_text(text):  # type: ignore[operator]
        assert time.monotonic() < end, "time did not pass"
        time.sleep(0.05)


def test_dispatcher_killed_mid_request_is_settled_from_the_provider_state(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, dispatch={"lease_grace": 0.7}, attempts=1)
    killed = run_cli("dispatch", "sim", "send", "--action-id", "crash", crash_at="after_send")
    assert killed.returncode == -9 and killed.stdout == ""
    mid = record(db_path, "crash")
    assert mid["status"] == "IN_FLIGHT" and mid["delivery"] == "IN_FLIGHT"
    end = time.monotonic() + 5
    while not sim.requests_for("crash"):  # the server handles the request it was sent
        assert time.monotonic() < end
        time.sleep(0.02)
    early = run_cli("reconcile", "--due", "--json")
    assert early.returncode == 0, early.stderr
    if utcnow() < from_text(mid["lease_expires_at"]):  # type: ignore[operator]
        assert record(db_path, "crash")["status"] == "IN_FLIGHT"  # a live lease is left alone
    wait_past(mid["lease_expires_at"])
    out = run_cli("reconcile", "--due", "--json")
    assert out.returncode == 0, out.stderr
    changes = json.loads(early.stdout)["changes"] + json.loads(out.stdout)["changes"]
    moves = [(c["from"], c["to"], c["kind"]) for c in changes]
    assert moves == [
        ("IN_FLIGHT", "DENIED_UNRESOLVED", "lease_expired"),
        ("DENIED_UNRESOLVED", "CONFIRMED", "reconciled"),
    ]
    final = record(db_path, "crash")
    assert final["confirmed_by"] == "reconciliation"
    assert "dispatcher lost" in final["events"][2]["detail"]["reason"]
    assert len(sim.requests_for("crash")) == 1  # no re-send
    assert sim.effects_for("crash") == 1


def test_dispatcher_killed_before_sending_is_never_confirmed_nor_resent(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, dispatch={"lease_grace": 0.2}, attempts=1, verify_deadline=0.3)
    killed = run_cli("dispatch", "sim", "send", "--action-id", "early", crash_at="after_claim")
    assert killed.returncode == -9
    wait_past(record(db_path, "early")["lease_expires_at"])
    for _ in range(40):  # bounded: the verification budget is 0.3 s
        rec = record(db_path, "early")
        if rec["status"] == "DENIED_UNRESOLVED" and rec["next_check_at"] is None:
            break
        assert run_cli("reconcile", "--due").returncode == 0
        time.sleep(0.1)
    assert rec["status"] == "DENIED_UNRESOLVED" and rec["confirmed_by"] is None
    assert "verification budget spent" in rec["reason"]
    assert sim.requests_for("early") == []
    retry = run_cli("retry", "early")
    assert retry.returncode == 7 and "reconcile" in retry.stderr and "resolve" in retry.stderr


def test_blind_is_unresolved_at_once_and_resolved_by_a_person(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim)
    code, out = dispatch("sim", "notify", "--action-id", "n", "--params", '{"to": "x"}')
    assert code == 4 and out["status"] == "DENIED_UNRESOLVED"
    assert out["eligible_at"] is None and out["next_check_at"] is None
    assert out["requires_manual_verification"] is True
    q = run_cli("queue", "--json")
    assert [(r["action_id"], r["next"]) for r in json.loads(q.stdout)] == [
        ("n", "needs a person: settled resolve n --applied|--not-applied --reason …")
    ]
    assert json.loads(run_cli("reconcile", "--due", "--json").stdout)["examined"] == 0
    res = run_cli(
        "resolve",
        "n",
        "--applied",
        "--reason",
        "recipient confirmed by phone",
        "--evidence",
        "call log 17:02",
        "--by",
        "alice",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["status"] == "CONFIRMED" and rec["confirmed_by"] == "operator:alice"
    last = record(db_path, "n")["events"][-1]
    assert (last["actor"], last["kind"], last["from_status"], last["to_status"]) == (
        "operator:alice",
        "resolved",
        "DENIED_UNRESOLVED",
        "CONFIRMED",
    )
    assert last["detail"]["evidence"] == "call log 17:02"
    assert last["detail"]["reason"] == "recipient confirmed by phone"
    assert run_cli("queue", "--fail-if-any").returncode == 0


def test_partial_is_delivered_then_queued_past_its_window_then_resolved(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, consistency_window=2.0)
    code, out = dispatch("sim", "deliver", "--action-id", "p")
    assert code == 3 and out["status"] == "AWAITING_VERIFICATION" and out["delivery"] == "DELIVERED"
    q = json.loads(run_cli("queue", "--status", "AWAITING_VERIFICATION", "--json").stdout)
    assert q[0]["next"].startswith("needs a person from")
    early = json.loads(run_cli("reconcile", "p", "--json").stdout)["changes"]
    if utcnow() < from_text(out["eligible_at"]):  # type: ignore[operator]
        assert early == []  # inside its window a partial record is left alone
    wait_past(out["eligible_at"])
    passed = early + json.loads(run_cli("reconcile", "--due", "--json").stdout)["changes"]
    assert [(c["to"], c["kind"]) for c in passed] == [("DENIED_UNRESOLVED", "unresolved")]
    assert "only a person can verify" in passed[0]["reason"]
    queued = run_cli("queue", "--fail-if-any", "--json")
    assert queued.returncode == 4 and json.loads(queued.stdout)[0]["action_id"] == "p"
    res = run_cli(
        "resolve",
        "p",
        "--not-applied",
        "--reason",
        "recipient never got it",
        "--object-id",
        out["provider_object_id"],
    )
    assert res.returncode == 0, res.stderr  # a recorded verdict exits 0, whichever it is
    final = record(db_path, "p")
    assert final["status"] == "FAILED" and final["confirmed_by"] is None
    assert final["events"][-1]["detail"]["object_id"] == out["provider_object_id"]
    assert sim.effects_for("p") == 1  # delivered once; no path confirmed it


def test_retry_only_after_failed_with_key_two(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim)
    sim.plan("r", "reject")
    code, out = dispatch("sim", "book", "--action-id", "r", "--params", '{"slot": "10:00"}')
    assert code == 5 and out["status"] == "FAILED" and out["idempotency_key"] == "r:1"
    again = run_cli("retry", "r", "--json")
    assert again.returncode == 0, again.stderr
    rec = json.loads(again.stdout)
    assert (rec["attempt"], rec["idempotency_key"], rec["status"]) == (2, "r:2", "CONFIRMED")
    assert rec["outcome"] == "dispatched" and rec["result"] == "succeeded"
    assert [r["idempotency_key"] for r in sim.requests_for("r")] == ["r:1", "r:2"]
    refused = run_cli("retry", "r")
    assert refused.returncode == 7 and "only from FAILED" in refused.stderr
    kinds = [e["kind"] for e in record(db_path, "r")["events"]]
    assert kinds == ["recorded", "claimed", "outcome", "retry", "claimed", "outcome"]


@pytest.mark.parametrize("fault", ["5xx_after", "reset_after_apply"])
def test_ambiguous_faults_never_confirm_without_the_effect(
    tmp_path: Path, sim: SimServer, db_path: Path, fault: str
) -> None:
    """Applied but unanswered → unresolved, then confirmed only by observing it."""
    configure(tmp_path, sim, dedupe=False)
    sim.plan("a", fault)
    code, out = dispatch("sim", "send", "--action-id", "a", "--wait", "--wait-timeout", "20")
    assert code == 0 and out["status"] == "CONFIRMED" and out["confirmed_by"] == "reconciliation"
    assert len(sim.requests_for("a")) == 1 and sim.effects_for("a") == 1


def test_wait_timeout_returns_pending(tmp_path: Path, sim: SimServer) -> None:
    configure(tmp_path, sim, consistency_window=30.0)
    code, out = dispatch("sim", "send", "--action-id", "w", "--wait", "--wait-timeout", "0.2")
    assert code == 3 and out["status"] == "AWAITING_VERIFICATION"
    assert "--wait: still AWAITING_VERIFICATION" in out["message"]
    assert sim.queries_for(out["reconciliation_key"]) == 0  # never checked before its window


def test_confirm_wait_exits_by_the_final_status(tmp_path: Path, sim: SimServer) -> None:
    configure(tmp_path, sim, verify_deadline=30.0)
    code, out = dispatch("sim", "send", "--action-id", "c", "--needs-confirmation")
    assert code == 3 and out["outcome"] == "recorded"
    sim.plan("c", "lag:0.2")
    got = run_cli("confirm", "c", "--wait", "--wait-timeout", "20", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["status"] == "CONFIRMED"
    assert run_cli("confirm", "c", "--wait").returncode == 0  # already completed


def test_wait_with_a_daemon_running_never_doubles_a_query(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, verify_deadline=0.6)
    daemon = popen_cli("daemon", "--interval", "0.05")
    try:
        sim.plan("d", "lost_after_accept")
        code, out = dispatch("sim", "send", "--action-id", "d", "--wait", "--wait-timeout", "20")
    finally:
        daemon.terminate()
        daemon.communicate(timeout=20)
    assert code == 4 and out["status"] == "DENIED_UNRESOLVED"
    assert sim.queries_for(out["reconciliation_key"]) == record(db_path, "d")["checks"]


def test_without_a_key_the_snapshot_attributes_the_change(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim)
    sim.put_setting("mode", "quiet")
    code, out = dispatch(
        "sim",
        "set",
        "--action-id",
        "s",
        "--params",
        '{"name": "mode", "value": "loud"}',
        "--wait",
        "--wait-timeout",
        "20",
    )
    assert code == 0 and out["status"] == "CONFIRMED", out["reason"]
    assert out["confirmed_by"] == "reconciliation"
    checked = [e for e in record(db_path, "s")["events"] if e["kind"] == "reconciled"]
    assert checked[0]["detail"]["snapshot"] == {"value": "quiet"}


def test_ambiguous_attribution_stays_unresolved_and_says_why(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    configure(tmp_path, sim, verify_deadline=0.3)
    sim.put_setting("mode", "loud")  # already the value we ask for: nothing to attribute
    code, out = dispatch(
        "sim",
        "set",
        "--action-id",
        "s",
        "--params",
        '{"name": "mode", "value": "loud"}',
        "--wait",
        "--wait-timeout",
        "20",
    )
    assert code == 4 and out["status"] == "DENIED_UNRESOLVED" and out["confirmed_by"] is None
    assert "cannot attribute" in out["reason"] and sim.effects_for("s") == 1
    assert record(db_path, "s")["events"][-1]["detail"]["seen"] == "ambiguous"
