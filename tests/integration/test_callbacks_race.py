"""The race rule 16 is about, with real processes: a provider calls back before its
reply reaches settled (the record is IN_FLIGHT, its object id unknown). The callback is
delivered over real HTTP, signed, by the sim, to a real ``settled serve`` process at
``POST /hooks/sim``; the dispatcher is a real ``settled`` process, paused at
``after_reply``, killed there, or left to race. Each record ends as the sim's ground
truth says, with one effect, and the service logged each callback it answered."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import budget
from serving import Running, process
from support import popen_cli, sim_conf, write_config

from settled import Ledger, config
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import CallbackPlan, SimServer
from settled.reconcile import Reconciler

pytestmark = pytest.mark.slow

SECRET = "whsec_" + "c2V0dGxlZC1zaW0tY2FsbGJhY2stc2VjcmV0"  # base64 of a test secret
WAIT = 60.0  # s: a generous bound for a loaded machine
RACES = 4  # rounds of (after, before, both), times SETTLED_TEST_BUDGET

STD = {
    "scheme": "standard-webhooks",
    "secret": "${SIM_HOOK_SECRET}",
    "names": "provider_object_id",
    "key": "/data/id",
    "status": "/data/status",
    "applied": ["applied", "delivered"],
    "not_applied": ["bounced"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


def wait_for(what: Any, within: float = WAIT) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting after {within} s")


@pytest.fixture
def env() -> dict[str, str]:
    return {"SIM_HOOK_SECRET": SECRET}


def start(
    tmp_path: Path, sim: SimServer, table: dict[str, Any], env: dict[str, str], *, when: str
) -> Iterator[Running]:
    """``settled serve`` receiving the sim's callbacks at ``/hooks/sim``, signed with the
    secret the config names; the sim set to call back there."""
    port = free_port()  # the twilio scheme signs the hook's URL: it is known before start
    hook = f"http://127.0.0.1:{port}/hooks/sim"
    table = {**table, **({"url": hook} if table["scheme"] == "twilio" else {})}
    write_config(
        tmp_path / "settled.toml",
        {"sim": {**sim_conf(sim), "callbacks": table}},
        dispatch={"lease_grace": 0.3},
    )
    with process(env=env, listen=f"127.0.0.1:{port}") as svc:
        assert svc.url == f"http://127.0.0.1:{port}"
        sim.callbacks = CallbackPlan(hook, table["scheme"], env["SIM_HOOK_SECRET"], when)
        yield svc
        assert svc.stop() == 0
        logged = [e for e in svc.rest() if e.get("route") == "/hooks/{provider}"]
        # every callback the sim posted was answered by the service and logged, body-less
        assert len(logged) == len(sim.truth()["callbacks"]) >= 1
        assert all(e["status"] == 200 and e["callback"]["provider"] == "sim" for e in logged)
        assert not any(SECRET in json.dumps(e) for e in svc.seen)


@pytest.fixture
def std_hooks(tmp_path: Path, sim: SimServer, env: dict[str, str]) -> Iterator[Running]:
    yield from start(tmp_path, sim, STD, env, when="before")


def settled_as_truth(ledger: Ledger, sim: SimServer, aid: str) -> None:
    rec = ledger.get(aid)
    assert sim.effects_for(aid) == 1  # one effect, and the sim reported it
    assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:sim"
    kinds = [e.kind for e in ledger.events(aid)]
    assert kinds.count("callback") == len(sim.callbacks_for(aid)) >= 1
    assert kinds.count("claimed") == 1


def test_a_callback_kept_while_the_dispatcher_is_paused_after_the_reply(
    std_hooks: Running, sim: SimServer, db_path: Any
) -> None:
    """Partial tier: only the provider's report can settle it without a person. The sim
    calls back before replying; the dispatcher is stopped right after the reply, so the
    hook finds the record in flight and keeps the callback; once the dispatcher goes on
    and writes its outcome, the kept callback is matched at once."""
    for n in range(4):
        aid = f"paused-{n}"
        proc = popen_cli(
            "dispatch",
            "sim",
            "deliver",
            "--params",
            json.dumps({"n": n}),
            "--action-id",
            aid,
            "--json",
            pause_at="after_reply",
        )
        try:
            wait_for(lambda p=proc: stopped(p.pid))
            sent = sim.callbacks_for(aid)
            assert [(c["when"], c["code"]) for c in sent] == [("before", 200)]
            assert json.loads(sent[0]["answer"]) == {"received": 1, "pending": 1}
            with Ledger.open(db_path) as led:
                held = led.get(aid)
                assert held.status is Status.IN_FLIGHT and held.provider_object_id is None
                # it names an object id the record does not have yet: kept for the provider
                assert led.pending_callbacks(held) == 0
                assert led.callback_figures()["sim"].pending == 1
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert json.loads(out)["status"] == "CONFIRMED"
        with Ledger.open(db_path) as led:
            settled_as_truth(led, sim, aid)
            assert led.callback_figures()["sim"].pending == 0


def test_callbacks_racing_the_outcome(std_hooks: Running, sim: SimServer, db_path: Any) -> None:
    """No pause: the callback comes before, after, or both sides of the reply, and the
    dispatcher writes its outcome whenever it gets there. Every run ends the same."""
    order = ["after", "before", "both"] * max(1, round(RACES * budget()))
    for n, when in enumerate(order):
        aid = f"race-{n}"
        sim.plan_callback(aid, when)
        proc = popen_cli(
            "dispatch",
            "sim",
            "send" if n % 2 else "deliver",
            "--params",
            json.dumps({"n": n}),
            "--action-id",
            aid,
            "--json",
        )
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode in (0, 3), err
        expected = 2 if when == "both" else 1
        with Ledger.open(db_path) as led:
            # an "after" callback may still be on its way when the dispatcher exits
            wait_for(lambda a=aid, ld=led: ld.get(a).status is Status.CONFIRMED)
            wait_for(
                lambda a=aid, k=expected: (
                    len(sim.callbacks_for(a)) == k
                    and all(c["code"] == 200 for c in sim.callbacks_for(a))
                )
            )
            settled_as_truth(led, sim, aid)


@pytest.fixture
def twilio_hooks(tmp_path: Path, sim: SimServer, env: dict[str, str]) -> Iterator[Running]:
    # named by settled's key, which the request carried: a lost reply loses no callback
    table = {
        "scheme": "twilio",
        "secret": "${SIM_HOOK_SECRET}",
        "names": "reconciliation_key",
        "key": "Key",
        "status": "MessageStatus",
        "applied": ["delivered"],
        "not_applied": ["bounced"],
    }
    yield from start(
        tmp_path, sim, table, {**env, "SIM_HOOK_SECRET": "twilio-token"}, when="before"
    )


def test_a_dispatcher_killed_after_the_reply_is_settled_by_its_callback(
    twilio_hooks: Running, sim: SimServer, db_path: Any, tmp_path: Path
) -> None:
    """Killed after the reply: no outcome, no object id. The callback (Twilio style,
    naming the reconciliation key) was kept, bound to the record in flight; when the lease lapses, a pass turns the
    record unresolved and the kept callback settles it there and then."""
    aid = "killed-1"
    proc = popen_cli(
        "dispatch", "sim", "deliver", "--params", "{}", "--action-id", aid, crash_at="after_reply"
    )
    proc.communicate(timeout=WAIT)
    assert proc.returncode == -signal.SIGKILL
    assert [c["code"] for c in sim.callbacks_for(aid)] == [200]
    cfg = config.load(str(tmp_path / "settled.toml"))
    with Ledger.open(db_path) as led, Registry(cfg.providers) as reg:
        assert led.get(aid).status is Status.IN_FLIGHT

        def settled_by_a_pass() -> bool:
            Reconciler(led, reg).run_due()
            return led.get(aid).status is Status.CONFIRMED

        wait_for(settled_by_a_pass)
        settled_as_truth(led, sim, aid)
        kinds = [e.kind for e in led.events(aid)]
        assert kinds[-2:] == ["lease_expired", "callback"]
