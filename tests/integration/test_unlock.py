"""`settled unlock HOLDER`: a dead dispatcher's lease released, recorded, by a person.
Real `settled` processes on both backends: a dispatcher stopped (SIGSTOP) right after
its request left, holding its lease; unlock refused while its claim is recent, then,
after SIGKILL and once the window passed, the lease released to DENIED_UNRESOLVED
(the expired-lease move), `migrate-ledger` no longer blocked, nothing sent twice."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import rawdb
from support import popen_cli, run_cli, sim_conf, write_config
from test_rel_edges import wait_stopped

from settled import Ledger
from settled.model import EventKind, Status
from settled.providers.sim_server import SimServer


def _unlock(holder: str, *extra: str) -> Any:
    return run_cli("unlock", holder, "--reason", "host died", "--by", "alice", *extra)


def test_a_dead_dispatchers_lease_is_released_once_and_never_sent_again(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    proc = popen_cli("dispatch", "sim", "send", "--action-id", "lost", pause_at="after_send")
    try:
        wait_stopped(proc.pid)
        with Ledger.open(db_path) as led:
            rec = led.get("lost")
        assert rec.status is Status.IN_FLIGHT and rec.lease_owner and rec.lands_by
        holder, lands_by = rec.lease_owner, rec.lands_by
        # Paused once its request is written; the server takes it on its own thread.
        arrived = time.monotonic() + 30
        while not sim.requests_for("lost") and time.monotonic() < arrived:
            time.sleep(0.02)
        assert len(sim.requests_for("lost")) == 1
        before = rawdb.dump(db_path)
        alive = _unlock(holder, "--yes")  # its claim is a moment old: it may be sending
        assert alive.returncode == 7, alive.stderr
        line = alive.stderr.strip()
        assert len(line.splitlines()) == 1 and "nothing was changed" in line
        assert "Traceback" not in alive.stderr
        assert rawdb.dump(db_path) == before
        blocked = run_cli("migrate-ledger", str(db_path), str(tmp_path / "early.db"))
        assert blocked.returncode == 7 and "live dispatch lease" in blocked.stderr
    finally:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    # once its claim is older than the window, the person's word is taken
    deadline = time.monotonic() + 30
    for _ in range(200):
        done = _unlock(holder, "--window", "1", "--yes", "--json")
        if done.returncode != 7 or time.monotonic() > deadline:
            break
        assert rawdb.dump(db_path) == before
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["holder"] == holder
    assert [(r["action_id"], r["kind"], r["released"]) for r in out["released"]] == [
        ("lost", "dispatch", True)
    ]
    with Ledger.open(db_path) as led:
        rec = led.get("lost")
        last = led.events("lost")[-1]
    assert rec.status is Status.DENIED_UNRESOLVED and rec.lease_owner is None
    assert rec.cause == "dispatcher_lost"
    assert rec.lands_by == lands_by  # an absence before the claimed lease's end proves nothing
    assert last.kind == EventKind.LEASE_EXPIRED and last.actor == "operator:alice"
    assert last.detail["released_by"] == "operator:alice"
    assert last.detail["why"] == "host died" and last.detail["lease_owner"] == holder
    again = _unlock(holder)  # nothing left: said, exit 0, nothing changed
    assert again.returncode == 0 and "nothing to release" in again.stderr
    assert run_cli("reconcile", "--due").returncode == 0  # checked, not sent
    copied = run_cli("migrate-ledger", str(db_path), str(tmp_path / "copy.db"))
    assert copied.returncode == 0, copied.stderr
    assert len(sim.requests_for("lost")) == 1  # released to be checked, never re-sent


def test_an_unknown_holder_has_nothing_to_release(tmp_path: Path, db_path: Any) -> None:
    with Ledger.open(db_path):
        pass
    before = rawdb.dump(db_path)
    done = _unlock("nobody")
    assert done.returncode == 0, done.stderr
    assert "nothing to release" in done.stderr and rawdb.dump(db_path) == before


def test_bad_input_is_one_line(db_path: Any) -> None:
    done = run_cli("unlock", "d", "--reason", " ")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def _checked_by(where: Any, aid: str, owner: str) -> None:
    """An unresolved record a checker leased for an hour, as a due scan leaves it."""
    from datetime import UTC, datetime, timedelta

    from records import new_record, transition

    from settled.clock import to_text

    now = datetime.now(UTC)
    with Ledger.open(where) as led:
        led.record(new_record(aid), actor="t")
        transition(
            led, aid, Status.PENDING, Status.IN_FLIGHT, kind=EventKind.CLAIMED, lease_owner="d"
        )
        transition(
            led,
            aid,
            Status.IN_FLIGHT,
            Status.DENIED_UNRESOLVED,
            kind=EventKind.LEASE_EXPIRED,
            lease_owner=None,
            lease_expires_at=None,
        )
        rec = led.get(aid)
        until = to_text(now + timedelta(hours=1))
        assert led.lease_one(rec, owner=owner, until=until, now=to_text(now))


def test_a_check_lease_is_handed_back_due_at_once(tmp_path: Path, db_path: Any) -> None:
    _checked_by(db_path, "held", "daemon-x")
    _checked_by(db_path, "other", "daemon-y")
    with Ledger.open(db_path) as led:
        other = led.get("other")
    before = rawdb.dump(db_path)
    asked = _unlock("daemon-x")  # no terminal to ask, no --yes: refused, nothing changed
    assert asked.returncode == 1 and "--yes" in asked.stderr
    assert rawdb.dump(db_path) == before
    done = _unlock("daemon-x", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["released"]
    assert [(r["action_id"], r["kind"], r["released"]) for r in rows] == [("held", "check", True)]
    with Ledger.open(db_path) as led:
        rec = led.get("held")
        last = led.events("held")[-1]
        assert led.get("other") == other  # another holder's lease is not touched
    assert rec.status is Status.DENIED_UNRESOLVED and rec.lease_owner is None
    assert rec.next_check_at is not None and rec.next_check_at <= json.loads(done.stdout)["at"]
    assert last.kind == EventKind.NOTE and last.actor == "operator:alice"
    assert last.detail["unlocked"] == "daemon-x" and last.detail["reason"] == "host died"
