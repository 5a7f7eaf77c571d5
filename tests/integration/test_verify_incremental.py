"""``settled verify`` by default checks each record once after its last event, from a
checkpoint stored in the ledger (event ids and, on PostgreSQL, the snapshot the run
read: never wall time); ``--full`` replays everything. The checkpoint never passes an
event a transaction still in progress may commit below it (PostgreSQL commits in any
order), proven with a real dispatch paused (SIGSTOP) before its outcome commits while
another commits after it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import rawdb
from support import popen_cli, run_cli, sim_conf, write_config

from settled.providers.sim_server import SimServer
from settled.storage import truth


def verify(*args: str) -> dict[str, Any]:
    got = run_cli("verify", "--json", *args)
    assert got.returncode in (0, 4), got.stderr
    out: dict[str, Any] = json.loads(got.stdout)
    return out


def until_nothing_new(bound: int = 20) -> dict[str, Any]:
    """Verify until a run finds no record changed since the checkpoint (one run on
    SQLite; on PostgreSQL the checkpoint waits for transactions other tests have in
    progress on the same server to end)."""
    for _ in range(bound):
        out = verify()
        assert out["ok"], out
        if out["records"] == 0:
            return out
    raise AssertionError(f"verify never caught up in {bound} runs")


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_second_run_checks_only_what_changed_and_full_checks_everything(
    location: Any, tmp_path: Path
) -> None:
    with SimServer() as sim:
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
        for n in range(3):
            run_cli("dispatch", "sim", "send", "--action-id", f"a-{n}", "--wait")
        first = verify()
        assert first["mode"] == "incremental" and first["since_event"] == 0
        assert first["records"] == 3 and first["ok"]
        until_nothing_new()
        run_cli("dispatch", "sim", "send", "--action-id", "b-1", "--wait")
    again = verify()
    assert again["records"] >= 1 and again["since_event"] > 0
    full = verify("--full")
    assert (full["mode"], full["records"], full["since_event"]) == ("full", 4, None)


def test_a_record_changed_by_hand_without_an_event_is_found_by_full(
    location: Any, tmp_path: Path
) -> None:
    with SimServer() as sim:
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
        run_cli("dispatch", "sim", "send", "--action-id", "a-1", "--wait")
    until_nothing_new()
    rawdb.execute(location, "UPDATE actions SET attempt = 2 WHERE action_id = 'a-1'")
    assert verify()["ok"]  # no event after the checkpoint: not read again (docs say so)
    full = run_cli("verify", "--full")
    assert full.returncode == 4 and "a-1: attempt" in full.stdout
    # a run that finds something stores nothing: the next one reads the same range
    assert run_cli("verify", "--full").returncode == 4


def test_the_checkpoint_never_passes_a_transaction_still_in_progress(
    location: Any, tmp_path: Path
) -> None:
    pg = rawdb.is_pg(location)
    with SimServer() as sim:
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
        run_cli("dispatch", "sim", "send", "--action-id", "first", "--wait")
        until_nothing_new()
        late = popen_cli(
            "dispatch", "sim", "send", "--action-id", "late", pause_at="before_commit:outcome"
        )
        try:
            deadline = time.monotonic() + 30
            while not _stopped(late.pid):
                assert late.poll() is None, late.communicate()
                assert time.monotonic() < deadline, "the dispatch never reached its outcome"
                time.sleep(0.02)
            if pg:  # commits after the paused one took its event id (SQLite: it waits)
                done = run_cli("dispatch", "sim", "send", "--action-id", "after", "--wait")
                assert done.returncode == 0, done.stderr
            # the late outcome is invisible to each of these (on SQLite the paused
            # writer holds the file: the run cannot store its checkpoint, and says so)
            for _ in range(3 if pg else 1):
                seen = verify()
                assert seen["ok"] and (pg or seen["checkpoint_event"] is None), seen
        finally:
            os.kill(late.pid, signal.SIGCONT)
            late.communicate(timeout=60)
    assert late.returncode in (0, 3), late.returncode
    # "late" changed by hand without an event: only a run that reads it again finds it,
    # and an incremental run must, since its outcome committed after every checkpoint
    rawdb.execute(location, "UPDATE actions SET attempt = 2 WHERE action_id = 'late'")
    got = verify()
    assert not got["ok"] and [f["action_id"] for f in got["findings"]] == ["late"], got


def test_the_checkpoint_rule_on_snapshots() -> None:
    idle, busy = "100:100:", "100:105:101,103"
    assert truth.established(None, 40, None) == 40  # SQLite: nothing invisible below
    assert truth.established(None, 40, idle) == 40
    assert truth.established(None, 40, busy) == 0  # someone may still commit below 40
    assert truth.established((10, 40, busy), 60, "104:110:107") == 10  # 101, 103 may run
    assert truth.established((10, 40, busy), 60, "105:110:107") == 40  # all of them ended
    assert truth.established((50, 60, busy), 20, "104:110:107") == 50  # never backwards
