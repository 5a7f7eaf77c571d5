"""`settled migrate` refuses while a writer may still be running: a write to the ledger
in the last minute (by any settled, of any version: every one writes events and
stamps records) or a live dispatch lease; exit 7, one line, nothing changed;
`--force` migrates anyway. Real `settled` processes on both backends, a real
dispatcher stopped (SIGSTOP) right after its claim."""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import rawdb
from support import popen_cli, run_cli, sim_conf, write_config
from test_migrate import behind_by_an_index, steps_of
from test_rel_edges import wait_stopped

from settled import Ledger
from settled.providers.sim_server import SimServer


def schema(location: Any) -> list[str]:
    """The ledger's applied steps, read through a connection of its own."""
    return sorted(r[0] for r in rawdb.execute(location, "SELECT name FROM _migrations"))


def test_a_ledger_written_a_moment_ago_is_refused_until_forced(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    behind_by_an_index(db_path)  # one step behind, as an older settled left it
    with Ledger.open_for_migration(db_path) as led:
        assert led.pending_steps()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # a writer of that settled
    rawdb.execute(db_path, "UPDATE actions SET updated_at = ? WHERE action_id = 'old'", (now,))
    before = rawdb.dump(db_path)
    applied = schema(db_path)
    out = run_cli("migrate")
    assert out.returncode == 7, out.stderr
    line = out.stderr.strip()
    assert len(line.splitlines()) == 1 and "a write" in line and "--force" in line
    assert "nothing was changed" in line and "Traceback" not in out.stderr
    assert rawdb.dump(db_path) == before and schema(db_path) == applied
    dry = run_cli("migrate", "--dry-run")  # only listing is never refused
    assert dry.returncode == 0, dry.stderr
    forced = run_cli("migrate", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["to"] == len(steps_of(db_path))


def test_a_live_dispatch_lease_is_named_and_refused(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    behind_by_an_index(db_path)
    with Ledger.open_for_migration(db_path) as led:
        led.migrate()  # up to date, so the dispatcher may write
    proc = popen_cli(
        "dispatch", "sim", "send", "--action-id", "live", "--json", pause_at="after_claim"
    )
    try:
        wait_stopped(proc.pid)
        behind_by_an_index(db_path)  # and a newer settled arrives while it is stopped
        out = run_cli("migrate")
        assert out.returncode == 7, out.stderr
        assert "1 live dispatch lease" in out.stderr and "nothing was changed" in out.stderr
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.communicate(timeout=30)
