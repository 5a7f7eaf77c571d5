"""Ctrl-C on a busy machine: a real ``settled dispatch --from FILE --concurrency 32``
on a core kept busy by a busy loop (both pinned to it, so that the rest of the suite,
on the other core, is not slowed down), sent SIGINT at several moments of its run. Each time it stops within its request timeout (plus the time to start and write
its last outcomes), exits 130 saying so, and leaves nothing ``IN_FLIGHT``: every
request that left has its outcome recorded, every claimed action whose request never
left is released honestly (FAILED, "never sent", with no request at the provider),
and no action was sent twice.

The old failure: where the signal landed decided what happened. In the middle of a
group's claim or of the pool's bookkeeping it left claimed actions that were never
sent, or outcomes that were never written, IN_FLIGHT, and the run waited for ever
for outcomes that would never come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import popen_cli, write_config

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.slow(seconds=60)]

TIMEOUT = 2.0  # s: the operation's request timeout (one attempt)
LINES = 3_000
MOMENTS = (40, 64, 100, 150, 230, 320)  # requests the sim has received when SIGINT comes
STOP_BOUND = TIMEOUT + 30.0  # s: the request timeout, and a generous margin to start and write
HOG = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end:\n    pass\n"


CORE = {max(os.sched_getaffinity(0))}  # the core the run and the busy loop share


@pytest.fixture
def busy() -> Iterator[None]:
    """A busy core: a bounded busy loop in a process of its own, pinned to ``CORE``."""
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    os.sched_setaffinity(hog.pid, CORE)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def wait_for(what: str, ok: Any, bound: float = 60.0) -> None:
    deadline = time.monotonic() + bound
    while not ok():
        assert time.monotonic() < deadline, f"no {what} within {bound} s"
        time.sleep(0.02)


def received(sim: SimServer) -> int:
    return len(sim.truth()["requests"])


def interrupted_run(sim: SimServer, tmp_path: Path, db_path: Any, run: int, moment: int) -> None:
    """One bulk run, sent SIGINT once the sim has received ``moment`` of its requests."""
    source = tmp_path / f"run-{run}.jsonl"
    ids = [f"r{run}-{i}" for i in range(LINES)]
    source.write_text("".join(json.dumps({"action_id": a, "params": {}}) + "\n" for a in ids))
    before = received(sim)
    p = popen_cli("dispatch", "sim", "book", "--from", str(source), "--concurrency", "32", "--json")
    os.sched_setaffinity(p.pid, CORE)  # its pool's threads, made later, are pinned there too
    out_lines: list[str] = []  # read as it comes: a full pipe would stall the run

    def drain() -> None:
        out_lines.extend(p.stdout or ())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_for(
            f"{moment} requests", lambda: received(sim) - before >= moment or p.poll() is not None
        )
        assert p.poll() is None, (run, p.returncode)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=STOP_BOUND)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            pytest.fail(f"run {run}: still running {STOP_BOUND} s after SIGINT")
        reader.join(timeout=30)
        err = p.stderr.read() if p.stderr is not None else ""
    finally:
        for pipe in (p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()
    assert p.returncode == 130, (run, p.returncode, err[-500:])
    assert "Traceback" not in err and "interrupted" in err, err[-500:]
    with Ledger.open(db_path, create=False) as led:
        recorded = [r for r in (led.find(a) for a in ids) if r is not None]
    assert recorded, run
    left = [r.action_id for r in recorded if r.status is Status.IN_FLIGHT]
    assert left == [], f"run {run}: {len(left)} left IN_FLIGHT, e.g. {left[:3]}"
    for r in recorded:
        sent = len(sim.requests_for(r.action_id))
        assert sent <= 1, (r.action_id, sent)
        if "never sent" in (r.reason or ""):
            assert r.status is Status.FAILED and sent == 0, r
        else:
            assert sent == 1 and r.status is Status.CONFIRMED, (r.action_id, r.reason)
    printed = {json.loads(x).get("action_id") for x in out_lines if x.startswith('{"line"')}
    assert printed <= {r.action_id for r in recorded}


def test_ctrl_c_on_a_busy_machine_stops_in_time_and_leaves_nothing_in_flight(
    tmp_path: Path, db_path: Any, busy: None
) -> None:
    with SimServer(latency=0.05, hang=1.0) as sim:
        provider = {"type": "sim", "base_url": sim.url, "timeout": TIMEOUT, "attempts": 1}
        write_config(tmp_path / "settled.toml", {"sim": provider})
        for run, moment in enumerate(MOMENTS):
            interrupted_run(sim, tmp_path, db_path, run, moment)
