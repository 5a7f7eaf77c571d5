"""The daemon as real processes: SIGTERM mid-pass, and two daemons plus a cron pass on
one ledger, counted at the sim server's ground truth."""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer


def lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def fill(db_path: Path, sim: SimServer, plan: dict[str, str], **over: Any) -> dict[str, str]:
    """Dispatch one `send` per action id (fault per id); returns id -> reconciliation key.
    Where no fault hangs, the sends get a timeout no loaded machine outruns: the
    shared 0.3 s made an `ok` send end unresolved while two cores were busy."""
    if "timeout" not in over and not any("timeout" in fault for fault in plan.values()):
        over = {**over, "timeout": 10.0}
    reg = Registry({"sim": sim_conf(sim, **over)}, source="test")
    keys = {}
    try:
        with Ledger.open(db_path) as led:
            d = Dispatcher(led, reg)
            for aid, fault in plan.items():
                sim.plan(aid, fault)
                rec = d.submit("sim", "send", {"n": aid}, action_id=aid).record
                assert rec.status is Status.AWAITING_VERIFICATION
                keys[aid] = rec.reconciliation_key
    finally:
        reg.close()
    return keys


def drain(proc: subprocess.Popen[str]) -> Callable[[], str]:
    """Read ``proc``'s stderr while it runs, as a log collector does (a pipe nobody reads
    fills up and blocks the daemon's next log line). Returns a function that waits for
    the end of the stream and gives the text."""
    assert proc.stderr is not None
    stream, out = proc.stderr, []

    def read() -> None:
        with stream:
            out.append(stream.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def rest() -> str:
        reader.join(20)
        assert out, "the process never closed its stderr"
        if proc.stdout is not None:
            proc.stdout.close()
        return out[0]

    return rest


@pytest.fixture
def blackhole() -> Iterator[socket.socket]:
    """A port that accepts connections (backlog) and never answers: every query on it
    runs into its timeout."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    yield s
    s.close()


def test_sigterm_finishes_the_check_in_hand_and_exits_0(
    tmp_path: Path, sim: SimServer, db_path: Path, blackhole: socket.socket
) -> None:
    keys = fill(db_path, sim, {f"a{i:02}": "ok" for i in range(30)}, verify_deadline=600.0)
    with Ledger.open(db_path) as led:
        due = {r.action_id: r.next_check_at for r in led.query(statuses=["AWAITING_VERIFICATION"])}
    url = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
    write_config(
        tmp_path / "settled.toml",
        {"sim": sim_conf(sim, base_url=url, timeout=0.3, verify_deadline=600.0)},
        reconcile={"batch": 10},
    )
    proc = popen_cli("daemon", "--interval", "60")
    try:
        ready, _, _ = select.select([blackhole], [], [], 20)  # a query is in flight
        assert ready, "the daemon never queried"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    log = lines(err)
    assert log[0]["event"] == "started" and log[-1]["event"] == "stopped"
    assert any(e["event"] == "stopping" and e["reason"] == "SIGTERM" for e in log)
    summary = next(e for e in log if e["event"] == "pass")
    assert summary["stopped"] is True and 1 <= summary["examined"] < 30
    with Ledger.open(db_path) as led:
        rows = led.query(statuses=["AWAITING_VERIFICATION"])
    assert len(rows) == 30  # nothing lost, nothing settled without evidence, budget intact
    assert all(r.lease_owner is None for r in rows)
    handed_back = [r for r in rows if r.checks == 0]
    assert handed_back and all(r.next_check_at == due[r.action_id] for r in handed_back)
    assert sum(r.checks for r in rows) == summary["examined"]
    assert all(sim.queries_for(k) == 0 for k in keys.values())  # all went to the black hole


@pytest.mark.slow
def test_two_daemons_and_a_cron_pass_share_one_ledger(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    plan = {f"ok{i:03}": "ok" for i in range(220)}
    plan |= {f"bounce{i:02}": "bounce" for i in range(40)}
    plan |= {f"lag{i:02}": "lag:0.3" for i in range(40)}
    conf = {"verify_interval": 0.1, "verify_deadline": 20.0}
    keys = fill(db_path, sim, plan, **conf)
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, **conf)}, reconcile={"batch": 15})
    daemons = [popen_cli("daemon", "--interval", "0.1") for _ in range(2)]
    logs = [drain(p) for p in daemons]
    try:
        cron = run_cli("reconcile", "--due", "--json")
        assert cron.returncode == 0, cron.stderr
        end = time.monotonic() + 60
        while True:
            with Ledger.open(db_path) as led:
                open_rows = led.query(statuses=["AWAITING_VERIFICATION", "DENIED_UNRESOLVED"])
            if not open_rows:
                break
            assert time.monotonic() < end, f"{len(open_rows)} records never settled"
            time.sleep(0.2)
    finally:
        for p in daemons:
            p.send_signal(signal.SIGTERM)
        for p in daemons:
            p.wait(timeout=20)
        errs = [log() for log in logs]
    assert [p.returncode for p in daemons] == [0, 0], errs
    with Ledger.open(db_path) as led:
        final = {aid: led.get(aid) for aid in plan}
    for aid, rec in final.items():
        want = Status.FAILED if aid.startswith("bounce") else Status.CONFIRMED
        assert rec.status is want, (aid, rec.status, rec.reason)
        # every query the server saw is a check the ledger recorded: none doubled
        assert sim.queries_for(keys[aid]) == rec.checks, aid
        if not aid.startswith("lag"):
            assert rec.checks == 1, aid
    # each record settled exactly once, by exactly one of the three processes
    settled = [e["action_id"] for err in errs for e in lines(err) if e["event"] == "transition"]
    settled += [c["action_id"] for c in json.loads(cron.stdout)["changes"]]
    assert sorted(settled) == sorted(plan)
    assert all(len(sim.requests_for(aid)) == 1 for aid in plan)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="needs Linux pipe sizes")
def test_a_stalled_log_reader_does_not_lock_the_ledger(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    """The daemon logs every move to stderr. When the reader of that stream stalls, the
    daemon blocks on its next line; it must not block holding the ledger's write lock,
    or every other writer of the ledger (here a cron pass) waits into LedgerBusy."""
    plan = {f"ok{i:03}": "ok" for i in range(120)}
    keys = fill(db_path, sim, plan)
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)}, reconcile={"batch": 15})
    r, w = os.pipe()
    size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # room for ~15 log lines
    daemon = subprocess.Popen(
        [sys.executable, "-m", "settled", "daemon", "--interval", "0.1"],
        stdout=subprocess.DEVNULL,
        stderr=w,
        cwd=str(ROOT),
    )
    os.close(w)
    log = b""
    try:
        # Nobody reads the daemon's stderr: wait until it is full and stays full.
        end, last, since = time.monotonic() + 30, -1, time.monotonic()
        while True:
            buf = bytearray(4)
            fcntl.ioctl(r, termios.FIONREAD, buf)
            filled = int.from_bytes(buf, sys.byteorder)
            if filled != last:
                last, since = filled, time.monotonic()
            elif filled > size // 2 and time.monotonic() - since > 1.0:
                break
            assert time.monotonic() < end, f"the daemon's log never filled its pipe ({filled} B)"
            time.sleep(0.05)
        cron = run_cli("reconcile", "--due", "--json", env={"SETTLED_BUSY_TIMEOUT": "5"})
        assert cron.returncode == 0, cron.stderr
        assert json.loads(cron.stdout)["changes"]  # it settled what the daemon had not leased
    finally:
        daemon.send_signal(signal.SIGTERM)
        end = time.monotonic() + 20
        while time.monotonic() < end:  # read the log now: the daemon finishes and exits
            if select.select([r], [], [], 0.5)[0]:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                log += chunk
        os.close(r)
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait(timeout=20)
    assert daemon.returncode == 0, log.decode()
    again = run_cli("reconcile", "--due", "--json")  # what the daemon handed back on SIGTERM
    assert again.returncode == 0, again.stderr
    settled = [e["action_id"] for e in lines(log.decode()) if e["event"] == "transition"]
    settled += [c["action_id"] for out in (cron, again) for c in json.loads(out.stdout)["changes"]]
    assert sorted(settled) == sorted(plan)  # each settled once, and reported once
    with Ledger.open(db_path) as led:
        for aid in plan:
            rec = led.get(aid)
            assert rec.status is Status.CONFIRMED and rec.checks == 1, aid
            assert sim.queries_for(keys[aid]) == 1, aid


def test_once_logs_one_json_line_per_transition(
    tmp_path: Path, sim: SimServer, db_path: Path
) -> None:
    # c's budget outlasts a slow start of the daemon: it is checked, found not yet, and
    # stays where it is (no transition), however loaded the machine.
    fill(db_path, sim, {"a": "ok", "b": "bounce", "c": "lost_after_accept"}, verify_deadline=60.0)
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, verify_deadline=60.0)})
    out = run_cli("daemon", "--once")
    assert out.returncode == 0 and out.stdout == ""
    log = lines(out.stderr)
    moves = {
        e["action_id"]: (e["from"], e["to"], e["kind"]) for e in log if e["event"] == "transition"
    }
    assert moves == {
        "a": ("AWAITING_VERIFICATION", "CONFIRMED", "reconciled"),
        "b": ("AWAITING_VERIFICATION", "FAILED", "reconciled"),
    }
    for e in log:
        if e["event"] == "transition":
            assert set(e) >= {"time", "action_id", "from", "to", "kind", "reason"}
    summary = next(e for e in log if e["event"] == "pass")
    assert summary["examined"] == 3 and summary["waiting"] == 1


@pytest.mark.parametrize("bad", ["0", "-1", "nan"])
def test_bad_interval_is_a_one_line_error(bad: str) -> None:
    out = run_cli("daemon", "--interval", bad)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "--interval" in out.stderr


def test_a_failed_pass_is_logged_and_the_daemon_goes_on(
    sim: SimServer, backend: str, location: Path
) -> None:
    from settled.sweep import Sweeper, json_lines

    led = Ledger.open(":memory:" if backend == "sqlite" else location)
    led.close()  # every pass now fails on a closed connection
    buf = io.StringIO()
    sweeper = Sweeper(led, Registry({}), log=json_lines(buf))
    sweeper.run_pass()
    sweeper.run_pass()
    log = lines(buf.getvalue())
    assert [e["event"] for e in log] == ["pass_failed", "pass_failed"]
    assert log[0]["level"] == "error" and "closed" in log[0]["message"]


def test_cli_import_stays_light() -> None:
    code = "import sys, settled.cli; print(sorted(m for m in ('apscheduler', 'httpx') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_a_stop_signal_during_a_log_line_never_deadlocks(ledger: Ledger) -> None:
    """SIGTERM may arrive while the main thread is writing a log line, holding the
    log's lock. The handler only records the request; logging from it would wait
    forever on that lock."""
    import io
    import threading

    from settled.sweep import Sweeper, json_lines

    sweeper: Sweeper

    class Interrupted(io.StringIO):
        fired = False

        def write(self, text: str) -> int:
            if not self.fired:  # the signal lands mid-write
                self.fired = True
                sweeper.request_stop("SIGTERM")
            return super().write(text)

    out = Interrupted()
    sweeper = Sweeper(ledger, Registry({}, source="test"), log=json_lines(out))
    done = threading.Thread(target=sweeper.serve, kwargs={"once": True}, daemon=True)
    done.start()
    done.join(timeout=20)
    assert not done.is_alive(), "the daemon deadlocked on its own log"
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events == ["started", "stopping", "stopped"]


def _locks_of(obj: object) -> list[Any]:
    """Every lock an object holds in its attributes, an Event's and a Condition's own
    included (they are what ``wait`` holds for a moment, each time round)."""
    lock_types = (type(threading.Lock()), type(threading.RLock()))
    found: list[Any] = []
    for value in vars(obj).values():
        thing = value._cond if isinstance(value, threading.Event) else value  # Event.wait's lock
        thing = thing._lock if isinstance(thing, threading.Condition) else thing
        if isinstance(thing, lock_types):
            found.append(thing)
    return found


def test_a_stop_asked_in_a_signal_handler_never_waits_on_a_lock(ledger: Ledger) -> None:
    """SIGTERM's handler runs on the serving thread, between any two of its steps: if
    ``request_stop`` took a lock that thread can hold (it set a threading.Event, whose
    lock every Event.wait holds for a moment), a signal landing in that moment waited
    forever and the daemon never stopped. Here the signal lands while this thread holds
    every lock the sweeper owns; a watchdog frees them if the handler hangs."""
    from settled.sweep import Sweeper, json_lines

    sweeper = Sweeper(ledger, Registry({}, source="test"), log=json_lines(io.StringIO()))
    held = _locks_of(sweeper)
    for lock in held:
        lock.acquire()
    hung: list[bool] = []

    def watchdog() -> None:
        time.sleep(5)  # only reached if the handler is stuck: it is the test's failure
        if not stopped.is_set():
            hung.append(True)
            for lock in held:
                lock.release()

    stopped = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda *_: sweeper.request_stop("SIGTERM"))
    guard = threading.Thread(target=watchdog, daemon=True)
    try:
        guard.start()
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs before kill returns
        stopped.set()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if not hung:
            for lock in held:
                lock.release()
    assert not hung, "request_stop waited on a lock the interrupted thread held"
    assert sweeper.stopping
