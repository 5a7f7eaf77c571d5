"""The daemon as a service: it refuses to start on a bad config, logs a warning per
failed check and a heartbeat, serves Prometheus metrics and /healthz, speaks
systemd's notify protocol (READY, WATCHDOG, STOPPING), and never lets APScheduler's
raw lines into its log. Real processes; metrics parsed with prometheus_client's own
parser; the watchdog read from a unix datagram socket the test listens on."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def fill(db_path: Path, sim: SimServer, plan: dict[str, str], provider: str = "sim") -> None:
    reg = Registry({provider: sim_conf(sim, verify_deadline=600.0)}, source="test")
    try:
        with Ledger.open(db_path) as led:
            d = Dispatcher(led, reg)
            for aid, fault in plan.items():
                sim.plan(aid, fault)
                d.submit(provider, "send", {"n": aid}, action_id=aid)
    finally:
        reg.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def read_until(
    proc: subprocess.Popen[str], event: str, timeout: float = 30
) -> list[dict[str, Any]]:
    """Log lines of a running daemon up to the first ``event`` line."""
    assert proc.stderr is not None
    seen: list[dict[str, Any]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if not ready:
            continue
        line = proc.stderr.readline()
        assert line, f"the daemon ended: {seen}"
        seen.append(json.loads(line))
        if seen[-1]["event"] == event:
            return seen
    raise AssertionError(f"no {event} line in {seen}")


def stop(proc: subprocess.Popen[str], *, signalled: bool = False) -> str:
    """Stop it with SIGTERM (once: a second SIGTERM that lands while it is already
    stopping is a second request, which may end it by the signal) and read stderr."""
    if not signalled and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


@pytest.fixture
def blackhole() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    yield s
    s.close()


# -- fail fast ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (
            '[providers.mail]\ntype = "http"\nbase_url = "https://api.example.com"\n'
            'headers = { Authorization = "Bearer ${SETTLED_TEST_UNSET_TOKEN}" }\n'
            '[providers.mail.operations.send]\ntier = "blind"\nrequest = { method = "POST", path = "/m" }\n',
            "SETTLED_TEST_UNSET_TOKEN is not set",
        ),
        ('[providers.x]\ntype = "nope"\n', "unknown provider type 'nope'"),
        ("[daemon]\ninterval = 1e300\n", "daemon.interval"),
        ("[providers.x\n", "invalid TOML"),
    ],
)
def test_a_bad_config_stops_the_daemon_at_start(
    tmp_path: Path, db_path: Path, toml: str, needle: str
) -> None:
    (tmp_path / "settled.toml").write_text(toml)
    out = run_cli("daemon", "--interval", "1") if "interval" not in toml else run_cli("daemon")
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("\n") == 1 and needle in out.stderr, out.stderr
    assert out.stdout == "" and not db_path.exists()


def test_metrics_needs_its_extra(sim_config: Path) -> None:
    code = (
        "import sys\nsys.modules['prometheus_client'] = None\n"
        "from settled.cli import main\nmain(['daemon', '--once', '--metrics', '127.0.0.1:0'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1 and "pip install 'settled[metrics]'" in out.stderr, out.stderr


def test_a_taken_metrics_port_stops_the_daemon_at_start(sim_config: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        out = run_cli("daemon", "--metrics", f"127.0.0.1:{port}")
        assert out.returncode == 1 and "cannot listen" in out.stderr, out.stderr
    finally:
        taken.close()


# -- the log ------------------------------------------------------------------------------


def test_every_failed_check_is_a_warning_line(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    fill(db_path, sim, {"a": "ok", "b": "ok"})
    dead = f"http://127.0.0.1:{free_port()}"  # connection refused: an outage
    write_config(
        tmp_path / "settled.toml", {"sim": sim_conf(sim, base_url=dead, verify_deadline=600.0)}
    )
    out = run_cli("daemon", "--once")
    assert out.returncode == 0, out.stderr
    warned = [e for e in lines(out.stderr) if e["event"] == "check_failed"]
    assert sorted(e["action_id"] for e in warned) == ["a", "b"]
    for e in warned:
        assert (e["level"], e["provider"], e["operation"], e["error"]) == (
            "warning",
            "sim",
            "send",
            "ConnectError",
        )
    summary = next(e for e in lines(out.stderr) if e["event"] == "pass")
    assert summary["failed_checks"] == 2


def test_once_exits_1_when_its_pass_failed_as_reconcile_due_does(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    """A ledger locked by another writer past the busy timeout: the one pass fails,
    and ``daemon --once`` exits 1 (it exited 0), with the pass_failed line saying why,
    as ``reconcile --due`` does with its one line."""
    from locks import Locker

    fill(db_path, sim, {"a": "ok", "b": "ok"})
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    env = {"SETTLED_BUSY_TIMEOUT": "0.3"}
    locker = Locker(db_path)
    locker.hold()
    try:
        daemon = run_cli("daemon", "--once", env=env)
        cron = run_cli("reconcile", "--due", env=env)
    finally:
        locker.close()
    assert daemon.returncode == 1, daemon.stderr
    log = lines(daemon.stderr)
    assert [e["event"] for e in log] == ["started", "pass_failed", "stopped"], log
    failed = log[1]
    assert failed["level"] == "error" and failed["error"] == "LedgerBusy", failed
    assert "\n" not in failed["message"] and log[2]["failed_passes"] == 1
    assert cron.returncode == 1 and len(cron.stderr.strip().splitlines()) == 1, cron.stderr
    # Once the other writer is done, the same pass runs, and exits 0.
    again = run_cli("daemon", "--once", env=env)
    assert again.returncode == 0, again.stderr
    assert {e["action_id"] for e in lines(again.stderr) if e["event"] == "transition"} == {"a", "b"}


def test_reconcile_due_writes_the_same_json_lines_for_cron(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    fill(db_path, sim, {"a": "ok", "b": "bounce"})
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    out = run_cli("reconcile", "--due", "--log", "json")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    log = lines(out.stderr)
    assert {(e["action_id"], e["to"]) for e in log if e["event"] == "transition"} == {
        ("a", "CONFIRMED"),
        ("b", "FAILED"),
    }
    assert log[-1]["event"] == "pass" and log[-1]["examined"] == 2


def test_heartbeat_and_no_raw_scheduler_lines(
    tmp_path: Path, sim: SimServer, db_path: Path, blackhole: socket.socket
) -> None:
    """A pass that outlasts a short interval (its query hangs on a black hole) is
    reported once as pass_overrun; heartbeats keep coming at their own pace."""
    fill(db_path, sim, {"a": "ok"})
    url = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
    write_config(
        tmp_path / "settled.toml",
        {"sim": sim_conf(sim, base_url=url, timeout=1.5, verify_deadline=600.0)},
    )
    proc = popen_cli("daemon", "--interval", "0.1", "--heartbeat", "1")
    try:
        seen = read_until(proc, "heartbeat")
        seen += read_until(proc, "heartbeat")
    finally:
        err = stop(proc)
    assert proc.returncode == 0, err
    assert "maximum number of running instances" not in err, err
    assert "pass_overrun" in {e["event"] for e in seen + lines(err)}, (seen, err)
    beat = next(e for e in seen if e["event"] == "heartbeat")
    assert {"passes", "failed_passes", "last_pass_ok", "in_pass", "open"} <= set(beat)


# -- metrics and health -------------------------------------------------------------------


def scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_are_served_and_parse(
    tmp_path: Path, sim: SimServer, db_path: Path, blackhole: socket.socket
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fill(db_path, sim, {"ok1": "ok", "ok2": "ok", "gone": "bounce"})
    fill(db_path, sim, {"slow": "ok"}, provider="slow")
    url = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
    write_config(
        tmp_path / "settled.toml",
        {
            "sim": sim_conf(sim, verify_deadline=600.0),
            "slow": sim_conf(sim, base_url=url, timeout=2.0, verify_deadline=600.0),
        },
    )
    port = free_port()
    proc = popen_cli("daemon", "--interval", "0.5", "--metrics", f"127.0.0.1:{port}")
    try:
        ready, _, _ = select.select([blackhole], [], [], 30)  # the first pass is under way
        assert ready, "the daemon never queried"
        code, body = scrape(port, "/healthz")
        assert code == 503 and "no pass has finished yet" in body  # before the first pass ends
        read_until(proc, "pass")
        code, body = scrape(port, "/healthz")
        # A pass that ran is healthy; the body names the provider that cannot be checked.
        assert code == 200 and body == "ok\ncannot be checked now: slow (1 record)\n", body
        code, text = scrape(port, "/metrics")
        assert code == 200
    finally:
        err = stop(proc)
    assert proc.returncode == 0, err
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(
        name.startswith("settled_") for name in fams if not name.startswith(("python_", "process_"))
    )

    def value(name: str, **labels: str) -> float:
        for s in fams[name].samples:
            if s.name in (name, name + "_total") and all(
                s.labels.get(k) == v for k, v in labels.items()
            ):
                return float(s.value)
        raise AssertionError((name, labels, fams[name].samples))

    assert value("settled_transitions", to_status="CONFIRMED", kind="reconciled") == 2
    assert value("settled_transitions", to_status="FAILED") == 1
    assert value("settled_checks", result="applied") == 2
    assert value("settled_checks", result="error") >= 1  # the black hole's timeout
    assert value("settled_queue_depth", status="AWAITING_VERIFICATION", provider="slow") == 1
    assert value("settled_checks_failing", provider="slow") == 1  # a broken verifier, by provider
    assert value("settled_checks_failing", provider="sim") == 0  # a known provider reads 0
    assert value("settled_passes", result="ok") >= 1
    assert value("settled_last_successful_pass_timestamp_seconds") > 0
    assert value("settled_healthy") == 1
    assert fams["settled_pass_duration_seconds"].type == "histogram"


def test_healthz_is_503_after_a_failed_pass(backend: str, location: Path) -> None:
    from settled.metrics import Metrics
    from settled.sweep import Sweeper, json_lines

    board = Metrics()
    led = Ledger.open(":memory:" if backend == "sqlite" else location)
    sweeper = Sweeper(led, Registry({}), metrics=board, log=json_lines(io.StringIO()))
    assert board.health()[0] == 503
    sweeper.run_pass()
    assert board.health() == (200, "ok\n")
    led.close()  # every pass now fails
    sweeper.run_pass()
    code, why = board.health()
    assert code == 503 and "closed database" in why


def test_a_broken_verifier_is_logged_counted_gauged_and_named(
    sim: SimServer, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that cannot be built (its ${VAR} gone from the environment after the
    sends): every pass logs a check_failed line per record and counts the attempt; the
    gauge and /healthz's body name the provider; the pass that gives the records up logs
    its failed check before the transition (rule 15)."""
    from settled.clock import FakeClock
    from settled.metrics import Metrics
    from settled.sweep import Sweeper

    conf = {
        "type": "http",
        "base_url": sim.url,
        "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
        "operations": {
            "send": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "request": {"method": "POST", "path": "/v1/send"},
                "reconciliation_key_field": "reconciliation_key",
                "query": {"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
                "status": "/status",
                "applied": ["delivered"],
                "verify": {"interval": 1.0, "deadline": 2.0, "min_checks": 3},
            }
        },
    }
    monkeypatch.setenv("MAIL_TOKEN", "t0ken-for-the-sends")
    clock = FakeClock()
    with Registry({"mail": conf}, source="test") as reg:
        d = Dispatcher(ledger, reg, clock=clock)
        for aid in ("m1", "m2"):
            d.submit("mail", "send", {"to": aid}, action_id=aid)
    monkeypatch.delenv("MAIL_TOKEN")
    out = io.StringIO()
    board = Metrics()
    with Registry({"mail": conf}, source="test") as broken:
        sweeper = Sweeper(ledger, broken, clock=clock, metrics=board, log=json_lines_to(out))
        for _ in range(3):
            clock.advance(5.0)
            sweeper.run_pass()
            code, body = board.health()
            assert code == 200 and body == "ok\ncannot be checked now: mail (2 records)\n"
    log = lines(out.getvalue())
    failed = [e for e in log if e["event"] == "check_failed"]
    assert len(failed) == 6 and {e["error"] for e in failed} == {"ProviderUnavailable"}
    assert all("MAIL_TOKEN is not set" in e["message"] for e in failed)
    assert "t0ken-for-the-sends" not in out.getvalue()
    last = [e["event"] for e in log if e.get("action_id") == "m1"][-2:]
    assert last == ["check_failed", "transition"]  # the attempt that gave it up
    moves = [e for e in log if e["event"] == "transition"]
    assert {(e["action_id"], e["to"]) for e in moves} == {
        ("m1", "DENIED_UNRESOLVED"),
        ("m2", "DENIED_UNRESOLVED"),
    }
    assert all(e["reason"].startswith("could not be checked after 3 attempts") for e in moves)
    summary = [e for e in log if e["event"] == "pass"]
    assert [e["failed_checks"] for e in summary] == [2, 2, 2]
    from prometheus_client import generate_latest

    exported = generate_latest(board.registry).decode()
    assert 'settled_checks_failing{provider="mail"} 2.0' in exported
    assert 'settled_checks_total{result="error"} 6.0' in exported


def json_lines_to(out: io.StringIO) -> Any:
    from settled.sweep import json_lines

    return json_lines(out)


# -- systemd ------------------------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(20)
    yield s, path
    s.close()


def test_ready_watchdog_and_stopping_reach_the_notify_socket(
    sim_config: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    proc = popen_cli(
        "daemon", "--interval", "1", env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    )
    signalled = False
    try:
        got = [sock.recv(4096).decode() for _ in range(3)]
        assert got[0].startswith("READY=1\n") and f"MAINPID={proc.pid}" in got[0]
        assert got[1:] == ["WATCHDOG=1", "WATCHDOG=1"]
        proc.send_signal(signal.SIGTERM)
        signalled = True
        rest = []
        while "STOPPING=1" not in rest:
            rest.append(sock.recv(4096).decode())
    finally:
        err = stop(proc, signalled=signalled)
    assert proc.returncode == 0, err
    started = lines(err)[0]
    assert started["notify"] is True and started["watchdog"] == 0.2


def test_a_watchdog_meant_for_another_process_is_ignored(
    sim_config: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    from settled.notify import Notifier

    _, path = notify_socket
    assert (
        Notifier(
            {
                "NOTIFY_SOCKET": path,
                "WATCHDOG_USEC": "1000000",
                "WATCHDOG_PID": str(os.getpid() + 1),
            }
        ).watchdog
        is None
    )
    assert (
        Notifier({"NOTIFY_SOCKET": "@abstract", "WATCHDOG_USEC": "1000000"}).address == "\0abstract"
    )
    assert Notifier({}).send("READY=1") is False
