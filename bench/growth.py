"""python -m bench.growth [--sizes 10000,100000] [--backend sqlite|postgresql|both]
[--repeats N]: each command's time as the ledger grows, and the ratio between sizes.

A ledger of each size is bulk-loaded (``executemany`` on SQLite, ``COPY`` on
PostgreSQL) with rows and events shaped as settled writes them: the day's open work
the same at every size (1,000 accepted and due for their check, 100 unresolved and
waiting for a person, 200 recorded), every other record confirmed with its four events
(recorded, claimed, outcome, reconciled): history grows, the working set does not. The
counts are filled from the rows as the schema step does. Then each command runs in this process against it, the median
of ``--repeats`` runs, in ms:

- ``dispatch``: ``Dispatcher.submit`` of a new action (record, claim, send, outcome);
- ``claim``: ``Dispatcher.confirm`` of a recorded action (its claim and outcome);
- ``show``: ``find`` and ``events`` of one record;
- ``queue --limit 50``: the unresolved records, oldest first, 50 of them;
- ``stats``: ``Ledger.stats`` as ``settled stats`` asks for it;
- ``reconcile --due``: one due batch of 50 checked and written (null query);
- ``verify``: incremental, from the checkpoint of the loaded history (as a clean run
  yesterday would have stored it), so it reads the records the commands above
  changed; ``verify --full``: every record;
- ``/metrics``: what a scrape reads (``status_counts`` and ``check_failures``);
- the console's queue page: the same page of 50 with its figures (``stats`` by
  operation, as the page's header shows them).

Sizes default to 10,000 and 100,000 (about a minute); ``--sizes 10000,100000,1000000``
for the full table. PostgreSQL needs ``SETTLED_BENCH_POSTGRES`` (default
``postgresql:///test``). Figures are for reading, never for failing a build.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .common import durability_line, machine_line, tempdir
from .fixtures import (
    INSERT_ACTION,
    INSERT_EVENT,
    awaiting_row,
    bulk_insert,
    confirmed_row,
    event_row,
    new_ledger,
    null_registry,
    pending_row,
)

COMMANDS = (
    "dispatch",
    "claim",
    "show",
    "queue --limit 50",
    "stats",
    "reconcile --due",
    "verify",
    "verify --full",
    "/metrics",
    "console queue page",
)
DUE, UNRESOLVED = 1_000, 100  # the open work, the same at every size
# the loaded history verified yesterday: the checkpoint a clean run would have stored
# (the load is whole, nothing in progress), so ``verify`` times today's records
VERIFIED = (
    "INSERT INTO verify_checkpoint (only_row, established, seen, snapshot, records, at)"
    " SELECT ?, max(id), max(id), NULL, count(DISTINCT action_id),"
    " '2026-01-01T00:00:00.000000Z' FROM events"
)
FILL_COUNTS = (
    "INSERT INTO action_counts (status, provider, operation, slot, n)"
    " SELECT status, provider, operation, 0, count(*) FROM actions GROUP BY 1, 2, 3"
)


def _unresolved_row(aid: str) -> tuple[Any, ...]:
    row = list(awaiting_row(aid))
    row[13] = "DENIED_UNRESOLVED"  # status
    row[23] = None  # next_check_at: a person's to settle
    row[27] = "budget spent after 3 check(s)"
    return tuple(row)


def rows_for(n: int, chunk: int = 50_000) -> Iterator[tuple[list[Any], list[Any]]]:
    """The ledger's rows and events, ``chunk`` records at a time."""
    for start in range(0, n, chunk):
        rows: list[Any] = []
        events: list[Any] = []
        for i in range(start, min(n, start + chunk)):
            aid = f"g-{i:08d}"
            events.append(event_row(aid))
            events.append(event_row(aid, "claimed", "PENDING", "IN_FLIGHT"))
            events.append(event_row(aid, "outcome", "IN_FLIGHT", "AWAITING_VERIFICATION"))
            if i >= DUE + UNRESOLVED:
                rows.append(confirmed_row(aid))
                events.append(event_row(aid, "reconciled", "AWAITING_VERIFICATION", "CONFIRMED"))
            elif i < DUE:
                rows.append(awaiting_row(aid))
            else:
                rows.append(_unresolved_row(aid))
                events.append(
                    event_row(aid, "unresolved", "AWAITING_VERIFICATION", "DENIED_UNRESOLVED")
                )
        yield rows, events


def load_sqlite(path: str, n: int) -> None:
    import sqlite3

    new_ledger(path)
    for rows, events in rows_for(n):
        bulk_insert(path, rows, events)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(INSERT_ACTION, [pending_row(f"p-{i}") for i in range(200)])
        conn.executemany(INSERT_EVENT, [event_row(f"p-{i}") for i in range(200)])
        conn.execute(FILL_COUNTS)
        conn.execute(VERIFIED, (True,))
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def load_postgres(url: str, n: int) -> None:
    from settled import Ledger

    from .fixtures import COLUMNS
    from .postgres import raw_conn

    Ledger.open(url).close()
    with raw_conn(url) as conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        pending = [pending_row(f"p-{i}") for i in range(200)]
        for rows, events in rows_for(n):
            with cur.copy(f"COPY actions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for r in rows + pending:
                    copy.write_row(r)
            pending = []
            with cur.copy(
                "COPY events (action_id, at, actor, kind, from_status, to_status,"
                " attempt, detail) FROM STDIN"
            ) as copy:
                for e in events:
                    copy.write_row(e)
        with cur.copy(
            "COPY events (action_id, at, actor, kind, from_status, to_status,"
            " attempt, detail) FROM STDIN"
        ) as copy:
            for i in range(200):
                copy.write_row(event_row(f"p-{i}"))
        cur.execute(FILL_COUNTS)
        cur.execute(VERIFIED.replace("?", "%s"), (True,))
        cur.execute("VACUUM ANALYZE actions")
        cur.execute("VACUUM ANALYZE events")


def _ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def measure(location: str, n: int, repeats: int, full: bool = True) -> dict[str, float]:
    """Each command's median time in ms against the ledger at ``location``."""
    from settled import Dispatcher, Ledger, Reconciler
    from settled.clock import to_text
    from settled.storage.ledger import Selection

    led = Ledger.open(location)
    try:
        now = to_text(led.clock(anchor=False).now())
        d = Dispatcher(led, null_registry(), actor="bench")
        rec = Reconciler(led, null_registry(), batch=50, actor="bench")
        out: dict[str, float] = {}
        seq = iter(range(10**6))
        out["dispatch"] = _ms(
            lambda: d.submit("null", "do", {"to": "x@example.com"}, action_id=f"d-{next(seq)}"),
            repeats,
        )
        pending = iter(range(200))
        out["claim"] = _ms(lambda: d.confirm(f"p-{next(pending)}"), repeats)
        one = f"g-{n // 2:08d}"
        out["show"] = _ms(lambda: (led.find(one), led.events(one)), repeats)
        page = Selection(statuses=["DENIED_UNRESOLVED"], limit=50)
        out["queue --limit 50"] = _ms(lambda: led.records(page), repeats)
        out["stats"] = _ms(lambda: led.stats(Selection(), now=now, by="operation"), repeats)
        out["reconcile --due"] = _ms(lambda: rec.run_due(limit=50), repeats)
        out["verify"] = _ms(lambda: led.verify(full=False), repeats)
        out["verify --full"] = _ms(lambda: led.verify(full=True), 1) if full else float("nan")
        out["/metrics"] = _ms(lambda: (led.status_counts(), led.check_failures()), repeats)
        out["console queue page"] = _ms(
            lambda: (led.records(page), led.stats(Selection(), now=now, by="operation")),
            repeats,
        )
        return out
    finally:
        led.close()


@contextmanager
def ledger_of(backend: str, n: int, tmp: str) -> Iterator[str]:
    if backend == "sqlite":
        path = os.path.join(tmp, f"growth-{n}.db")
        load_sqlite(path, n)
        yield path
        return
    from .postgres import schema

    with schema() as url:
        load_postgres(url, n)
        yield url


def _short(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def table(results: dict[tuple[str, int], dict[str, float]], sizes: list[int]) -> list[str]:
    """The Markdown table: each command at each size, and the ratio between sizes."""
    backends = sorted({b for b, _ in results}, key=lambda b: b != "sqlite")
    head = ["command"]
    for b in backends:
        head += [f"{b} {s:,}" for s in sizes]
        head += [f"{b} {_short(sizes[i])}→{_short(sizes[i + 1])}" for i in range(len(sizes) - 1)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cmd in COMMANDS:
        cells = [f"`{cmd}`"]
        for b in backends:
            got = [results[(b, s)][cmd] for s in sizes]
            cells += ["-" if math.isnan(v) else f"{v:.1f} ms" for v in got]  # not measured
            cells += [
                "-" if math.isnan(got[i]) else f"{got[i + 1] / got[i]:.2f}×"
                for i in range(len(got) - 1)
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.growth")
    parser.add_argument("--sizes", default="10000,100000", help="ledger sizes, comma-separated")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (median)")
    parser.add_argument(
        "--no-full", action="store_true", help="leave `verify --full` out (linear by design)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if "postgresql" in backends:
        from .postgres import available

        reason = available()
        if reason is not None:
            print(f"PostgreSQL rows skipped: {reason}", file=sys.stderr)
            backends.remove("postgresql")
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempdir() as tmp:
        for backend in backends:
            for n in sizes:
                t = time.perf_counter()
                with ledger_of(backend, n, tmp) as location:
                    loaded = time.perf_counter() - t
                    results[(backend, n)] = measure(location, n, args.repeats, not args.no_full)
                print(f"{backend} {n:,}: loaded in {loaded:.1f} s", file=sys.stderr)
        durability = durability_line(os.path.join(tmp, "growth-durability.db"))
    print(machine_line(durability))
    print("\n".join(table(results, sizes)))


if __name__ == "__main__":
    main()
