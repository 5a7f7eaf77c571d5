"""Concurrency with real processes on one ledger file: zero duplicate sends and zero
lost rows (SQLITE_BUSY itself: ``test_rel_busy.py``).

The workers are ``python -c`` loops over the library (dispatch, record + confirm,
retry, reconcile), joined by real ``settled`` CLI processes: ``confirm``, cron's
``reconcile --due`` and three ``settled daemon``s.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import budget, check, scaled, settle
from support import ROOT, popen_cli, write_config

from settled import Ledger
from settled.config import load
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow

POOL = 40  # action ids shared by every worker (× the budget)
OPS = ("book", "send", "deliver", "notify", "set")
QUICK_FAULTS = (
    "ok",
    "ok",
    "lost_after_accept",
    "bounce",
    "reject",
    "5xx_after",
    "reset_after_apply",
    "drop",
    "5xx_before",
)

WORKER = r"""
import json, random, sys, time
from settled.config import load
from settled.dispatch import Dispatcher, DispatchSettings
from settled.errors import TransitionNotAllowed
from settled import Ledger
from settled.providers import Registry
from settled.reconcile import Reconciler

db, config, seed, seconds, pool = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ops = ["book", "send", "deliver", "notify", "set"]
rnd = random.Random(seed)
cfg = load(config)
registry = Registry(cfg.providers, source=config)
seen, counts = set(), {}
with Ledger.open(db) as ledger:
    d = Dispatcher(ledger, registry, settings=DispatchSettings(lease_grace=cfg.lease_grace), actor=f"w{seed}")
    r = Reconciler(ledger, registry, lease=cfg.reconcile_lease, actor=f"r{seed}")
    registry.provider("sim")  # start-up work (httpx, the client) before the clock runs
    print("ready", flush=True)
    sys.stdin.readline()  # every worker starts at once
    end = time.monotonic() + seconds
    slowest = (0.0, "")
    while time.monotonic() < end:
        t0 = time.monotonic()
        n = rnd.randrange(pool)
        aid, op = f"c-{n}", ops[n % len(ops)]
        params = {"name": aid, "value": n}
        what = rnd.choice(["dispatch", "record", "confirm", "confirm", "retry", "reconcile"])
        if what == "dispatch":
            rep = d.submit("sim", op, params, action_id=aid)
            seen.add(aid)
        elif what == "record":
            rep = d.submit("sim", op, params, action_id=aid, needs_confirmation=True)
            seen.add(aid)
        elif what == "confirm":
            rep = d.confirm(aid)
        elif what == "retry":
            try:
                rep = d.retry(aid)
            except TransitionNotAllowed:
                what = "retry_refused"
            except Exception as exc:
                if type(exc).__name__ != "NotFound":
                    raise
                what = "retry_not_found"
        else:
            r.run_due(limit=20)
        key = what if what != "confirm" else f"confirm:{rep.outcome}"
        counts[key] = counts.get(key, 0) + 1
        slowest = max(slowest, (time.monotonic() - t0, key))
registry.close()
print(json.dumps({"seen": sorted(seen), "counts": counts, "slowest": slowest}))
"""


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0, honour_keys=False) as s:
        yield s


@pytest.fixture
def config(tmp_path: Path, server: SimServer) -> Path:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": 0.3,
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 0.5,
    }
    return write_config(
        tmp_path / "settled.toml",
        {"sim": provider},
        dispatch={"lease_grace": 0.3},
        reconcile={"lease": 0.5},
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 8])
def test_processes_mixing_everything_never_duplicate_or_lose(
    workers: int, server: SimServer, config: Path, db_path: Path
) -> None:
    rnd = random.Random(workers)
    pool = scaled(POOL)
    for n in range(pool):
        server.plan(f"c-{n}", rnd.choice(QUICK_FAULTS))
    seconds = 1.5 * budget()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(db_path),
                str(config),
                str(seed),
                str(seconds),
                str(pool),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(ROOT),
        )
        for seed in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n", p.stderr
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    daemons = [popen_cli("daemon", "--interval", "0.1", "--heartbeat", "1") for _ in range(3)]
    readers = [_collect_lines(d) for d in daemons]
    logs = [lines for lines, _ in readers]
    # Real CLI processes join in: many confirms of the same ids at once, and cron's
    # reconciliation passes.
    cli_ids = [f"c-{n}" for n in range(0, pool, 7)]
    cli: list[subprocess.Popen[str]] = []
    passes: list[subprocess.Popen[str]] = []
    for _ in range(2):  # two rounds, so that CLI start-up does not starve the workers
        time.sleep(seconds / 3)
        cli.extend(popen_cli("confirm", aid, "--json") for aid in cli_ids[:3])
        passes.append(popen_cli("reconcile", "--due", "--json"))
    seen: set[str] = set()
    slowest: tuple[Any, ...] = (0.0, "")
    totals: dict[str, int] = {}
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and err == "", f"worker failed ({p.returncode}): {err}"
        out = out.strip().splitlines()[-1]
        result = json.loads(out)
        seen.update(result["seen"])
        slowest = max(slowest, tuple(result["slowest"]))
        for k, v in result["counts"].items():
            totals[k] = totals.get(k, 0) + v
    for p in cli:
        out, err = p.communicate(timeout=120)
        assert p.returncode in (0, 3, 4, 5, 6), (p.returncode, err)
        assert "Traceback" not in err and "internal error" not in err, err
        if p.returncode != 6:
            assert json.loads(out)["outcome"] in (
                "dispatched",
                "already_completed",
                "in_progress",
                "blocked",
            )
    reconciled = 0
    for p in passes:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "Traceback" not in err, (p.returncode, err)
        reconciled += json.loads(out)["examined"]
    # Each daemon takes part: on a loaded machine its first pass may end only after the
    # workers are done, so its stop waits (bounded) for a heartbeat counting one pass.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(_passes(lines) >= 1 for lines in logs):
        time.sleep(0.1)
    daemon_moves = 0
    for daemon in daemons:
        daemon.send_signal(signal.SIGTERM)
    for daemon, (lines, reader) in zip(daemons, readers, strict=True):
        daemon.wait(timeout=30)
        reader.join(30)  # the stream ends with the process: every line is in
        err = "".join(lines)
        assert daemon.returncode == 0 and "Traceback" not in err, err
        log = [json.loads(line) for line in err.splitlines()]
        assert log[-1]["event"] == "stopped" and log[-1]["passes"] >= 1, log[-1]  # it took part
        assert not [e for e in log if e["event"] == "pass_failed"], log
        daemon_moves += sum(1 for e in log if e["event"] == "transition")

    cfg = load(str(config))
    registry = Registry(cfg.providers, source=str(config))
    try:
        with Ledger.open(db_path) as ledger:
            settle(ledger, registry, timeout=30)
            pending = {r.action_id for r in ledger.query(statuses=["PENDING"])}
            ids = {r.action_id for r in ledger.query()}
            # zero lost rows: every action a worker recorded is in the ledger, and the
            # ledger holds nothing else; zero duplicates: checked per attempt.
            assert seen <= ids
            statuses = check(ledger, server, ids=ids, dedupes=False, open_ok=pending)
    finally:
        registry.close()
    sent = server.truth()["requests"]
    keys = [r["idempotency_key"] for r in sent]
    assert len(keys) == len(set(keys)), "an attempt was sent twice"
    assert sum(totals.values()) > workers  # the workers really did work
    print(
        f"\n{workers} workers: {sum(totals.values())} operations, {len(sent)} requests, "
        f"{len(ids)} actions, final {dict(statuses)}, slowest op {slowest}; "
        f"daemon moves {daemon_moves}, cron passes examined {reconciled}"
    )


def _collect_lines(proc: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """``proc``'s stderr lines as they come (a thread reads them, as a log collector
    would, so the pipe never fills); the list grows until the stream ends, when the
    thread returns."""
    lines: list[str] = []
    stream = proc.stderr
    assert stream is not None

    def read() -> None:
        with stream:
            for line in stream:
                lines.append(line)
        if proc.stdout is not None:
            proc.stdout.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _passes(lines: list[str]) -> int:
    """The passes a daemon has finished, by its latest heartbeat or stop line."""
    for line in reversed(list(lines)):
        event = json.loads(line)
        if event.get("event") in ("heartbeat", "stopped"):
            return int(event["passes"])
    return 0
