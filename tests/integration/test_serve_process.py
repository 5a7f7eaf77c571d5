"""`settled serve` as a real OS process on 127.0.0.1, dispatching to the real sim: the
whole API over a real socket, a confirmation race between real processes (two
services on one ledger, several clients) that sends once, SIGTERM with a request in
flight, --reconcile in the same process, systemd's notify protocol, and every way the
command refuses to start (exit 1, one line, no ledger created)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from invariants import check
from serving import TOKENS, auth, path_of, process, token_env, write_serve_config
from support import ROOT, run_cli

from settled import Ledger
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=40)


def until(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    """Wait for an event (a bounded poll of real state, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def config(tmp_path: Path, sim: SimServer) -> Path:
    return write_serve_config(tmp_path / "settled.toml", sim, sim_over={"timeout": 10.0})


def post(c: httpx.Client, path: str, token: str = "app", **kw: Any) -> httpx.Response:
    return c.post(path, headers=auth(token), **kw)


def test_the_api_over_a_real_socket(config: Path, sim: SimServer) -> None:
    with process() as svc, httpx.Client(base_url=svc.url, timeout=30) as c:
        body = {"provider": "sim", "operation": "book", "action_id": "p/1", "params": {"n": 1}}
        first = post(c, "/api/v1/actions", json=body)
        assert first.status_code == 201 and first.json()["result"] == "succeeded"
        again = post(c, "/api/v1/actions", json=body)
        assert again.status_code == 200 and again.json()["outcome"] == "already_completed"
        assert len(sim.requests_for("p/1")) == 1  # the repeat sent nothing
        assert post(c, "/api/v1/actions", json={**body, "params": {"n": 2}}).status_code == 409

        shown = c.get(path_of("p/1"), headers=auth("reader")).json()
        assert shown["action_id"] == "p/1" and len(shown["events"]) == 3

        post(c, "/api/v1/actions", json={**body, "action_id": "blind", "operation": "notify"})
        queue = c.get("/api/v1/actions", headers=auth("reader")).json()
        assert [a["action_id"] for a in queue["actions"]] == ["blind"]
        resolved = post(
            c, path_of("blind") + "/resolve", json={"applied": True, "reason": "seen it"}
        )
        assert resolved.json()["status"] == "CONFIRMED"
        sim.plan("refused", "reject")
        assert (
            post(c, "/api/v1/actions", json={**body, "action_id": "refused"}).json()["status"]
            == "FAILED"
        )
        retried = post(c, path_of("refused") + "/retry", json={})
        assert retried.status_code == 200 and retried.json()["attempt"] == 2
        assert retried.json()["status"] == "CONFIRMED"

        post(c, "/api/v1/actions", json={**body, "action_id": "mail", "operation": "send"})
        checked = post(c, path_of("mail") + "/reconcile")
        assert checked.json()["record"]["status"] == "CONFIRMED"

        for odd in ("..", "a b/c", "%2F", "ünï✓"):  # one segment each, over a real socket
            assert post(c, "/api/v1/actions", json={**body, "action_id": odd}).status_code == 201
            got = c.get(path_of(odd), headers=auth("reader"))
            assert got.status_code == 200 and got.json()["action_id"] == odd, got.text
            typo = c.get(path_of(odd), headers=auth("reader"), params={"x": "1"})
            assert typo.status_code == 422 and "'x'" in typo.json()["detail"]  # not part of the id
            assert len(sim.requests_for(odd)) == 1

        stats = c.get("/api/v1/stats", headers=auth("reader")).json()
        assert stats["total"] == 8
        assert c.get("/healthz").text == "ok\n"
        assert "settled_http_requests_total" in c.get("/metrics").text
        assert c.get("/api/v1/openapi.json").json()["openapi"] == "3.1.0"
    assert svc.proc.returncode == 0
    lines = svc.rest()
    requests = [e for e in lines if e["event"] == "request"]
    assert len(requests) >= 12 and all(e["route"] != "-" for e in requests)
    assert "p/1" not in json.dumps(requests) and TOKENS["app"][0] not in json.dumps(lines)
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        check(led, sim)


RACER = """
import json, sys, httpx
url, path, token, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = []
with httpx.Client(base_url=url, timeout=60) as c:
    for _ in range(n):
        r = c.post(path, headers={"Authorization": "Bearer " + token})
        out.append((r.status_code, r.json().get("outcome")))
print(json.dumps(out))
"""


def test_a_confirm_race_between_real_processes_sends_once(config: Path, sim: SimServer) -> None:
    """Two services on one ledger, four client processes and four threads confirm the
    same action at once: one claim wins, one request reaches the provider."""
    sim.plan("race-1", "latency:0.5")  # the winner's call is slow: the others arrive meanwhile
    with process() as a, process() as b, httpx.Client(timeout=60) as c:
        r = c.post(
            a.url + "/api/v1/actions",
            headers=auth("app"),
            json={
                "provider": "sim",
                "operation": "book",
                "action_id": "race-1",
                "needs_confirmation": True,
            },
        )
        assert r.status_code == 201 and r.json()["outcome"] == "recorded"
        path = path_of("race-1") + "/confirm"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, url, path, TOKENS[tok][0], "3"],
                stdout=subprocess.PIPE,
                text=True,
                cwd=str(ROOT),
            )
            for url, tok in ((a.url, "sender"), (b.url, "ops"), (a.url, "app"), (b.url, "sender"))
        ]
        outcomes: list[tuple[int, str]] = []
        lock = threading.Lock()

        def confirm(url: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as own:
                got = own.post(path, headers=auth("app"))
            with lock:
                outcomes.append((got.status_code, got.json()["outcome"]))

        threads = [threading.Thread(target=confirm, args=(u,)) for u in (a.url, b.url) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for p in procs:
            out, _ = p.communicate(timeout=60)
            outcomes += [tuple(x) for x in json.loads(out)]  # type: ignore[misc]
    assert len(outcomes) == 16 and all(code == 200 for code, _ in outcomes)
    names = [o for _c, o in outcomes]
    assert names.count("dispatched") == 1, names
    assert set(names) <= {"dispatched", "in_progress", "already_completed"}
    assert len(sim.requests_for("race-1")) == 1 and sim.effects_for("race-1") == 1
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        check(led, sim)


def test_sigterm_lets_the_request_in_hand_finish(config: Path, sim: SimServer) -> None:
    sim.plan("slow-1", "latency:3")
    with process() as svc:
        got: list[httpx.Response] = []

        def slow() -> None:
            with httpx.Client(base_url=svc.url, timeout=60) as c:
                got.append(
                    post(
                        c,
                        "/api/v1/actions",
                        json={"provider": "sim", "operation": "book", "action_id": "slow-1"},
                    )
                )

        t = threading.Thread(target=slow)
        t.start()
        until(lambda: sim.requests_for("slow-1"), "the request to reach the provider")
        assert not got  # in flight
        svc.proc.send_signal(15)
        stopping = svc.next_event("stopping")
        assert stopping["reason"] == "SIGTERM"
        t.join(timeout=60)
        assert svc.proc.wait(timeout=60) == 0
        assert got and got[0].status_code == 201, got
        assert got[0].json()["result"] == "succeeded" and got[0].json()["status"] == "CONFIRMED"
        svc.next_event("stopped")
        with pytest.raises(httpx.ConnectError):
            httpx.get(svc.url + "/healthz", timeout=5)
    events = [e["event"] for e in svc.seen]
    assert events.index("stopping") < events.index("stopped")
    assert [e for e in svc.seen if e["event"] == "request"][-1]["status"] == 201


def test_reconcile_runs_the_daemon_pass_in_the_same_process(tmp_path: Path, sim: SimServer) -> None:
    write_serve_config(tmp_path / "settled.toml", sim)
    cfg = (tmp_path / "settled.toml").read_text()
    (tmp_path / "settled.toml").write_text("[daemon]\ninterval = 0.2\n" + cfg)
    with process("--reconcile") as svc, httpx.Client(base_url=svc.url, timeout=30) as c:
        assert svc.listening["reconcile"] is True
        sim.plan(
            "later-1", "lag:0.5"
        )  # not visible at once: the pass, not the dispatch, confirms it
        r = post(
            c,
            "/api/v1/actions",
            json={"provider": "sim", "operation": "send", "action_id": "later-1"},
        )
        assert r.json()["status"] == "AWAITING_VERIFICATION"
        done = until(
            lambda: (
                (x := c.get(path_of("later-1"), headers=auth("reader")).json())["status"]
                == "CONFIRMED"
                and x
            ),
            "the pass to confirm it",
        )
        pid = svc.proc.pid
        assert done["events"][-1]["actor"] == f"serve:{pid}"
        until(lambda: c.get("/healthz").status_code == 200, "a finished pass")
        assert svc.stop() == 0
    lines = svc.rest()
    daemon = [e for e in lines if e.get("daemon") == f"serve:{pid}"]
    assert daemon[0]["event"] == "started"
    assert {"transition", "stopped"} <= {e["event"] for e in daemon}
    assert lines[-1]["event"] == "stopped" and lines[-1]["server"] == f"serve:{pid}"


def test_reconcile_in_serve_names_an_outage_in_its_log_health_and_metrics(
    tmp_path: Path, sim: SimServer
) -> None:
    """`serve --reconcile` runs the daemon's pass with the provider's outage_after:
    a provider stuck on 503 is one provider_outage warning, named by /healthz (still
    200) and gauged; its recovery is one provider_recovered warning."""
    write_serve_config(tmp_path / "settled.toml", sim, sim_over={"outage_after": 1})
    cfg = (tmp_path / "settled.toml").read_text()
    (tmp_path / "settled.toml").write_text("[daemon]\ninterval = 0.2\n" + cfg)
    sim.unavailable(503)
    with process("--reconcile") as svc, httpx.Client(base_url=svc.url, timeout=30) as c:
        r = post(
            c, "/api/v1/actions", json={"provider": "sim", "operation": "send", "action_id": "m-1"}
        )
        assert r.json()["status"] == "AWAITING_VERIFICATION"
        down = svc.next_event("provider_outage")
        assert (down["level"], down["provider"], down["error"]) == ("warning", "sim", "HTTP 503")
        health = c.get("/healthz")
        assert health.status_code == 200
        assert "cannot be checked now: sim (1 record)" in health.text
        assert "outage: sim has failed every check for" in health.text
        assert 'settled_provider_outage{provider="sim"} 1.0' in c.get("/metrics").text
        sim.unavailable(None)
        back = svc.next_event("provider_recovered")
        assert back["provider"] == "sim" and back["level"] == "warning"
        until(
            lambda: c.get(path_of("m-1"), headers=auth("reader")).json()["status"] == "CONFIRMED",
            "the pass to confirm it once the provider answers",
        )
        assert svc.stop() == 0


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    try:
        yield sock, path
    finally:
        sock.close()


@pytest.mark.ledger_incidental
def test_ready_watchdog_and_stopping_reach_systemd(
    config: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    with process(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}) as svc:
        ready = sock.recv(4096).decode()
        assert "READY=1" in ready and f"MAINPID={svc.proc.pid}" in ready
        assert sock.recv(4096).decode() == "WATCHDOG=1"
        assert svc.stop() == 0
        rest: list[str] = []
        while "STOPPING=1" not in rest:
            rest.append(sock.recv(4096).decode())
        assert set(rest) <= {"WATCHDOG=1", "STOPPING=1"}


def test_mcp_through_the_service_with_a_token(config: Path, sim: SimServer) -> None:
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    with process() as svc:

        async def go() -> tuple[list[str], Any]:
            with anyio.fail_after(60):
                async with httpx2.AsyncClient(headers=auth("sender"), timeout=30) as http:
                    transport = streamable_http_client(svc.url + "/mcp", http_client=http)
                    async with Client(transport) as c:
                        names = [t.name for t in (await c.list_tools()).tools]
                        res = await c.call_tool("sim_book", {"action_id": "m/1", "params": {}})
                        return names, res

        names, res = anyio.run(go)
        assert "sim_book" in names and "check_action" in names
        assert res.structured_content["status"] == "success"
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            events = c.get(path_of("m/1"), headers=auth("reader")).json()["events"]
        assert {e["actor"] for e in events} == {"mcp"}
    assert len(sim.requests_for("m/1")) == 1
    routes = {e["route"] for e in svc.rest() if e["event"] == "request"}
    assert "/mcp" in routes


# ------------------------------------------------------------------ refusing to start


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    p = run_cli("serve", *args, env={**token_env(), **(env or {})}, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("settled: error: "), p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    return lines[0]


def no_ledger() -> bool:
    db = os.environ["SETTLED_DB"]
    if db.startswith("postgres"):
        with Ledger.open(db) as led:  # an empty schema: nothing recorded
            return led.count() == 0
    return not Path(db).exists()


@pytest.mark.ledger_incidental
def test_a_remote_address_needs_the_flag_a_token_and_host_names(
    tmp_path: Path, sim: SimServer
) -> None:
    write_serve_config(tmp_path / "settled.toml", sim)
    assert "--allow-remote" in refused("--listen", "0.0.0.0:0")
    write_serve_config(tmp_path / "settled.toml", sim, tokens=False)
    assert "needs at least one API token" in refused("--listen", "0.0.0.0:0", "--allow-remote")
    write_serve_config(tmp_path / "settled.toml", sim)
    assert "serve.hosts: required" in refused("--listen", "0.0.0.0:0", "--allow-remote")
    assert no_ledger()


@pytest.mark.ledger_incidental
def test_config_and_environment_mistakes_stop_it_at_start(tmp_path: Path, sim: SimServer) -> None:
    write_serve_config(tmp_path / "settled.toml", sim)
    line = refused("--listen", "127.0.0.1:0", env={"SETTLED_TEST_TOKEN_OPS": ""})
    assert "serve.tokens.ops.secret" in line and "at least 16" in line
    env = {k: v for k, v in os.environ.items() if k != "SETTLED_TEST_TOKEN_OPS"}
    p = subprocess.run(
        [sys.executable, "-m", "settled", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        env={**env, **{k: v for k, v in token_env().items() if k != "SETTLED_TEST_TOKEN_OPS"}},
        timeout=120,
        cwd=str(ROOT),
        check=False,
    )
    assert p.returncode == 1 and "SETTLED_TEST_TOKEN_OPS is not set" in p.stderr
    assert refused("--listen", "nowhere").endswith("use HOST:PORT, e.g. 127.0.0.1:8780")
    (tmp_path / "settled.toml").write_text("[serve]\nlisten = 'x:y'\n")
    assert "serve.listen" in refused()
    (tmp_path / "settled.toml").write_text("[serve]\nport = 1\n")
    assert "serve.port: unknown key" in refused()
    assert no_ledger()


@pytest.mark.ledger_incidental
def test_a_taken_port_stops_it_at_start(config: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert "cannot listen" in refused("--listen", f"127.0.0.1:{port}")
