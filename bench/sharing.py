"""python -m bench.sharing [--rows N] [--latency S]: how daemons on one PostgreSQL
ledger share the due work, as real `settled daemon` processes.

- **Fairness**: N records awaiting verification, two daemons started together; how many
  of the checks each made (the actor of each record's last event), and whether any
  record was queried twice.
- **Takeover**: one daemon leases a slice and is killed with SIGKILL while it holds it;
  a second daemon is running. The time from the kill until every row of the killed
  daemon's slice was leased again (or settled) by the other, against the configured
  ``[reconcile] lease`` that held such a slice before.

Figures for reading (docs/postgres.md, "Daemons sharing the work"), never a pass/fail.
``SETTLED_BENCH_POSTGRES`` names the server (default ``postgresql:///test``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)


def config(path: Path, sim_url: str, **sections: dict[str, Any]) -> Path:
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    lines += [
        "[providers.sim]",
        'type = "sim"',
        f'base_url = "{sim_url}"',
        "timeout = 10.0",
        "consistency_window = 0.0",
        "verify_interval = 0.05",
        "verify_deadline = 120.0",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def seed(url: str, conf: Path, n: int, prefix: str = "w") -> list[str]:
    """``n`` records accepted by the sim and awaiting verification (due at once)."""
    from settled.session import Session

    ids = [f"{prefix}{i:05d}" for i in range(n)]
    with Session(db=url, config_path=str(conf)) as s:
        d = s.dispatcher("bench")
        for aid in ids:
            d.submit("sim", "send", {}, action_id=aid)
    return ids


class Daemon:
    """`settled daemon` as a real process; its JSON log lines, read as they come."""

    def __init__(self, url: str, conf: Path) -> None:
        env = {**os.environ, "SETTLED_DB": url, "SETTLED_CONFIG": str(conf)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "settled", "daemon"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def started(self, timeout: float = 60) -> None:
        wait_for(lambda: any('"started"' in x for x in self.lines), "the daemon's start", timeout)

    def log(self) -> str:
        return "".join(self.lines)


def stop(daemons: list[Daemon]) -> list[str]:
    for d in daemons:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
    for d in daemons:
        d.proc.wait(timeout=120)
        d.reader.join(timeout=30)
        if d.proc.stderr is not None:
            d.proc.stderr.close()
    return [d.log() for d in daemons]


def wait_for(predicate: Any, what: str, timeout: float) -> float:
    """Poll real state until ``predicate()`` (bounded); the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def _open(url: str) -> Any:
    from settled import Ledger

    return Ledger.open(url)


def settled_all(url: str, ids: list[str]) -> bool:
    from settled.model import Status

    with _open(url) as led:
        return all(led.get(a).status is Status.CONFIRMED for a in ids)


def last_actors(url: str, ids: list[str]) -> Counter[str]:
    with _open(url) as led:
        return Counter(led.events(a)[-1].actor for a in ids)


def fairness(url: str, sim: Any, tmp: Path, rows: int, daemons: int = 2) -> dict[str, Any]:
    """``daemons`` daemons started together on ``rows`` due records: the checks each made."""
    conf = config(
        tmp / "fair.toml",
        sim.url,
        daemon={"interval": 0.5},
        reconcile={"concurrency": 4},
    )
    ids = seed(url, conf, rows)
    procs = [Daemon(url, conf) for _ in range(daemons)]
    try:
        took = wait_for(lambda: settled_all(url, ids), "every record confirmed", 600)
    finally:
        logs = stop(procs)
    actors = last_actors(url, ids)
    queries = sim.truth()["queries"]
    return {
        "rows": rows,
        "daemons": daemons,
        "moves": sorted(actors.values(), reverse=True),
        "seconds": round(took, 2),
        "queried": sum(queries.values()),  # by reconciliation key, one per record
        "queried_twice": sum(1 for n in queries.values() if n > 1),
        "failed_passes": sum(log.count('"pass_failed"') for log in logs),
    }


def takeover(url: str, sim: Any, tmp: Path, lease: float = 60.0) -> dict[str, Any]:
    """Daemon A leases a slice and is killed holding it; daemon B takes it over."""
    conf = config(
        tmp / "takeover.toml",
        sim.url,
        daemon={"interval": 5.0},
        reconcile={"batch": 10, "lease": lease},
    )
    ids = seed(url, conf, 10, prefix="k")
    sim.latency = 1.0  # each check takes a second: A holds its slice a while

    def held_by_a() -> list[tuple[str, str]]:
        with _open(url) as led:
            got = [(a, led.get(a).lease_owner) for a in ids]
        return [(a, o) for a, o in got if o]

    a = Daemon(url, conf)
    b: Daemon | None = None
    try:
        wait_for(lambda: len(held_by_a()) >= 5, "daemon A's slice", 60)
        b = Daemon(url, conf)  # running, with nothing to take while A holds the slice
        b.started()
        slice_ = dict(held_by_a())
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=30)
        killed = time.monotonic()

        def taken() -> bool:
            with _open(url) as led:
                return all(led.get(x).lease_owner != o for x, o in slice_.items())

        wait_for(taken, "daemon B taking A's slice", lease * 2)
        after = time.monotonic() - killed
        wait_for(lambda: settled_all(url, ids), "every record confirmed", 120)
    finally:
        stop([d for d in (a, b) if d is not None])
    sim.latency = 0.0
    return {
        "slice": len(slice_),
        "lease": lease,
        "interval": 5.0,
        "taken_over_after": round(after, 2),
        "sent_twice": sum(1 for x in ids if len(sim.requests_for(x)) > 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sharing")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--latency", type=float, default=0.05, help="s per provider reply")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from bench.postgres import available, schema
    from settled.providers.sim_server import SimServer

    why = available()
    if why:
        print(f"skipped: {why}")
        return 0
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            with SimServer(latency=args.latency) as sim, schema() as url:
                out.append({"fairness": fairness(url, sim, Path(tmp), args.rows)})
            with SimServer() as sim, schema() as url:
                out.append({"takeover": takeover(url, sim, Path(tmp))})
    for row in out:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
