"""The late-confirmation race, raced by real OS processes on one ledger file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import popen_cli, run_cli, sim_conf, write_config

from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow

PROCS = 8


@pytest.fixture
def sim_config(tmp_path: Path, sim: SimServer) -> Path:
    """The shared sim config, with a timeout no loaded machine outruns: the races
    here are about the claim, and a send that timed out while eight processes and
    the sim server shared two busy cores would end unresolved, not sent twice."""
    return write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, timeout=10.0)})


@pytest.mark.parametrize("op", ["book", "send"])
def test_many_confirms_send_exactly_once(sim_config: Path, sim: SimServer, op: str) -> None:
    ids = [f"race-{op}-{n}" for n in range(3)]
    for aid in ids:
        p = run_cli("dispatch", "sim", op, "--action-id", aid, "--needs-confirmation")
        assert p.returncode == 3, p.stderr
    for aid in ids:
        procs = [popen_cli("confirm", aid, "--json") for _ in range(PROCS)]
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert "Traceback" not in err, err
            outs.append((proc.returncode, json.loads(out)))
        outcomes = [o["outcome"] for _, o in outs]
        assert outcomes.count("dispatched") == 1, outcomes
        assert set(outcomes) <= {"dispatched", "in_progress", "already_completed"}, outcomes
        reqs = sim.requests_for(aid)
        assert len(reqs) == 1, reqs
        assert reqs[0]["idempotency_key"] == f"{aid}:1"
        winner = next(o for _, o in outs if o["outcome"] == "dispatched")
        expected = {"book": "succeeded", "send": "accepted"}[op]
        assert winner["result"] == expected
        # every process's exit code agrees with what it reported
        for code, o in outs:
            if o["outcome"] == "in_progress":
                assert code == 3
            elif o["status"] == "CONFIRMED":
                assert code == 0
        show = json.loads(run_cli("show", aid, "--json").stdout)
        assert [e["kind"] for e in show["events"]].count("claimed") == 1
