"""A dispatcher killed (SIGKILL) while its request is in flight: the record stays
IN_FLIGHT with its lease, and nothing re-sends it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import rawdb
from support import popen_cli, run_cli, sim_conf, write_config

from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow


def test_killed_dispatcher_leaves_in_flight_and_nothing_resends(tmp_path: Path) -> None:
    with SimServer(hang=20.0) as sim:
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, timeout=15.0)})
        sim.plan("crash-1", "timeout_after_apply")
        proc = popen_cli("dispatch", "sim", "send", "--action-id", "crash-1")
        try:
            deadline = time.monotonic() + 30
            while not sim.requests_for("crash-1"):
                assert time.monotonic() < deadline, "the request never arrived"
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL

        rec = json.loads(run_cli("show", "crash-1", "--json").stdout)
        assert rec["status"] == "IN_FLIGHT"
        assert rec["lease_owner"] and rec["lease_expires_at"] and rec["dispatched_at"]
        assert rec["delivery"] == "IN_FLIGHT"

        # Nobody may send it again while it is in flight.
        c = run_cli("confirm", "crash-1", "--json")
        assert c.returncode == 3 and json.loads(c.stdout)["outcome"] == "in_progress"
        again = run_cli("dispatch", "sim", "send", "--action-id", "crash-1", "--json")
        assert again.returncode == 3 and json.loads(again.stdout)["outcome"] == "in_progress"
        assert len(sim.requests_for("crash-1")) == 1
        assert sim.effects_for("crash-1") == 1

        assert rawdb.integrity(os.environ["SETTLED_DB"]) == "ok"
