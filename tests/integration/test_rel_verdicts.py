"""Rule 14, a verdict is weighed against the world: before a person's "not applied"
verdict is recorded, and before `retry` opens a new attempt, on an operation that has a
query, settled checks the provider once more. Effect visible: refused (exit 7) and the
record settles by that evidence. No check possible: refused unless --no-recheck, which
the event records.

Real `settled` processes against the sim server on loopback (a `lag` fault makes an
applied effect visible only seconds later), checked against the sim's ground truth:
the incident's duplicate (a late effect, a person's "not applied", a retry) never
happens again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from invariants import check, dump
from support import PATIENT, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.errors import EffectVisible, RecheckFailed
from settled.model import Status
from settled.providers import Registry
from settled.providers.base import Observation, QueryTarget, Seen
from settled.providers.sim_server import SimServer
from settled.resolve import resolve

pytestmark = pytest.mark.slow(seconds=30)

LAG = 3.0  # s before a late effect shows: far longer than a give-up after 0.3 s


def configure(tmp_path: Path, sim: SimServer, **over: Any) -> Path:
    conf = sim_conf(
        sim,
        **{"timeout": PATIENT, **over},  # nothing here is about a reply timing out
        verify_interval=0.1,
        verify_deadline=0.3,
        verify_min_checks=3,
    )
    return write_config(tmp_path / "settled.toml", {"sim": conf})


def dispatch(*args: str) -> tuple[int, dict[str, Any]]:
    out = run_cli("dispatch", *args, "--json")
    return out.returncode, json.loads(out.stdout)


def record(db_path: Any, aid: str) -> dict[str, Any]:
    with Ledger.open(db_path) as led:
        rec = led.get(aid).to_json()
        rec["events"] = [e.to_json() for e in led.events(aid)]
        return rec


def given_up(aid: str, fault: str, sim: SimServer) -> dict[str, Any]:
    """An accepted send whose effect the verifier never saw: `--wait` gives it up."""
    sim.plan(aid, fault)
    code, out = dispatch("sim", "send", "--action-id", aid, "--wait", "--wait-timeout", "30")
    assert code == 4 and out["status"] == "DENIED_UNRESOLVED", out
    assert out["counted_checks"] >= 3 and "accepted but never visible" in out["reason"]
    return out


def wait_visible(sim: SimServer, key: str, timeout: float = 30.0) -> None:
    """Wait for the provider to show the effect (the event), never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while sim.effect_view(key) is None:
        assert time.monotonic() < deadline, f"the effect of {key} never became visible"
        time.sleep(0.05)


def invariants(db_path: Any, sim: SimServer) -> None:
    with Ledger.open(db_path) as led:
        check(led, sim, final=False)


def test_a_late_effect_refuses_the_verdict_and_the_retry_sends_nothing(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    """The incident: a `lag` send given up by `--wait`; the person's "not applied"
    comes after the effect landed; then `retry`. One effect, CONFIRMED."""
    configure(tmp_path, sim)
    out = given_up("dup-1", f"lag:{LAG}", sim)
    wait_visible(sim, out["reconciliation_key"])
    res = run_cli("resolve", "dup-1", "--not-applied", "--reason", "not visible")
    assert res.returncode == 7, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "sees the effect" in res.stderr
    rec = record(db_path, "dup-1")
    assert rec["status"] == "CONFIRMED" and rec["confirmed_by"] == "reconciliation"
    seen, claim = rec["events"][-2:]
    assert (seen["kind"], seen["from_status"], seen["to_status"], seen["actor"]) == (
        "reconciled",
        "DENIED_UNRESOLVED",
        "CONFIRMED",
        "recheck",
    )
    assert "resolve --not-applied" in seen["detail"]["recheck_for"]
    assert not [e for e in rec["events"] if e["kind"] == "resolved"]  # no verdict recorded
    assert (claim["kind"], claim["from_status"], claim["to_status"]) == (
        "note",
        "CONFIRMED",
        "CONFIRMED",
    )  # the person's claim is kept, refused, beside the evidence that refused it
    assert (
        claim["detail"]["verdict"] == "not_applied"
        and "sees the effect" in claim["detail"]["refused"]
    )
    assert claim["detail"]["reason"] == "not visible" and claim["actor"].startswith("operator:")
    retry = run_cli("retry", "dup-1")
    assert retry.returncode == 7 and "only from FAILED" in retry.stderr
    assert sim.effects_for("dup-1") == 1 and len(sim.requests_for("dup-1")) == 1
    invariants(db_path, sim)


def test_no_recheck_records_the_verdict_and_retry_still_checks_first(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    configure(tmp_path, sim)
    out = given_up("dup-2", f"lag:{LAG}", sim)
    res = run_cli("resolve", "dup-2", "--not-applied", "--reason", "not there", "--no-recheck")
    assert res.returncode == 0, res.stderr
    rec = record(db_path, "dup-2")
    assert rec["status"] == "FAILED"
    verdict = rec["events"][-1]
    assert (
        verdict["kind"] == "resolved" and verdict["detail"]["recheck"] == "skipped (--no-recheck)"
    )
    assert "skipped (--no-recheck)" in run_cli("show", "dup-2").stdout
    wait_visible(sim, out["reconciliation_key"])
    retry = run_cli("retry", "dup-2", "--json")
    assert retry.returncode == 7 and "sees the effect" in retry.stderr, retry.stderr
    assert retry.stdout == ""
    rec = record(db_path, "dup-2")
    assert rec["status"] == "CONFIRMED" and rec["attempt"] == 1  # corrected by the evidence
    assert rec["confirmed_by"] == "reconciliation" and rec["acceptance"] == "ACCEPTED"
    fixed = rec["events"][-1]
    assert (fixed["kind"], fixed["from_status"], fixed["to_status"]) == (
        "reconciled",
        "FAILED",
        "CONFIRMED",
    )
    assert sim.effects_for("dup-2") == 1 and len(sim.requests_for("dup-2")) == 1
    invariants(db_path, sim)  # the correction by evidence is in the transition table


def test_a_verdict_the_world_agrees_with_is_recorded_with_what_the_check_saw(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    configure(tmp_path, sim)
    out = given_up("lost", "lost_after_accept", sim)
    asked = sim.queries_for(out["reconciliation_key"])
    res = run_cli("resolve", "lost", "--not-applied", "--reason", "bounce report 7")
    assert res.returncode == 0, res.stderr
    rec = record(db_path, "lost")
    assert rec["status"] == "FAILED"
    assert rec["events"][-1]["detail"]["recheck"].startswith("not_yet")
    assert sim.queries_for(out["reconciliation_key"]) == asked + 1 == rec["checks"]
    retry = run_cli("retry", "lost", "--json")
    assert retry.returncode == 3, retry.stderr  # attempt 2 accepted, not yet verified
    again = json.loads(retry.stdout)
    assert (again["attempt"], again["idempotency_key"]) == (2, "lost:2")
    opened = next(e for e in record(db_path, "lost")["events"] if e["kind"] == "retry")
    assert opened["detail"]["recheck"].startswith("not_yet")
    assert [r["idempotency_key"] for r in sim.requests_for("lost")] == ["lost:1", "lost:2"]
    invariants(db_path, sim)


def test_without_a_possible_check_the_verdict_and_the_retry_are_refused(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    configure(tmp_path, sim)
    given_up("u", "lost_after_accept", sim)
    for config in (
        {"sim": sim_conf(sim, base_url="http://127.0.0.1:9", timeout=0.3)},  # unreachable
        {},  # not configured here at all
    ):
        write_config(tmp_path / "settled.toml", dict(config))
        before = record(db_path, "u")
        res = run_cli("resolve", "u", "--not-applied", "--reason", "gone", "--by", "erin")
        assert res.returncode == 7 and "could not be made" in res.stderr, res.stderr
        assert "--no-recheck" in res.stderr and len(res.stderr.strip().splitlines()) == 1
        after = record(db_path, "u")  # a refused verdict moves nothing; the claim is kept
        assert after["status"] == before["status"] == "DENIED_UNRESOLVED"
        assert after["events"][:-1] == before["events"]
        claim = after["events"][-1]
        assert (claim["kind"], claim["actor"], claim["detail"]["reason"]) == (
            "note",
            "operator:erin",
            "gone",
        )
        assert "could not be made" in claim["detail"]["refused"]
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, base_url="http://127.0.0.1:9")})
    res = run_cli("resolve", "u", "--not-applied", "--reason", "gone", "--no-recheck")
    assert res.returncode == 0, res.stderr
    before = dump(db_path)
    refused = run_cli("retry", "u")
    assert refused.returncode == 7 and "could not be made" in refused.stderr
    assert dump(db_path) == before and len(sim.requests_for("u")) == 1
    configure(tmp_path, sim)  # reachable again: the check runs and sees nothing
    sent = run_cli("retry", "u", "--json")
    assert sent.returncode == 3, sent.stderr
    assert [r["idempotency_key"] for r in sim.requests_for("u")] == ["u:1", "u:2"]


def test_an_applied_verdict_and_a_query_free_operation_need_no_check(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    configure(tmp_path, sim)
    code, _ = dispatch("sim", "notify", "--action-id", "blind", "--params", '{"to": "x"}')
    assert code == 4
    write_config(tmp_path / "settled.toml", {})  # nothing to check with, and none needed
    res = run_cli("resolve", "blind", "--not-applied", "--reason", "never arrived")
    assert res.returncode == 0, res.stderr
    detail = record(db_path, "blind")["events"][-1]["detail"]
    assert detail["recheck"] == "not needed: no query can observe this effect"
    configure(tmp_path, sim)
    given_up("yes", "lost_after_accept", sim)
    write_config(tmp_path / "settled.toml", {})
    res = run_cli("resolve", "yes", "--applied", "--reason", "customer confirmed")
    assert res.returncode == 0, res.stderr
    assert "recheck" not in record(db_path, "yes")["events"][-1]["detail"]


def test_bulk_resolve_checks_each_record_and_reports_which_were_refused(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    """The README's bulk example on delivered mails: the late one is refused and
    CONFIRMED, the lost one recorded; the exit code is the highest of the lines."""
    configure(tmp_path, sim)
    late = given_up("m-late", f"lag:{LAG}", sim)
    given_up("m-lost", "lost_after_accept", sim)
    wait_visible(sim, late["reconciliation_key"])
    preview = run_cli("resolve", "--provider", "sim", "--not-applied", "--reason", "b", "--dry-run")
    assert preview.returncode == 0
    assert preview.stdout.count("FAILED unless a check sees it") == 2
    out = run_cli(
        "resolve", "--provider", "sim", "--not-applied", "--reason", "bounced", "--yes", "--json"
    )
    assert out.returncode == 7, out.stderr
    rows = {r["action_id"]: r for r in json.loads(out.stdout)}
    assert rows["m-lost"]["resolved"] is True and rows["m-lost"]["status"] == "FAILED"
    assert rows["m-late"]["resolved"] is False and rows["m-late"]["status"] == "CONFIRMED"
    assert "sees the effect" in rows["m-late"]["skipped"]
    human = run_cli("resolve", "m-late", "m-lost", "--not-applied", "--reason", "b", "--yes")
    assert human.returncode == 7  # both settled meanwhile: refused, each with why
    assert "m-late:" in human.stderr and "m-lost:" in human.stderr
    invariants(db_path, sim)


# -- the library ------------------------------------------------------------------------------


class Throttled:
    """The sim provider, but every query is answered 429 (a provider asking for a pause)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name

    def operations(self) -> Any:
        return self.inner.operations()

    def execute(self, request: Any) -> Any:
        return self.inner.execute(request)

    def query(self, target: QueryTarget) -> Observation:
        return Observation(
            Seen.UNKNOWN, detail="unexpected reply HTTP 429", evidence={"status_code": 429}
        )

    def snapshot(self, operation: str, params: Any) -> Any:
        return None

    def close(self) -> None:
        self.inner.close()


def unresolved(ledger: Ledger, aid: str) -> None:
    """Give a record up at once, as a spent budget would."""
    from settled import policy

    now = ledger.clock().now()
    ledger.move(policy.unresolved(ledger.get(aid), now, "given up", {}, owner=None, actor="t"))


def test_the_library_takes_the_registry_and_records_what_it_checked(
    ledger: Ledger, patient: Registry, sim: SimServer
) -> None:
    d = Dispatcher(ledger, patient)
    sim.plan("a", "lost_after_accept")
    d.submit("sim", "send", {"to": "x"}, action_id="a")
    unresolved(ledger, "a")
    now = ledger.clock().now()
    before = ledger.events("a")
    with pytest.raises(RecheckFailed, match="no provider registry"):
        resolve(ledger, "a", applied=False, reason="r", by="ops", now=now)
    throttled = Registry({}, source="test")
    throttled.add(Throttled(patient.provider("sim")))
    with pytest.raises(RecheckFailed, match="asked for a pause"):
        resolve(ledger, "a", applied=False, reason="r", by="ops", now=now, registry=throttled)
    after = ledger.events("a")  # the refused claim is kept, and moves nothing
    assert after[:-1] == before and ledger.get("a").status is Status.DENIED_UNRESOLVED
    assert (after[-1].kind, after[-1].actor, after[-1].detail["reason"]) == (
        "note",
        "operator:ops",
        "r",
    )
    assert "asked for a pause" in after[-1].detail["refused"]
    done = resolve(ledger, "a", applied=False, reason="r", by="ops", now=now, recheck=False)
    assert done.status is Status.FAILED
    assert ledger.events("a")[-1].detail["recheck"] == "skipped (--no-recheck)"
    with pytest.raises(RecheckFailed, match="asked for a pause"):
        Dispatcher(ledger, throttled).retry("a")
    assert ledger.get("a").status is Status.FAILED and len(sim.requests_for("a")) == 1
    report = Dispatcher(ledger, patient).retry("a")
    assert report.record is not None and report.record.attempt == 2
    opened = next(e for e in ledger.events("a") if e.kind == "retry")
    assert opened.detail["recheck"].startswith("not_yet")
    assert len(sim.requests_for("a")) == 2


def test_the_library_refuses_a_retry_of_a_visible_effect_and_corrects_the_record(
    ledger: Ledger, patient: Registry, sim: SimServer
) -> None:
    """A FAILED record whose effect is there after all (a person's --no-recheck
    verdict was wrong): the retry is refused with the record as the evidence left it."""
    d = Dispatcher(ledger, patient)
    sim.plan("w", f"lag:{LAG}")
    d.submit("sim", "send", {"to": "x"}, action_id="w")
    unresolved(ledger, "w")
    now = ledger.clock().now()
    resolve(ledger, "w", applied=False, reason="r", by="ops", now=now, recheck=False)
    wait_visible(sim, ledger.get("w").reconciliation_key or "")
    with pytest.raises(EffectVisible) as refused:
        d.retry("w")
    assert refused.value.record.status is Status.CONFIRMED  # type: ignore[attr-defined]
    assert ledger.get("w").status is Status.CONFIRMED and sim.effects_for("w") == 1
    assert len(sim.requests_for("w")) == 1
    check(ledger, sim, final=False)
