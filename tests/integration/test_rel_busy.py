"""A locked ledger (SQLITE_BUSY; on PostgreSQL, a lock held by another writer) is
waited for within a bounded busy timeout: it never becomes an unhandled error, it is
never reported as an action outcome, and the message never claims "nothing was
changed" once a request has left.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from invariants import check, dump, settle
from locks import Locker, LockingServer
from support import PATIENT, popen_cli, run_cli, write_config

from settled import Ledger
from settled.clock import from_text, utcnow
from settled.config import load
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0, honour_keys=False) as s:
        yield s


@pytest.fixture
def config(tmp_path: Path, server: SimServer) -> Path:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": PATIENT,  # the subject is the ledger's lock: every reply comes back
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 0.5,
    }
    return write_config(tmp_path / "settled.toml", {"sim": provider})


def _make_ledger(db: Path) -> None:
    Ledger.open(db).close()


def test_a_short_lock_is_waited_for(server: SimServer, config: Path, db_path: Path) -> None:
    _make_ledger(db_path)
    locker = Locker(db_path)
    locker.hold()
    try:
        procs = [
            popen_cli("dispatch", "sim", "book", "--action-id", f"b-{i}", "--json")
            for i in range(2)
        ]
        time.sleep(0.6)
    finally:
        locker.release()
        locker.close()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err  # CONFIRMED: the lock was waited out
        assert json.loads(out)["status"] == "CONFIRMED" and err == ""
    assert server.effects_for("b-0") == 1


def test_a_lock_past_the_bound_is_an_error_not_an_outcome(
    server: SimServer, config: Path, db_path: Path
) -> None:
    _make_ledger(db_path)
    run_cli("dispatch", "sim", "book", "--action-id", "existing")
    before = dump(db_path)
    locker = Locker(db_path)
    locker.hold()
    try:
        env = {"SETTLED_BUSY_TIMEOUT": "0.3"}
        done = run_cli("dispatch", "sim", "book", "--action-id", "blocked", "--json", env=env)
        # readers are not blocked by a writer (WAL)
        shown = run_cli("show", "existing", "--json", env=env)
    finally:
        locker.close()
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "locked" in lines[0] and "Traceback" not in done.stderr
    assert server.requests_for("blocked") == []  # nothing was sent
    assert dump(db_path) == before  # and nothing was written
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "CONFIRMED"


def test_busy_at_the_outcome_is_reported_honestly(tmp_path: Path, db_path: Path) -> None:
    """The claim committed and the request left, then the ledger stayed locked past the
    bound: the command says in one line that the request was sent, exits with the
    record's status (3: IN_FLIGHT), and the record is settled later by reconciliation,
    never reported as an outcome."""
    with LockingServer(hang=1.0, honour_keys=False) as server:
        provider = {
            "type": "sim",
            "base_url": server.url,
            "timeout": 0.5,
            "attempts": 1,
            "consistency_window": 0.0,
            "verify_interval": 0.05,
            "verify_deadline": 1.0,
        }
        config = write_config(
            tmp_path / "settled.toml", {"sim": provider}, dispatch={"lease_grace": 0.2}
        )
        _make_ledger(db_path)
        locker = Locker(db_path)
        timers: list[threading.Timer] = []

        def hold_then_release() -> None:
            locker.hold()
            timers.append(threading.Timer(1.5, locker.release))
            timers[-1].start()

        server.on_request = hold_then_release
        try:
            done = run_cli(
                "dispatch",
                "sim",
                "send",
                "--action-id",
                "s-1",
                "--json",
                env={"SETTLED_BUSY_TIMEOUT": "0.3"},
            )
        finally:
            server.on_request = None
            for timer in timers:  # the lock is released by the timer, not by a guess
                timer.join(timeout=30)
            locker.close()
        assert done.returncode == 3 and done.stdout == "", done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr
        assert "nothing was changed" not in lines[0]
        assert "sent" in lines[0] and "s-1" in lines[0], lines[0]
        assert server.effects_for("s-1") == 1
        cfg = load(str(config))
        registry = Registry(cfg.providers, source=str(config))
        try:
            with Ledger.open(db_path) as ledger:
                held = ledger.get("s-1")
                assert held.status.value == "IN_FLIGHT"
                lapses = from_text(held.lease_expires_at)
                assert lapses is not None
                end = time.monotonic() + (lapses - utcnow()).total_seconds() + 30
                while utcnow() <= lapses:  # the lease lapses (bounded by its own length)
                    assert time.monotonic() < end, "the lease never lapsed"
                    time.sleep(0.05)
                settle(ledger, registry)
                check(ledger, server, ids=["s-1"], dedupes=False)
                assert ledger.get("s-1").status.value == "CONFIRMED"
        finally:
            registry.close()
