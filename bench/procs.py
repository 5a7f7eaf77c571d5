"""Several OS processes dispatching distinct actions to one ledger file, against one
process dispatching the same number: SQLite has one writer at a time, so the
aggregate should hold up (not add), and no busy error may reach a caller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .common import Row, remove_db
from .fixtures import new_ledger

ROOT = str(Path(__file__).resolve().parent.parent)
TIMEOUT = 120.0


def _run(
    path: str, workers: int, per_worker: int, tag: str, module: str = "bench._worker"
) -> tuple[float, int, dict[str, int]]:
    """Aggregate actions/s, errors surfaced, and their kinds."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, path, f"{tag}w{k}", str(per_worker)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for k in range(workers)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a benchmark worker did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    done = sum(r["done"] for r in results)
    errors = sum(r["errors"] for r in results)
    kinds: dict[str, int] = {}
    for r in results:
        for k, v in r["kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    span = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    return done / span, errors, kinds


def multi_process(tmp: str, per_worker: int, repeats: int, workers: int = 4) -> list[Row]:
    path = os.path.join(tmp, "procs.db")
    multi, single = [], []
    errors = 0
    kinds: dict[str, int] = {}
    for r in range(repeats):
        for mode in ("single", "multi") if r % 2 == 0 else ("multi", "single"):
            remove_db(path)
            new_ledger(path)
            if mode == "single":
                rate, err, kd = _run(path, 1, per_worker * workers, f"r{r}s")
                single.append(rate)
            else:
                rate, err, kd = _run(path, workers, per_worker, f"r{r}m")
                multi.append(rate)
            errors += err
            for k, v in kd.items():
                kinds[k] = kinds.get(k, 0) + v
    remove_db(path)
    surfaced = f"{errors} errors surfaced" + (f" ({kinds})" if kinds else "")
    return [
        Row(
            "concurrency",
            f"{workers} processes dispatching distinct actions, one ledger",
            "actions/s",
            multi,
            single,
            "1 process dispatching as many",
            target=1.0,
            note=surfaced + " (target: 0 SQLITE_BUSY reaching a caller)",
        ),
    ]
