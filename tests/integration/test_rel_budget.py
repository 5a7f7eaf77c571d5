"""Rule 15, only attempts spend a budget: a record is given up only when its deadline
has passed AND verify.min_checks attempts to check it were made, verify.interval
apart. Time with no reconciler running spends nothing; an attempt that could not
reach or even build the provider counts, is logged as check_failed in every log mode,
and names its error in the reason, so a broken verifier reaches the queue.

The library with a FakeClock against the real sim (what each attempt counts), and real
processes for the incident's two stories: a reconciler outage longer than the budget,
and a cron job whose environment lacks a ${VAR}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from invariants import check
from support import ROOT, run_cli, sim_conf, write_config

from settled import Ledger
from settled.clock import FakeClock, from_text, plus
from settled.dispatch import Dispatcher
from settled.model import Declared, Status, Tier
from settled.providers import Registry
from settled.providers.base import Observation, QueryTarget, Seen
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler

pytestmark = pytest.mark.slow(seconds=20)

INTERVAL, DEADLINE = 1.0, 5.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def sim_registry(sim: SimServer, **over: Any) -> Registry:
    conf = sim_conf(sim, verify_interval=INTERVAL, verify_deadline=DEADLINE, **over)
    return Registry({"sim": conf}, source="test")


@pytest.fixture
def reg(sim: SimServer) -> Iterator[Registry]:
    r = sim_registry(sim)
    yield r
    r.close()


def mail_conf(sim: SimServer, **verify: Any) -> dict[str, Any]:
    """The sim's `send` as an http provider whose token comes from ${MAIL_TOKEN}."""
    return {
        "type": "http",
        "base_url": sim.url,
        "timeout": 0.5,
        "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
        "operations": {
            "send": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "attempts": 1,
                "request": {"method": "POST", "path": "/v1/send"},
                "reconciliation_key_field": "reconciliation_key",
                "query": {"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
                "status": "/status",
                "applied": ["delivered"],
                "not_applied": ["bounced"],
                "verify": {"interval": INTERVAL, "deadline": DEADLINE, "min_checks": 3, **verify},
            }
        },
    }


def send(d: Dispatcher, sim: SimServer, aid: str, fault: str = "ok", provider: str = "sim") -> str:
    sim.plan(aid, fault)
    rec = d.submit(provider, "send", {"to": f"{aid}@example.com"}, action_id=aid).record
    assert rec is not None and rec.status is Status.AWAITING_VERIFICATION, rec
    return rec.reconciliation_key or ""


# -- what counts -------------------------------------------------------------------------------


def test_an_outage_spends_nothing_and_min_checks_decide(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    """No reconciler for twenty budgets' time: the first pass after it checks once and
    gives nothing up; a record is given up only at its third check, a second apart."""
    d = Dispatcher(mem_ledger, reg, clock=clock)
    lost = send(d, sim, "lost", "lost_after_accept")
    send(d, sim, "seen", "ok")
    clock.advance(20 * DEADLINE)  # the outage
    r = Reconciler(mem_ledger, reg, clock=clock)
    first = r.run_due()
    assert first.counts() == {"CONFIRMED": 1}
    rec = mem_ledger.get("lost")
    assert rec.status is Status.AWAITING_VERIFICATION and (rec.checks, rec.counted_checks) == (1, 1)
    assert "past its deadline: 1 of at least 3 checks made" in (rec.reason or "")
    assert rec.next_check_at == plus_text(clock, INTERVAL)
    assert r.run_due().examined == 0  # the next check is an interval away
    r.run_ids(["lost"])  # forced early: evidence, but it does not count
    rec = mem_ledger.get("lost")
    assert (rec.checks, rec.counted_checks) == (2, 1) and rec.status is Status.AWAITING_VERIFICATION
    clock.advance(INTERVAL)
    r.run_due()
    assert mem_ledger.get("lost").counted_checks == 2
    assert mem_ledger.get("lost").status is Status.AWAITING_VERIFICATION
    clock.advance(INTERVAL)
    report = r.run_due()
    assert [(c.action_id, c.to_status) for c in report.changes] == [("lost", "DENIED_UNRESOLVED")]
    rec = mem_ledger.get("lost")
    assert (rec.checks, rec.counted_checks) == (4, 3) and rec.next_check_at is None
    assert rec.reason == (
        "verification budget spent after 4 checks: accepted but never visible; "
        "last: not_yet (no effect visible yet)"
    )
    assert sim.queries_for(lost) == 4
    check(mem_ledger, sim, final=False)


def plus_text(clock: FakeClock, seconds: float) -> str:
    from settled.clock import to_text

    return to_text(plus(clock.now(), seconds))


def test_the_checks_that_count_are_an_interval_apart_even_at_the_deadline(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    """A reconciler running all along: checks every interval, the last counted ones
    never crammed into the deadline; given up once both conditions hold."""
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "a", "lost_after_accept")
    r = Reconciler(mem_ledger, reg, clock=clock)
    times = []
    for _ in range(20):
        rec = mem_ledger.get("a")
        if rec.status is not Status.AWAITING_VERIFICATION:
            break
        due = from_text(rec.next_check_at)
        assert due is not None
        clock.advance(max(0.0, (due - clock.now()).total_seconds()) + 0.3)
        r.run_due()
        times.append(clock.now())
    rec = mem_ledger.get("a")
    assert rec.status is Status.DENIED_UNRESOLVED and rec.counted_checks == rec.checks
    gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
    assert all(g >= INTERVAL for g in gaps), gaps
    assert from_text(rec.verify_deadline_at) <= times[-1]  # type: ignore[operator]


def test_a_failed_attempt_counts_and_says_why_the_record_could_not_be_checked(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "a", "ok")
    down = sim_registry(sim, base_url="http://127.0.0.1:9", timeout=0.3)  # connection refused
    try:
        r = Reconciler(mem_ledger, down, clock=clock)
        failed: list[Any] = []
        r.on_check = failed.append
        clock.advance(DEADLINE + 1)
        r.run_due()
        rec = mem_ledger.get("a")
        assert (rec.checks, rec.counted_checks) == (1, 1) and "ConnectError" in (
            rec.check_error or ""
        )
        assert rec.reason and rec.reason.startswith("could not be checked (1 attempt so far): ")
        assert [ch.error for ch in failed] == [rec.check_error]
        assert mem_ledger.check_failures() == {"sim": 1}
        for _ in range(2):
            clock.advance(INTERVAL)
            report = r.run_due()
        assert report.changes[0].error == mem_ledger.get("a").check_error  # logged, too
    finally:
        down.close()
    rec = mem_ledger.get("a")
    assert rec.status is Status.DENIED_UNRESOLVED and rec.counted_checks == 3
    assert rec.reason and rec.reason.startswith("could not be checked after 3 attempts: ")
    assert "ConnectError" in rec.reason
    assert mem_ledger.check_failures() == {"sim": 1}  # still broken: the record waits for it
    Reconciler(mem_ledger, reg, clock=clock).run_ids(["a"])  # the provider is back
    rec = mem_ledger.get("a")
    assert rec.status is Status.CONFIRMED and rec.check_error is None
    assert mem_ledger.check_failures() == {}
    check(mem_ledger, sim, final=False)


def test_a_provider_that_cannot_be_built_is_a_failed_attempt(
    mem_ledger: Ledger, sim: SimServer, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAIL_TOKEN", "t0ken-1234")
    with Registry({"mail": mail_conf(sim)}, source="test") as good:
        d = Dispatcher(mem_ledger, good, clock=clock)
        send(d, sim, "m", provider="mail")
    monkeypatch.delenv("MAIL_TOKEN")
    with Registry({"mail": mail_conf(sim)}, source="test") as broken:
        r = Reconciler(mem_ledger, broken, clock=clock)
        clock.advance(DEADLINE + 1)
        seen = []
        for _ in range(3):
            report = r.run_due()
            seen.append(report)
            clock.advance(INTERVAL)
    assert set(seen[0].unusable) == {"mail"} and "MAIL_TOKEN is not set" in seen[0].unusable["mail"]
    rec = mem_ledger.get("m")
    assert rec.status is Status.DENIED_UNRESOLVED and rec.counted_checks == 3
    assert rec.reason and rec.reason.startswith(
        "could not be checked after 3 attempts: provider mail"
    )
    assert "MAIL_TOKEN is not set" in rec.reason and "t0ken" not in rec.reason
    assert sim.queries_for(rec.reconciliation_key or "") == 0  # nothing could even be asked


def test_a_provider_not_configured_here_waits_without_spending(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "a", "lost_after_accept")
    elsewhere = Registry({}, source="test")  # another host has the provider
    clock.advance(DEADLINE * 10)
    for _ in range(5):
        report = Reconciler(mem_ledger, elsewhere, clock=clock, lease=1.0).run_due()
        assert report.unusable == {} and not report.changes
        clock.advance(2.0)
    rec = mem_ledger.get("a")
    assert rec.status is Status.AWAITING_VERIFICATION and (rec.checks, rec.counted_checks) == (0, 0)
    assert rec.check_error is None and "not configured here" in (rec.reason or "")


class Throttling:
    """The sim provider whose queries are all answered 429."""

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


def test_a_pause_the_provider_asks_for_is_not_an_attempt(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    send(d, sim, "a", "lost_after_accept")
    busy = Registry({}, source="test")
    busy.add(Throttling(reg.provider("sim")))
    clock.advance(DEADLINE * 10)
    for _ in range(5):
        Reconciler(mem_ledger, busy, clock=clock).run_due()
        clock.advance(5.0)
    rec = mem_ledger.get("a")
    assert rec.status is Status.AWAITING_VERIFICATION
    assert (rec.checks, rec.counted_checks) == (0, 0)  # no attempt, nothing spent
    # ... but a check that is failing all the same: the gauges and the queue see it
    assert rec.check_error == "paused: sim answered HTTP 429; not checked until it recovers"
    assert "asked for a pause (HTTP 429)" in (rec.reason or "")


def test_a_lost_reply_and_a_never_visible_effect_have_different_reasons(
    mem_ledger: Ledger, reg: Registry, sim: SimServer, clock: FakeClock
) -> None:
    d = Dispatcher(mem_ledger, reg, clock=clock)
    sim.plan("hung", "timeout_before_apply")  # no answer, and nothing applied
    assert d.submit("sim", "send", {"to": "x"}, action_id="hung").record.status is (  # type: ignore[union-attr]
        Status.DENIED_UNRESOLVED
    )
    send(d, sim, "quiet", "lost_after_accept")
    r = Reconciler(mem_ledger, reg, clock=clock)
    clock.advance(DEADLINE + 60)
    r.run_due()
    waiting = mem_ledger.get("hung")
    assert (waiting.reason or "").startswith(
        "the send got no answer (reply lost); checked: not_yet"
    )
    for _ in range(3):
        clock.advance(INTERVAL)
        r.run_due()
    hung, quiet = mem_ledger.get("hung"), mem_ledger.get("quiet")
    assert hung.status is quiet.status is Status.DENIED_UNRESOLVED
    assert "reply lost" in (hung.reason or "") and "never became visible" in (hung.reason or "")
    assert "accepted but never visible" in (quiet.reason or "")
    assert hung.reason != quiet.reason


@pytest.mark.ledger_incidental
def test_records_stored_without_min_checks_read_as_three() -> None:
    stored = Declared(Tier.RECONCILABLE, queryable=True).to_json()
    del stored["verify_min_checks"]
    assert Declared.from_json(stored).verify_min_checks == 3


# -- real processes ----------------------------------------------------------------------------


def ledger_now(db_path: Any) -> Any:
    with Ledger.open(db_path) as led:
        return led.clock(anchor=False).now()


def wait_until_due(db_path: Any, timeout: float = 30.0) -> None:
    """Wait (bounded) until some record's check is due by the ledger's clock."""
    deadline = time.monotonic() + timeout
    while True:
        with Ledger.open(db_path) as led:
            now = led.clock(anchor=False).now()
            due = [from_text(r.next_check_at) for r in led.query() if r.next_check_at]
        if not due or min(due) <= now:  # type: ignore[type-var,operator]
            return
        assert time.monotonic() < deadline, "no check fell due"
        time.sleep(0.05)


def test_a_reconciler_outage_longer_than_the_budget_gives_nothing_up_early(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    """Dispatch, then no reconciler while every budget runs out, then cron passes: the
    first pass gives nothing up; the late-delivered effects are CONFIRMED when they
    show; the never-delivered ones are given up after exactly three checks."""
    conf = sim_conf(sim, verify_interval=0.3, verify_deadline=0.5, verify_min_checks=3)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    plan = {
        **{f"lost-{i}": "lost_after_accept" for i in range(4)},
        **{f"late-{i}": "lag:6" for i in range(4)},
        **{f"now-{i}": "ok" for i in range(4)},
    }
    for aid, fault in plan.items():
        sim.plan(aid, fault)
    src = tmp_path / "mails.jsonl"
    src.write_text("".join(json.dumps({"action_id": a, "params": {"to": a}}) + "\n" for a in plan))
    sent = run_cli("dispatch", "sim", "send", "--from", str(src), "--json")
    assert sent.returncode == 3, sent.stderr  # accepted, nothing verified yet
    with Ledger.open(db_path) as led:
        keys = {r.action_id: r.reconciliation_key or "" for r in led.query()}
        deadline = max(from_text(r.verify_deadline_at) for r in led.query())  # type: ignore[type-var]
    until = time.monotonic() + 30
    while ledger_now(db_path) <= deadline:  # the outage outlasts every budget
        assert time.monotonic() < until
        time.sleep(0.05)
    assert all(sim.queries_for(k) == 0 for k in keys.values())  # nothing checked meanwhile
    first = run_cli("reconcile", "--due", "--json")
    assert first.returncode == 0, first.stderr
    with Ledger.open(db_path) as led:
        given_up = [r.action_id for r in led.query(statuses=["DENIED_UNRESOLVED"])]
    assert given_up == []  # one check after an outage spends no budget
    for aid in plan:
        if aid.startswith("late"):
            until = time.monotonic() + 30
            while sim.effect_view(keys[aid]) is None:  # the effect lands after the outage
                assert time.monotonic() < until
                time.sleep(0.05)
    for _ in range(10):  # cron passes until nothing is scheduled (bounded)
        with Ledger.open(db_path) as led:
            if all(r.next_check_at is None for r in led.query()):
                break
        wait_until_due(db_path)
        assert run_cli("reconcile", "--due").returncode == 0
    with Ledger.open(db_path) as led:
        recs = {r.action_id: r for r in led.query()}
        check(led, sim, ids=plan)
    for aid, rec in recs.items():
        if aid.startswith(("late", "now")):
            assert rec.status is Status.CONFIRMED and rec.confirmed_by == "reconciliation", rec
        else:
            assert rec.status is Status.DENIED_UNRESOLVED, rec
            assert (rec.checks, rec.counted_checks) == (3, 3) and sim.queries_for(keys[aid]) == 3
            assert "verification budget spent after 3 checks: accepted but never visible" in (
                rec.reason or ""
            )


def cron(db_path: Any, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`settled` as cron runs it: an empty environment but for PATH, explicit paths."""
    return subprocess.run(
        [sys.executable, "-m", "settled", "--db", str(db_path), "--config", str(config), *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(ROOT),
        timeout=60,
        check=False,
    )


def test_a_missing_var_under_cron_is_logged_counted_and_reaches_the_queue(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    config = write_config(
        tmp_path / "settled.toml", {"mail": mail_conf(sim, interval=0.3, deadline=0.5)}
    )
    token = {"MAIL_TOKEN": "s3cret-t0ken-value"}
    for aid in ("m1", "m2"):
        out = run_cli(
            "dispatch", "mail", "send", "--action-id", aid, "--params", '{"to": "x"}', env=token
        )
        assert out.returncode == 3, out.stderr  # delivered, as the incident's mails were
    runs = []
    for _ in range(8):  # cron runs (bounded) until the records are given up
        wait_until_due(db_path)
        done = cron(db_path, config, "reconcile", "--due", "--log", "json")
        runs.append(done)
        with Ledger.open(db_path) as led:
            if len(led.query(statuses=["DENIED_UNRESOLVED"])) == 2:
                break
    for done in runs:
        assert done.returncode == 1 and done.stdout == "", done.stderr
        log = [json.loads(line) for line in done.stderr.splitlines()]
        failed = [e for e in log if e["event"] == "check_failed"]
        assert failed and all(e["error"] == "ProviderUnavailable" for e in failed), log
        assert all("MAIL_TOKEN is not set" in e["message"] for e in failed)
        broken = [e for e in log if e["event"] == "providers_unusable"]
        assert len(broken) == 1 and broken[0]["providers"] == ["mail"]
    text = cron(db_path, config, "reconcile", "m1")  # a person's look, in words
    assert "check_failed: ProviderUnavailable" in text.stdout
    errors = [line for line in text.stderr.splitlines() if line.startswith("settled: error:")]
    assert len(errors) == 1 and "MAIL_TOKEN is not set" in errors[0]
    monitor = cron(db_path, config, "queue", "--older-than", "0s", "--fail-if-any", "--json")
    assert monitor.returncode == 4, monitor.stderr  # the page fires
    rows = json.loads(monitor.stdout)
    assert sorted(r["action_id"] for r in rows) == ["m1", "m2"]
    for r in rows:
        assert r["status"] == "DENIED_UNRESOLVED" and r["counted_checks"] >= 3
        assert r["reason"].startswith("could not be checked after ")
        assert "MAIL_TOKEN is not set" in r["reason"] and r["check_error"]
        assert r["next"] == f"settled reconcile {r['action_id']}"
    for done in [*runs, text, monitor]:
        assert "s3cret-t0ken-value" not in done.stdout + done.stderr
