"""Truth at the edges, from outside: real processes paused with SIGSTOP, requests that
land late through a delaying relay, clock steps with libfaketime, a disk that fills
up after the send, and config changes under recorded actions.

Each test drives `settled` as a real process (or the library, where the scenario is
an ordering no process schedule can force) against the sim server on loopback, and
checks the provider's ground truth: never FAILED while the effect may still land,
never a second send, and a late contradiction flagged, blocking retry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from invariants import check
from support import PATIENT, popen_cli, run_cli, write_config

from settled.clock import FakeClock, from_text, utcnow
from settled.dispatch import Dispatcher, DispatchSettings
from settled.errors import LedgerFull, OutcomeNotRecorded, TransitionNotAllowed
from settled.model import EventKind, Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler
from settled.resolve import resolve
from settled.storage import Ledger, Move

pytestmark = pytest.mark.slow(seconds=50)

FAKETIME = shutil.which("faketime")


def api_ops(window: float = 0.2, not_found: str = "not_applied", **over: Any) -> dict[str, Any]:
    """The sim's `send` described as an http operation whose 404 proves absence."""
    return {
        "send": {
            "tier": "reconcilable",
            "consistency_window": window,
            "attempts": 1,
            "request": {"method": "POST", "path": "/v1/send"},
            "reconciliation_key_field": "reconciliation_key",
            "query": {"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
            "status": "/status",
            "applied": ["delivered"],
            "not_applied": ["bounced"],
            "not_found": not_found,
            # The sim's 404 carries no error code: its status is the whole shape.
            **({"not_found_when": {"http_status": [404]}} if not_found == "not_applied" else {}),
            "verify": {"interval": 0.1, "deadline": 5.0},
            **over,
        }
    }


def api_config(
    path: Path, url: str, *, grace: float = 0.5, timeout: float = 0.5, **ops: Any
) -> Path:
    return write_config(
        path,
        {
            "api": {
                "type": "http",
                "base_url": url,
                "timeout": timeout,
                "operations": api_ops(**ops),
            }
        },
        dispatch={"lease_grace": grace},
        reconcile={"lease": 2.0},
    )


def params(aid: str) -> str:
    return json.dumps({"to": "a@example.com", "action_id": aid})


def status_of(aid: str) -> str:
    out = run_cli("show", aid, "--json")
    return str(json.loads(out.stdout)["status"])


def wait_stopped(pid: int, seconds: float = 20.0) -> None:
    """Until the process is stopped (state T in /proc)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.02)
    raise AssertionError("the dispatcher never reached its pause point")


def land(server: SimServer, aid: str) -> None:
    """The provider applies, now, the send it accepted for ``aid`` and dropped (planned
    ``lost_after_accept``): the effect shows under the record's reconciliation key."""
    key = json.loads(run_cli("show", aid, "--json").stdout)["reconciliation_key"]
    body = {"action_id": aid, "reconciliation_key": key, "params": json.loads(params(aid))}
    assert httpx.post(f"{server.url}/v1/send", json=body, timeout=30).status_code == 202
    assert server.effects_for(aid) == 1


def wait_past(stamp: str | None, extra: float = 0.0) -> None:
    """Until the stored time ``stamp`` plus ``extra`` seconds has passed (a lease, a
    window): bounded by how far off it is, plus room for a loaded machine."""
    then = from_text(stamp)
    assert then is not None, stamp
    end = time.monotonic() + (then - utcnow()).total_seconds() + extra + 30
    while (utcnow() - then).total_seconds() <= extra:
        assert time.monotonic() < end, f"{stamp} + {extra} s never passed"
        time.sleep(0.02)


def reconcile_until(aid: str, want: set[str], seconds: float = 10.0, *options: str) -> str:
    """`settled [OPTIONS] reconcile --due` passes until ``aid`` is in ``want`` (or time
    is up); its status then."""
    deadline = time.monotonic() + seconds
    while True:
        done = run_cli(*options, "reconcile", "--due")
        assert done.returncode == 0, done.stderr
        now = status_of(aid)
        if now in want or time.monotonic() >= deadline:
            return now
        time.sleep(0.1)


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0) as s:
        yield s


# -- rule 9: a paused dispatcher -------------------------------------------------------------


@pytest.mark.parametrize("reconciled_meanwhile", [True, False], ids=["cron-ran", "nobody-looked"])
@pytest.mark.parametrize("point", ["after_claim", "before_write"])
def test_a_dispatcher_paused_past_its_lease_never_sends(
    tmp_path: Path, server: SimServer, db_path: Path, reconciled_meanwhile: bool, point: str
) -> None:
    """Stopped right after its claim commits, or connected and about to write (Ctrl-Z,
    a paused VM, slow DNS), woken after its lease lapsed: it must not send. Whatever a
    cron pass concluded meanwhile is then true, and `retry` sends the one effect."""
    api_config(tmp_path / "settled.toml", server.url)
    proc = popen_cli(
        "dispatch",
        "api",
        "send",
        "--params",
        params("p1"),
        "--action-id",
        "p1",
        "--json",
        pause_at=point,
    )
    try:
        wait_stopped(proc.pid)
        held = json.loads(run_cli("show", "p1", "--json").stdout)
        assert held["status"] == "IN_FLIGHT"
        wait_past(held["lease_expires_at"], 0.2)  # the lease, then the window, lapse
        if reconciled_meanwhile:
            assert reconcile_until("p1", {"FAILED"}) == "FAILED"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5, err  # FAILED: provably never sent
    assert json.loads(out)["status"] == "FAILED" and "Traceback" not in err
    assert server.requests_for("p1") == [] and server.effects_for("p1") == 0
    with Ledger.open(db_path) as ledger:
        rec = ledger.get("p1")
        assert rec.contradiction is None
        if not reconciled_meanwhile:
            assert "lease lapsed" in (rec.reason or ""), rec.reason
    again = run_cli("retry", "p1", "--json")
    assert again.returncode == 3, again.stderr
    assert reconcile_until("p1", {"CONFIRMED"}) == "CONFIRMED"
    assert server.effects_for("p1") == 1


class DelayingRelay:
    """A TCP relay that holds each request ``delay`` seconds before forwarding it, and
    forwards it even when the client has given up: a slow proxy or load balancer."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._relay, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _relay(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(0.3)
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        time.sleep(self.delay)
        with socket.create_connection(self.upstream) as up:
            up.sendall(data)
            up.settimeout(5)
            reply = b""
            try:
                while chunk := up.recv(65536):
                    reply += chunk
            except OSError:
                pass
        try:
            conn.sendall(reply)
        except OSError:
            pass
        conn.close()

    def close(self) -> None:
        self.sock.close()
        for t in self.threads:
            t.join(timeout=10)


def test_an_absence_seen_before_the_request_could_land_proves_nothing(
    tmp_path: Path, server: SimServer
) -> None:
    """A window shorter than the time a request may take: the client times out at
    0.5 s, the proxy forwards the POST at 1.2 s. Checks at the window see a 404; only
    after the last moment the request could land (claim + budget + grace) plus the
    window may a 404 prove absence. Here the order appears first: CONFIRMED."""
    host, port = server.url.removeprefix("http://").split(":")
    relay = DelayingRelay((host, int(port)), delay=1.2)
    try:
        api_config(tmp_path / "settled.toml", f"http://127.0.0.1:{relay.port}", grace=1.0)
        write_config(
            tmp_path / "check.toml",
            {
                "api": {
                    "type": "http",
                    "base_url": server.url,
                    "timeout": 0.5,
                    "operations": api_ops(),
                }
            },
            dispatch={"lease_grace": 1.0},
        )
        out = run_cli("dispatch", "api", "send", "--params", params("d1"), "--action-id", "d1")
        assert out.returncode == 4, out.stderr  # timed out: unresolved, to be reconciled
        seen = reconcile_until(
            "d1", {"CONFIRMED", "FAILED"}, 8.0, "--config", str(tmp_path / "check.toml")
        )
    finally:
        relay.close()
    assert seen == "CONFIRMED" and server.effects_for("d1") == 1
    shown = json.loads(run_cli("show", "d1", "--json").stdout)
    assert "FAILED" not in {e["to_status"] for e in shown["events"]}
    waits = [e for e in shown["events"] if "could still land" in json.dumps(e["detail"])]
    assert not waits  # schedule-only checks leave no event; the reason says it instead


# -- rule 9: a late reply that contradicts the record ----------------------------------------


class LateReply:
    """Wraps the sim provider: while a request is on the wire, time passes and a
    reconciler settles the record; then the reply arrives (a proxy that held the
    request past every deadline, and delivered it)."""

    def __init__(self, inner: Any, meanwhile: Any) -> None:
        self.inner, self.meanwhile, self.name = inner, meanwhile, inner.name

    def operations(self) -> Any:
        return self.inner.operations()

    def execute(self, request: Any) -> Any:
        self.meanwhile()
        return self.inner.execute(request)

    def query(self, target: Any) -> Any:
        return self.inner.query(target)

    def snapshot(self, operation: str, params: Any) -> Any:
        return None

    def close(self) -> None:
        self.inner.close()


def test_a_late_reply_that_contradicts_failed_is_flagged_and_blocks_retry(
    ledger: Ledger, server: SimServer
) -> None:
    clock = FakeClock()
    conf = {"type": "http", "base_url": server.url, "timeout": 0.5, "operations": api_ops()}
    registry = Registry({"api": conf}, source="test")
    try:
        reconciler = Reconciler(ledger, registry, clock=clock)

        def meanwhile() -> None:  # the request is held; the record is settled by absence
            clock.advance(120)
            reconciler.run_due()  # lease expired → DENIED_UNRESOLVED
            reconciler.run_ids(["late"])  # 404 long after the request could land → FAILED
            assert ledger.get("late").status is Status.FAILED

        registry.add(LateReply(registry.provider("api"), meanwhile))
        d = Dispatcher(ledger, registry, clock=clock, settings=DispatchSettings(lease_grace=1.0))
        report = d.submit("api", "send", json.loads(params("late")), action_id="late")
        rec = ledger.get("late")
        assert report.record is not None and report.record.status is Status.FAILED
        assert rec.status is Status.FAILED and server.effects_for("late") == 1
        assert rec.contradiction and "FAILED" in rec.contradiction
        assert ledger.events("late")[-1].kind == EventKind.NOTE
        with pytest.raises(TransitionNotAllowed, match="contradicts"):
            d.retry("late")
        assert len(server.requests_for("late")) == 1  # nothing was sent again
        fixed = resolve(
            ledger,
            "late",
            applied=True,
            reason="the provider has it",
            by="ops",
            now=clock.now(),
            evidence="GET /v1/effects",
        )
        assert fixed.status is Status.CONFIRMED and fixed.contradiction is None
        assert fixed.confirmed_by == "operator:ops"
        check(ledger, server, ids=["late"], final=True)
    finally:
        registry.close()


def test_a_contradiction_makes_the_audit_report_debt(
    tmp_path: Path, ledger: Ledger, server: SimServer
) -> None:
    clock = FakeClock()
    conf = {"type": "http", "base_url": server.url, "timeout": 0.5, "operations": api_ops()}
    registry = Registry({"api": conf}, source="test")
    try:
        reconciler = Reconciler(ledger, registry, clock=clock)

        def meanwhile() -> None:
            clock.advance(120)
            reconciler.run_due()
            reconciler.run_ids(["late"])

        registry.add(LateReply(registry.provider("api"), meanwhile))
        Dispatcher(
            ledger, registry, clock=clock, settings=DispatchSettings(lease_grace=1.0)
        ).submit("api", "send", json.loads(params("late")), action_id="late")
    finally:
        registry.close()
    write_config(tmp_path / "settled.toml", {"api": conf})
    # flagged in the queue a monitor watches, and in show
    queued = run_cli("queue", "--json", "--fail-if-any")
    assert queued.returncode == 4, queued.stderr
    (row,) = json.loads(queued.stdout)
    assert row["action_id"] == "late" and row["status"] == "FAILED" and row["contradiction"]
    shown = run_cli("show", "late")
    assert shown.returncode == 0 and "CONTRADICTED" in shown.stdout
    assert json.loads(run_cli("queue", "--status", "DENIED_UNRESOLVED", "--json").stdout) == []
    audit = run_cli("providers", "audit", "--json")
    assert audit.returncode == 4, audit.stderr
    op = next(o for o in json.loads(audit.stdout)["operations"] if o["operation"] == "send")
    assert op["debt"] and op["figures"]["contradictions"] == 1
    assert any("contradicted" in s for s in op["suggestions"])


# -- rule 11: the stored strategy governs ----------------------------------------------------


def test_a_config_change_never_rewrites_what_an_action_was_recorded_as(
    tmp_path: Path, ledger: Ledger, server: SimServer
) -> None:
    blind = {
        "notify": {
            "tier": "blind",
            "attempts": 1,
            "request": {"method": "POST", "path": "/v1/book"},
        }
    }
    full = {
        "notify": {
            "tier": "full",
            "attempts": 1,
            "request": {"method": "POST", "path": "/v1/book"},
            "object_id": "/id",
        }
    }
    with Registry({"api": {"type": "http", "base_url": server.url, "operations": blind}}) as reg:
        Dispatcher(ledger, reg).submit(
            "api", "notify", json.loads(params("b1")), action_id="b1", needs_confirmation=True
        )
    with Registry({"api": {"type": "http", "base_url": server.url, "operations": full}}) as reg:
        report = Dispatcher(ledger, reg).confirm("b1")
    rec = ledger.get("b1")
    assert server.effects_for("b1") == 1  # the booking endpoint answered 201 "booked"
    assert rec.status is Status.DENIED_UNRESOLVED and rec.confirmed_by is None
    assert "blind" in (rec.reason or "") and report.record is not None
    assert rec.declared is not None and rec.declared.tier == "blind"
    # show says the config differs from what the action was recorded with
    write_config(
        tmp_path / "settled.toml",
        {"api": {"type": "http", "base_url": server.url, "operations": full}},
    )
    data = json.loads(run_cli("show", "b1", "--json").stdout)
    assert "tier: blind → full" in data["config_changes"]
    human = run_cli("show", "b1")
    assert "config changed" in human.stdout and "blind → full" in human.stdout


def test_a_query_removed_from_the_config_strands_nothing(ledger: Ledger, server: SimServer) -> None:
    clock = FakeClock()
    with_query = {"type": "http", "base_url": server.url, "operations": api_ops(window=0.0)}
    no_query = {
        "type": "http",
        "base_url": server.url,
        "operations": {
            "send": {
                "tier": "blind",
                "attempts": 1,
                "request": {"method": "POST", "path": "/v1/send"},
            }
        },
    }
    server.plan("s1", "lag:0.2")
    with Registry({"api": with_query}) as reg:
        Dispatcher(ledger, reg, clock=clock).submit(
            "api", "send", json.loads(params("s1")), action_id="s1"
        )
    assert ledger.get("s1").status is Status.AWAITING_VERIFICATION
    with Registry({"api": no_query}) as reg:
        for _ in range(5):
            clock.advance(30)
            Reconciler(ledger, reg, clock=clock).run_due()
    rec = ledger.get("s1")
    assert rec.status is Status.AWAITING_VERIFICATION and rec.next_check_at is not None
    assert rec.checks == 0 and "no query" in (rec.reason or "")
    time.sleep(0.3)  # the effect is visible by now
    with Registry({"api": with_query}) as reg:
        deadline = time.monotonic() + 40
        while (
            ledger.get("s1").status is Status.AWAITING_VERIFICATION and time.monotonic() < deadline
        ):
            clock.advance(60)
            Reconciler(ledger, reg, clock=clock).run_due()
            time.sleep(0.05)
    assert ledger.get("s1").status is Status.CONFIRMED  # checked again once the query was back


# -- rule 12: clock steps ---------------------------------------------------------------------


def faketime(offset: str) -> dict[str, str]:
    """Environment that steps the wall clock of a process by ``offset`` (libfaketime),
    leaving the monotonic and boot-time clocks alone, as a real clock step does."""
    lib = next((str(p) for p in Path("/usr/lib").glob("*/faketime/libfaketime.so.1")), None)
    assert lib is not None
    return {
        "LD_PRELOAD": lib,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


needs_faketime = pytest.mark.skipif(
    FAKETIME is None, reason="libfaketime is not installed (Debian package faketime)"
)


@needs_faketime
def test_a_forward_step_proves_no_absence_and_spends_no_budget(
    tmp_path: Path, server: SimServer
) -> None:
    # The provider accepts the send and applies it only when the test says so (after
    # the clock step's pass), not after a lag that a loaded machine may outlast before
    # the faked-clock command gets to query.
    # Nothing here is about a reply timing out: a loaded machine must not cut one short.
    api_config(tmp_path / "settled.toml", server.url, window=4.0, timeout=PATIENT)
    server.plan("f1", "lost_after_accept")
    out = run_cli("dispatch", "api", "send", "--params", params("f1"), "--action-id", "f1")
    assert out.returncode == 3, out.stderr
    ahead = run_cli("reconcile", "--due", "--json", env=faketime("+1h"))
    assert ahead.returncode == 0, ahead.stderr
    assert status_of("f1") == "AWAITING_VERIFICATION"  # +1 h of wall clock proves nothing
    land(server, "f1")
    assert reconcile_until("f1", {"CONFIRMED", "FAILED"}, 60.0) == "CONFIRMED"  # a ceiling


@needs_faketime
def test_a_forward_step_does_not_spend_a_verification_budget(
    tmp_path: Path, server: SimServer
) -> None:
    # Nothing here is about a reply timing out: the send's 0.5 s was what a loaded machine
    # outlasted (exit 4, the reply lost, instead of 3).
    api_config(
        tmp_path / "settled.toml", server.url, window=0.0, not_found="pending", timeout=PATIENT
    )
    # Applied only when the test says so: a 3 s lag was outlasted on a loaded machine
    # before the faked-clock pass queried, which then saw the effect and confirmed it.
    server.plan("f2", "lost_after_accept")
    sent = run_cli("dispatch", "api", "send", "--params", params("f2"), "--action-id", "f2")
    assert sent.returncode == 3, sent.stderr
    ahead = run_cli("reconcile", "--due", env=faketime("+1h"))
    assert ahead.returncode == 0, ahead.stderr
    assert status_of("f2") == "AWAITING_VERIFICATION"
    land(server, "f2")
    # A ceiling, not a wait: it returns once the effect is seen.
    assert reconcile_until("f2", {"CONFIRMED"}, 60.0) == "CONFIRMED"


def _steppable_daemon(
    tmp_path: Path, server: SimServer, pause_at: str | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """A daemon whose wall clock follows a stamp file (libfaketime, re-read on every
    call): write "-1h" to it and its clock steps back an hour."""
    api_config(tmp_path / "settled.toml", server.url, window=0.3)
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    env = {**faketime("+0"), "FAKETIME_TIMESTAMP_FILE": str(stamp)}
    env.pop("FAKETIME")
    return popen_cli("daemon", "--interval", "0.2", env=env, pause_at=pause_at), stamp


def _dispatch_and_see_it_settled(server: SimServer, aid: str) -> None:
    """A send whose effect shows after 0.5 s: the daemon must confirm it (bounded)."""
    server.plan(aid, "lag:0.5")
    out = run_cli("dispatch", "api", "send", "--params", params(aid), "--action-id", aid)
    assert out.returncode == 3, out.stderr
    deadline = time.monotonic() + 60  # bound only: it settles in about a second
    while status_of(aid) != "CONFIRMED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status_of(aid) == "CONFIRMED"


@needs_faketime
def test_a_backward_step_does_not_stall_the_daemon(tmp_path: Path, server: SimServer) -> None:
    """The daemon starts, then its wall clock steps back an hour; it keeps settling on
    schedule, and the log stays in the ledger's time."""
    daemon, stamp = _steppable_daemon(tmp_path, server)
    try:
        assert daemon.stderr is not None
        for line in daemon.stderr:  # it runs: its schedule is being made
            if '"started"' in line:
                break
        else:
            raise AssertionError(f"the daemon never started: {daemon.wait(timeout=30)}")
        stamp.write_text("-1h\n")
        _dispatch_and_see_it_settled(server, "b1")
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, log
    moves = [json.loads(line) for line in log.splitlines() if '"transition"' in line]
    assert any(m["action_id"] == "b1" and m["to"] == "CONFIRMED" for m in moves), log


@needs_faketime
def test_a_step_back_while_the_daemon_makes_its_schedule_is_seen(
    tmp_path: Path, server: SimServer
) -> None:
    """The wall clock steps back an hour between the daemon's first schedule (made by
    the wall clock) and its loop's first look at the clock: the daemon is stopped
    right there (``daemon_scheduled``), the step made, the daemon resumed. It must
    notice the step and re-anchor its schedule, or it sleeps an hour before its next
    pass."""
    daemon, stamp = _steppable_daemon(tmp_path, server, pause_at="daemon_scheduled")
    try:
        deadline = time.monotonic() + 60
        while not _stopped(daemon.pid):
            assert daemon.poll() is None and time.monotonic() < deadline, "never paused"
            time.sleep(0.02)
        stamp.write_text("-1h\n")
        os.kill(daemon.pid, signal.SIGCONT)
        _dispatch_and_see_it_settled(server, "s1")
    finally:
        daemon.send_signal(signal.SIGCONT)
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=30)
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    steps = [e for e in events if e.get("event") == "clock_step"]
    assert steps and steps[0]["seconds"] < -3500, log


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): its state in /proc is T."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


# -- a disk that fills up after the send ------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


@pytest.mark.sqlite_only  # the ledger file's own disk
def test_a_disk_full_after_the_send_says_it_was_sent(
    tmp_path: Path, server: SimServer, small_disk: Path
) -> None:
    db = small_disk / "ledger.db"
    api_config(tmp_path / "settled.toml", server.url, grace=30.0)
    assert (
        run_cli(
            "--db",
            str(db),
            "dispatch",
            "api",
            "send",
            "--params",
            params("w0"),
            "--action-id",
            "w0",
        ).returncode
        == 3
    )
    proc = popen_cli(
        "--db",
        str(db),
        "dispatch",
        "api",
        "send",
        "--params",
        params("w1"),
        "--action-id",
        "w1",
        pause_at="after_claim",
    )
    try:
        wait_stopped(proc.pid)
        fill(small_disk)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=30)
    assert server.effects_for("w1") == 1  # it was sent
    assert proc.returncode == 3, err  # the record's status: IN_FLIGHT
    assert "was sent" in err and "disk is full" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_outcome_that_cannot_be_written_is_reported_as_sent(
    ledger: Ledger, server: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = ledger.move

    def full_after_claim(move: Move, **how: Any) -> Any:
        if move.kind == EventKind.OUTCOME:
            raise LedgerFull("ledger x: the disk is full; record outcome did not happen")
        return written(move, **how)

    full = ledger
    monkeypatch.setattr(full, "move", full_after_claim)
    with Registry(
        {"api": {"type": "http", "base_url": server.url, "operations": api_ops()}}
    ) as reg:
        with pytest.raises(OutcomeNotRecorded, match="the request was sent") as caught:
            Dispatcher(full, reg).submit("api", "send", json.loads(params("o1")), action_id="o1")
    assert caught.value.action_id == "o1" and "did not happen" not in str(caught.value)
    assert server.effects_for("o1") == 1 and ledger.get("o1").status is Status.IN_FLIGHT


# -- what is not a ledger file ---------------------------------------------------------------


@pytest.mark.sqlite_only
@pytest.mark.parametrize("target", ["fifo", "/dev/null"])
def test_a_device_or_fifo_is_never_opened_as_a_ledger(tmp_path: Path, target: str) -> None:
    path = tmp_path / "pipe" if target == "fifo" else Path(target)
    if target == "fifo":
        os.mkfifo(path)
    out = run_cli("--db", str(path), "queue", timeout=20)
    assert out.returncode == 1 and "not a regular file" in out.stderr
    assert not Path("/dev/null-journal").exists() and not Path("/dev/null-wal").exists()


@pytest.mark.sqlite_only
def test_a_ledger_readable_by_others_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "loose.db"
    with Ledger.open(path):
        pass
    path.chmod(0o644)
    with Ledger.open(path):
        pass
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.sqlite_only
def test_a_read_only_mount_is_read_only_not_corrupt(tmp_path: Path, server: SimServer) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        db = mount / "ledger.db"
        api_config(tmp_path / "settled.toml", server.url)
        assert (
            run_cli(
                "--db",
                str(db),
                "dispatch",
                "api",
                "send",
                "--params",
                params("r1"),
                "--action-id",
                "r1",
            ).returncode
            == 3
        )
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        out = run_cli(
            "--db",
            str(db),
            "dispatch",
            "api",
            "send",
            "--params",
            params("r2"),
            "--action-id",
            "r2",
        )
        assert out.returncode == 1 and "corrupt" not in out.stderr
        assert "read-only" in out.stderr or "cannot" in out.stderr, out.stderr
        assert server.requests_for("r2") == []
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
