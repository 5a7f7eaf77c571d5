"""python -m bench.new_ledger [-n 20]: what a new ledger costs to make, on each backend.

A new ledger is made by nearly every test of the suite and by the first command on a
new machine, so its cost is both. Each row is the median of ``n`` opens, in ms:

- ``new``: ``Ledger.open`` of a new SQLite file or an empty PostgreSQL schema, which
  makes the ledger, and ``close``; ``new cpu``: this process's CPU time for it (SQLite:
  the schema's work without the waits for the disk, steadier on a busy machine);
- ``existing``: the same open and close of a ledger already made (the floor: the file
  or the connection and its checks, without the schema);
- ``first``: a new SQLite ledger made by a fresh interpreter, after ``import settled``:
  the schema code's imports included (one process per open).

The PostgreSQL rows need ``SETTLED_BENCH_POSTGRES`` (default ``postgresql:///test``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .common import tempdir
from .postgres import available, schema

FIRST = """\
import sys, time
import settled
t = time.perf_counter()
with settled.Ledger.open(sys.argv[1]):
    pass
print((time.perf_counter() - t) * 1000)
"""


def _ms(open_once: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> float:
    t = clock()
    open_once()
    return (clock() - t) * 1000


def _open(location: str) -> None:
    from settled import Ledger

    with Ledger.open(location):
        pass


def sqlite_rows(tmp: str, n: int) -> dict[str, float]:
    new = [_ms(lambda i=i: _open(f"{tmp}/new-{i}.db")) for i in range(n)]
    existing = [_ms(lambda i=i: _open(f"{tmp}/new-{i}.db")) for i in range(n)]
    cpu = [_ms(lambda i=i: _open(f"{tmp}/cpu-{i}.db"), time.process_time) for i in range(n)]
    first = []
    for i in range(n):
        out = subprocess.run(
            [sys.executable, "-c", FIRST, str(Path(tmp) / f"first-{i}.db")],
            capture_output=True,
            text=True,
            check=True,
        )
        first.append(float(out.stdout))
    return {
        "new": statistics.median(new),
        "new cpu": statistics.median(cpu),
        "existing": statistics.median(existing),
        "first": statistics.median(first),
    }


def postgres_rows(n: int) -> dict[str, float]:
    new, existing = [], []
    for _ in range(n):
        with schema() as url:
            new.append(_ms(lambda: _open(url)))
            existing.append(_ms(lambda: _open(url)))
    return {"new": statistics.median(new), "existing": statistics.median(existing)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.new_ledger")
    parser.add_argument("-n", type=int, default=20, help="opens per row (default 20)")
    args = parser.parse_args(argv)
    _open(":memory:")  # the imports, paid once before any row
    with tempdir() as tmp:
        rows = {"sqlite": sqlite_rows(tmp, args.n)}
    reason = available()
    if reason is None:
        _open_pg_once()
        rows["postgresql"] = postgres_rows(args.n)
    else:
        print(f"PostgreSQL rows skipped: {reason}", file=sys.stderr)
    print(f"median of {args.n}, ms")
    for backend, figures in rows.items():
        print(f"  {backend:<11}", "  ".join(f"{k} {v:6.1f}" for k, v in figures.items()))


def _open_pg_once() -> None:
    """psycopg's imports and first connection, paid before the rows."""
    with schema() as url:
        _open(url)


if __name__ == "__main__":
    main()
