"""Many hosts on one PostgreSQL ledger, as real processes.

- Two daemons whose hosts' clocks disagree by minutes (one runs under libfaketime,
  ``faketime -f +5m``): every decision is made by the database's clock, so the skewed
  host neither expires another host's dispatch lease early nor checks a row another
  host has leased.
- Hosts that share nothing but the database: dispatchers and daemons in their own
  network namespaces (``ip netns``, a bridge and veth pairs this test makes), reaching
  PostgreSQL through a TCP relay and the provider over the bridge. One host is killed
  mid-batch; nothing is lost, nothing is sent twice, nothing is checked twice.

Both skip, with the reason, where their tools (faketime; root and ``ip``) are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pg_schemas as pg
import pytest
from invariants import check
from support import ROOT, command, write_config

from settled import Ledger
from settled.clock import from_text
from settled.model import Status
from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow(seconds=40)]

SKEW = "+5m"  # the other host's clock
SETTLED = (Status.CONFIRMED, Status.FAILED, Status.DENIED_UNRESOLVED)


def _faketime() -> list[str]:
    exe = shutil.which("faketime")
    if exe is None:
        pytest.skip("faketime is not installed (Debian package faketime)")
    return [exe, "-f", SKEW]


def _skewed_env() -> dict[str, str]:
    # the steady clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME) stays true: only the wall clock is off
    return {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _conf(
    tmp_path: Path,
    name: str,
    server: SimServer,
    deadline: float = 30.0,
    **sections: dict[str, Any],
) -> Path:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": 0.5,
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": deadline,
    }
    return write_config(tmp_path / name, {"sim": provider}, **sections)


def _run(
    argv: list[str],
    env: dict[str, str],
    prefix: list[str] | None = None,
    crash_at: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), *command(tuple(argv), crash_at)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=120,
    )


def test_a_host_whose_clock_is_minutes_ahead_neither_expires_leases_early_nor_checks_twice(
    tmp_path: Path, db_path: str
) -> None:
    skewed = _faketime()
    with SimServer(hang=1.0, honour_keys=False) as server:
        conf = _conf(
            tmp_path,
            "settled.toml",
            server,
            dispatch={"lease_grace": 120.0},
            reconcile={"lease": 120.0, "batch": 50},
        )
        env = {**os.environ, "SETTLED_DB": db_path, "SETTLED_CONFIG": str(conf)}
        # The skew is real: the other host's wall clock is five minutes ahead.
        probe = subprocess.run(
            [*skewed, sys.executable, "-c", "import time; print(time.time())"],
            capture_output=True,
            text=True,
            env=_skewed_env(),
            timeout=60,
        )
        assert float(probe.stdout) - time.time() > 240, probe

        # Host A claims an action and dies before sending: its lease runs 2 minutes.
        lost = _run(
            ["dispatch", "sim", "book", "--action-id", "lost", "--params", "{}"],
            env,
            crash_at="after_claim",
        )
        assert lost.returncode == -signal.SIGKILL, lost.stderr
        # Host A's reconciler leases a batch of records due for a check and dies
        # before checking any: those rows are leased to it for 2 minutes.
        for n in range(5):
            done = _run(["dispatch", "sim", "send", "--action-id", f"s{n}", "--params", "{}"], env)
            assert done.returncode == 3, done.stderr  # accepted, awaiting verification
        killed = _run(["reconcile", "--due"], env, crash_at="before_check")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        with Ledger.open(db_path) as led:
            lease = led.get("lost").lease_expires_at
            held = {
                r.action_id: r.next_check_at for r in led.query(statuses=["AWAITING_VERIFICATION"])
            }
            assert all(led.get(a).lease_owner for a in held)
            # By the skewed host's own clock, both leases are long over:
            ahead = float(probe.stdout)
            assert ahead > from_text(lease).timestamp()  # type: ignore[union-attr]
            assert all(ahead > from_text(t).timestamp() for t in held.values())  # type: ignore[union-attr]

        # Host B, five minutes ahead, runs daemon passes and a cron pass.
        skewed_env = {**_skewed_env(), **{k: env[k] for k in ("SETTLED_DB", "SETTLED_CONFIG")}}
        for _ in range(3):
            daemon = _run(["daemon", "--once"], skewed_env, prefix=skewed)
            assert daemon.returncode == 0, daemon.stderr
            log = [json.loads(line) for line in daemon.stderr.splitlines()]
            assert log[-1] == {**log[-1], "event": "stopped", "passes": 1}, log
            assert not [e for e in log if e["event"] in ("transition", "pass_failed")], log
        cron = _run(["reconcile", "--due", "--json"], skewed_env, prefix=skewed)
        assert cron.returncode == 0, cron.stderr
        assert json.loads(cron.stdout)["changes"] == []

        with Ledger.open(db_path) as led:
            rec = led.get("lost")
            assert rec.status is Status.IN_FLIGHT and rec.lease_expires_at == lease
            assert "lease_expired" not in [e.kind for e in led.events("lost")]
            for aid, due in held.items():
                now = led.get(aid)
                assert now.status is Status.AWAITING_VERIFICATION and now.next_check_at == due
                assert now.checks == 0
        # nothing was queried: no row leased to the dead host was checked by the other
        assert sum(server.truth()["queries"].values()) == 0
        assert [r["action_id"] for r in server.truth()["requests"]] == [f"s{n}" for n in range(5)]


# ------------------------------------------------------------------ hosts in namespaces


class Relay:
    """A TCP relay in the root namespace: ``listen`` → ``target``, one thread pair per
    connection. It stops by itself when closed."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server(listen)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            client.settimeout(None)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for c in self.conns:
            c.close()
        self.thread.join(timeout=5)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Hosts:
    """A bridge in the root namespace and one network namespace per host on it."""

    def __init__(self, count: int) -> None:
        tag = os.getpid() % 10000
        self.subnet = f"198.18.{os.getpid() % 250}"  # RFC 2544's range for tests
        self.bridge = f"stbr{tag}"
        self.gateway = f"{self.subnet}.1"
        self.names = [f"st{tag}h{n}" for n in range(count)]
        self.made: list[str] = []

    def make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append("bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for n, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            self.made.append(ns)
            outer, inner = f"{ns}o", f"{ns}i"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{self.subnet}.{n + 10}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def run(
        self, ns: str, argv: list[str], env: dict[str, str], log: Any, crash_at: str | None = None
    ) -> subprocess.Popen[str]:
        """``settled ARGV`` on host ``ns``, its output to the open file ``log``."""
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *command(tuple(argv), crash_at)],
            stdout=log,
            stderr=log,
            text=True,
            env=env,
            cwd=str(ROOT),
        )

    def kill(self, ns: str) -> int:
        """SIGKILL every process of the host: it dies mid-whatever."""
        out = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30
        ).stdout.split()
        for pid in out:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(out)

    def remove(self) -> None:
        for ns in self.names:
            if ns in self.made:
                self.kill(ns)
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if "bridge" in self.made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    h = Hosts(2)
    try:
        h.make()
    except (subprocess.CalledProcessError, OSError) as exc:
        h.remove()
        why = getattr(exc, "stderr", "") or str(exc)
        pytest.skip(f"network namespaces cannot be made here: {why.strip()}")
    try:
        yield h
    finally:
        h.remove()


HOST_WORKER = r"""
import json, sys
from settled.config import load
from settled.dispatch import Dispatcher, DispatchSettings
from settled import Ledger
from settled.providers import Registry

db, config, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = load(config)
registry = Registry(cfg.providers, source=config)
with Ledger.open(db) as ledger:
    d = Dispatcher(ledger, registry, settings=DispatchSettings(lease_grace=cfg.lease_grace),
                   actor=prefix)
    for n in range(count):
        d.submit("sim", ("send", "book", "set")[n % 3], {"n": n}, action_id=f"{prefix}-{n}")
        d.confirm(f"shared-{n % 4}")
        print(f"{prefix}-{n}", flush=True)
registry.close()
"""


def test_hosts_sharing_only_the_database_lose_nothing_when_one_dies_mid_batch(
    hosts: Hosts, tmp_path: Path, db_path: str
) -> None:
    pg_relay = Relay((hosts.gateway, 0), ("127.0.0.1", 5432))
    try:
        with SimServer(host=hosts.gateway, hang=1.0, honour_keys=False, lag=0.3) as server:
            _many_hosts(hosts, tmp_path, db_path, pg_relay, server)
    finally:
        pg_relay.close()


def _many_hosts(
    hosts: Hosts, tmp_path: Path, db_path: str, relay: Relay, server: SimServer
) -> None:
    # Each host reaches the database only over the bridge, through the relay.
    remote = pg.url_for(
        pg.schema_of(db_path), base=f"postgresql://root@{hosts.gateway}:{relay.port}/test"
    )
    conf = _conf(
        tmp_path,
        "hosts.toml",
        server,
        # Long enough to outlast the dead host's leases (3 s) and the survivor's start,
        # short enough that the lost mails' verdicts do not keep the test waiting.
        deadline=10.0,
        dispatch={"lease_grace": 1.0},
        reconcile={"lease": 3.0, "batch": 4},
    )
    env = {**os.environ, "SETTLED_DB": remote, "SETTLED_CONFIG": str(conf)}
    first, second = hosts.names
    for n in range(4):  # records both hosts will race to confirm
        rec = _run(
            [
                "dispatch",
                "sim",
                "book",
                "--action-id",
                f"shared-{n}",
                "--params",
                "{}",
                "--needs-confirmation",
            ],
            env | {"SETTLED_DB": db_path},
        )
        assert rec.returncode == 3, rec.stderr
    for n in range(12):
        server.plan(f"{first}-{n}", "lost_after_accept" if n % 5 == 4 else "ok")
        server.plan(f"{second}-{n}", "timeout_after_apply" if n % 5 == 3 else "ok")
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("doomed", "other", "survivor")}
    workers = [
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-c",
                HOST_WORKER,
                remote,
                str(conf),
                ns,
                "12",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(ROOT),
        )
        for ns in (first, second)
    ]
    # The first host's daemon dies in the middle of a batch it has leased (at its first
    # check); its other daemon and its dispatcher die with the whole host.
    doomed = hosts.run(first, ["daemon", "--interval", "0.1"], env, logs["doomed"], "before_check")
    other = hosts.run(first, ["daemon", "--interval", "0.1"], env, logs["other"])
    survivor: subprocess.Popen[str] | None = None
    try:
        assert workers[0].stdout is not None
        for _ in range(2):  # the first host has dispatched some of its actions ...
            line = workers[0].stdout.readline()
            assert line.startswith(first), line + workers[0].communicate(timeout=60)[1]
        doomed.wait(timeout=120)
        assert doomed.returncode == -signal.SIGKILL, (tmp_path / "doomed.log").read_text()
        assert hosts.kill(first) >= 1  # ... and dies with the rest still to do
        with Ledger.open(db_path) as led:  # what the dead host left open, its leases included
            at_kill = led.query()
            left_open = {r.action_id for r in at_kill if r.status not in SETTLED}
            checks_at_kill = {r.action_id: r.checks for r in at_kill}
            asked_at_kill = dict(server.truth()["queries"])
        assert left_open  # at least the batch the dead daemon had leased
        survivor = hosts.run(second, ["daemon", "--interval", "0.1"], env, logs["survivor"])
        out, err = workers[1].communicate(timeout=120)
        assert workers[1].returncode == 0, err
        with Ledger.open(db_path) as led:
            _settle_while(led, survivor)
            survivor.send_signal(signal.SIGTERM)  # the check in hand finishes, then it stops
            assert survivor.wait(timeout=60) == 0
            records = led.query()
            ids = {r.action_id for r in records}
            statuses = check(led, server, ids=ids, dedupes=False)
    finally:
        for p in (survivor, other, doomed, *workers):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.communicate(timeout=60)
        for fh in logs.values():
            fh.close()
    stopped = json.loads((tmp_path / "survivor.log").read_text().splitlines()[-1])
    assert stopped["event"] == "stopped" and stopped["passes"] >= 1
    assert {f"{second}-{n}" for n in range(12)} == set(out.split()) <= ids
    assert {f"shared-{n}" for n in range(4)} <= ids
    # Nothing checked twice: from the kill on, the provider answered exactly the checks
    # the ledger recorded, record by record (two daemons checking one record for the
    # same due time would ask twice and record once). Before it, the dead host's daemon
    # may have asked and died before recording: observations lost, never statuses.
    # Only book and send are asked by their reconciliation key; a set the dead host
    # left in flight (its params name no setting, so the provider refuses it) has a
    # check that cannot even be built: counted in ``checks``, asked of nobody.
    for rec in records:
        key = rec.reconciliation_key
        if key is not None and rec.tier != "full" and rec.operation in ("book", "send"):
            asked = server.queries_for(key) - asked_at_kill.get(key, 0)
            assert asked == rec.checks - checks_at_kill.get(rec.action_id, 0), rec
        elif rec.operation == "set" and rec.checks:
            assert rec.check_error == 'params lack a "name" string', rec
    # Nothing lost: everything the dead host left open (its leased batch, its claims in
    # flight) was settled by the hosts that lived on.
    final = {r.action_id: r.status for r in records}
    assert all(final[aid] in SETTLED for aid in left_open), {a: final[a] for a in left_open}
    print(
        f"\nhosts: {len(records)} actions ({len(left_open)} left open by the dead host), "
        f"final {dict(statuses)}"
    )


def _settle_while(led: Ledger, daemon: subprocess.Popen[str], timeout: float = 90.0) -> None:
    """Wait (bounded) until the surviving daemon has settled every record that a
    daemon can settle: nothing left with a check scheduled but unresolved ones."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert daemon.poll() is None, "the surviving daemon stopped"
        open_ = [
            r
            for r in led.query()
            if r.status in (Status.PENDING, Status.IN_FLIGHT, Status.AWAITING_VERIFICATION)
        ]
        if not open_:
            return
        time.sleep(0.2)
    raise AssertionError(
        f"still open after {timeout} s: {[(r.action_id, r.status) for r in open_]}"
    )
