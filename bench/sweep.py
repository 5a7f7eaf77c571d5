"""Reconciliation: find and settle the due rows of ledgers of growing size with the
null query, against raw ``sqlite3`` doing indexed batches of the same size.

Each ledger holds ``size`` actions: 10 % accepted and due for their check, the rest
settled long ago (terminal rows carry no check time, so they stay out of the due
index). Each due row gets one guarded UPDATE and one event on both sides."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import Row, remove_db
from .fixtures import (
    INSERT_ACTION,
    INSERT_EVENT,
    PAST,
    T0,
    awaiting_row,
    confirmed_row,
    event_row,
    new_ledger,
)
from .ledger_ops import raw_conn

ROOT = str(Path(__file__).resolve().parent.parent)
DUE_SHARE = 10  # one row in ten is due


def _ids(size: int) -> Iterator[tuple[str, bool]]:
    step = DUE_SHARE
    for i in range(size):
        due = i % step == 0
        yield (f"due-{i:08d}" if due else f"old-{i:08d}"), due


def build(path: str, size: int) -> int:
    """Create the ledger (not timed); returns how many rows are due."""
    remove_db(path)
    new_ledger(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        conn.executemany(
            INSERT_ACTION, (awaiting_row(a) if due else confirmed_row(a) for a, due in _ids(size))
        )
        conn.executemany(INSERT_EVENT, (event_row(a) for a, _ in _ids(size)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return (size + DUE_SHARE - 1) // DUE_SHARE


def reset(path: str) -> None:
    """Make the same rows due again (not timed)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        # each status change with the event that records it, as the schema requires
        conn.execute(
            "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
            " detail) SELECT action_id, ?, 'bench', 'reset', status, 'AWAITING_VERIFICATION',"
            " attempt, '{}' FROM actions WHERE action_id >= 'due-' AND action_id < 'due.'"
            " AND status IS NOT 'AWAITING_VERIFICATION'",
            (PAST,),
        )
        conn.execute(
            "UPDATE actions SET status = 'AWAITING_VERIFICATION', acceptance = 'UNKNOWN',"
            " confirmed_at = NULL, confirmed_by = NULL, lease_owner = NULL, checks = 0,"
            " reason = 'accepted', next_check_at = ? WHERE action_id >= 'due-' AND"
            " action_id < 'due.'",
            (PAST,),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def raw_batch(conn: sqlite3.Connection, batch: int, lease: bool = False) -> int:
    """The floor: select one batch through the due index, settle each row, commit.

    With ``lease``, first stamp the batch with a lease in its own transaction, as a
    sweep must when several reconcilers share a ledger and it will not hold the write
    lock across provider queries; then settle under that lease."""
    now = "2030-01-01T00:00:00.000000Z"
    conn.execute("BEGIN IMMEDIATE")
    rows = conn.execute(
        "SELECT action_id, status, checks FROM actions WHERE next_check_at IS NOT NULL"
        " AND next_check_at <= ? ORDER BY next_check_at LIMIT ?",
        (now, batch),
    ).fetchall()
    guard = ""
    if lease:
        conn.executemany(
            "UPDATE actions SET lease_owner = 'raw', next_check_at = ? WHERE action_id = ?",
            [("2031-01-01T00:00:00.000000Z", aid) for aid, _, _ in rows],
        )
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        guard = " AND lease_owner = 'raw'"
    for aid, status, checks in rows:
        conn.execute(
            INSERT_EVENT,
            (
                aid,
                T0,
                "raw",
                "reconciled",
                status,
                "CONFIRMED",
                1,
                json.dumps({"seen": "applied", "check": 1}),
            ),
        )
        conn.execute(
            "UPDATE actions SET lease_owner = NULL, next_check_at = NULL, checks = ?,"
            " acceptance = 'ACCEPTED', delivery = 'DELIVERED', confirmed_at = ?,"
            " confirmed_by = 'reconciliation', reason = NULL, status = 'CONFIRMED',"
            " updated_at = ? WHERE action_id = ? AND status = ?" + guard,
            (checks + 1, T0, T0, aid, status),
        )
    conn.execute("COMMIT")
    return len(rows)


SIDES = ("raw", "leased", "settled")


def interleaved_sweep(
    paths: dict[str, str], batch: int, rotate: int
) -> tuple[dict[str, float], list[float]]:
    """Sweep copies of one ledger batch by batch, taking turns, so that every side
    sees the same machine. Returns rows/s per side and settled's seconds per batch."""
    from settled import Ledger
    from settled.reconcile import Reconciler

    from .fixtures import null_registry

    raw, leased = raw_conn(paths["raw"]), raw_conn(paths["leased"])
    led = Ledger.open(paths["settled"])
    reconciler = Reconciler(led, null_registry(), batch=batch, actor="bench")
    steps = {
        "raw": lambda: raw_batch(raw, batch),
        "leased": lambda: raw_batch(leased, batch, lease=True),
        "settled": lambda: len(reconciler.run_due(limit=batch).changes),
    }
    order = list(SIDES[rotate % 3 :] + SIDES[: rotate % 3])
    spent = dict.fromkeys(SIDES, 0.0)
    rows = dict.fromkeys(SIDES, 0)
    per_batch: list[float] = []
    live = set(SIDES)
    try:
        while live:
            for side in order:
                if side not in live:
                    continue
                t = time.perf_counter()
                n = steps[side]()
                dt = time.perf_counter() - t
                if not n:
                    live.discard(side)
                    continue
                spent[side] += dt
                rows[side] += n
                if side == "settled":
                    per_batch.append(dt)
    finally:
        raw.close()
        leased.close()
        led.close()
    if len(set(rows.values())) != 1:
        raise RuntimeError(f"the sweeps settled different numbers of rows: {rows}")
    return {side: rows[side] / spent[side] for side in SIDES}, per_batch


def peak_rss(path: str, batch: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "bench._sweeper", path, str(batch)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def sweeps(tmp: str, sizes: list[int], repeats: int, batch: int, quick: bool) -> list[Row]:
    import shutil
    import statistics

    paths = {side: os.path.join(tmp, f"sweep-{side}.db") for side in SIDES}
    per_size: dict[int, tuple[dict[str, list[float]], int]] = {}
    batch_s: dict[int, float] = {}
    rss: dict[int, dict[str, Any]] = {}
    for size in sizes:
        due = build(paths["settled"], size)
        for side in ("raw", "leased"):
            shutil.copyfile(paths["settled"], paths[side])
        reps = repeats if due >= 10_000 else repeats * 3
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        batches: list[float] = []
        for r in range(reps):
            for p in paths.values():
                reset(p)
            got, pb = interleaved_sweep(paths, batch, r)
            for side in SIDES:
                rates[side].append(got[side])
            batches += pb
        per_size[size] = (rates, due)
        batch_s[size] = statistics.median(batches)
        for side in ("raw", "leased"):
            remove_db(paths[side])
        reset(paths["settled"])
        rss[size] = peak_rss(paths["settled"], batch)
        remove_db(paths["settled"])

    rows: list[Row] = []
    label = "quick sizes" if quick else "full sizes"
    for size, (rates, due) in per_size.items():
        rows.append(
            Row(
                "sweep",
                f"settle {due:,} due rows in a {size:,}-row ledger (batch {batch})",
                "rows/s",
                rates["settled"],
                rates["raw"],
                f"raw sqlite3 indexed batches of {batch}",
                note="reference: raw takes no lease" if size == max(sizes) else "",
            )
        )
    big_rates = per_size[max(sizes)][0]
    rows.append(
        Row(
            "sweep",
            f"same at {max(sizes):,} rows, against raw batches that also take a lease",
            "rows/s",
            big_rates["settled"],
            big_rates["leased"],
            "raw: lease txn, then settle txn, per batch",
            target=0.6,
            note="the fair floor: the lease lets several reconcilers share a ledger without holding the lock "
            "across provider queries",
        )
    )
    small, big = min(sizes), max(sizes)
    rows.append(
        Row(
            "sweep",
            f"time per batch: {big:,} rows vs {small:,} rows ({label})",
            "ms",
            [batch_s[big] * 1000],
            [batch_s[small] * 1000],
            f"the same at {small:,} rows",
            higher_is_better=False,
            target=1.5,
            note="median over all batches of all repeats",
        )
    )
    peak = {s: rss[s]["rss_peak"] for s in (small, big)}
    rows.append(
        Row(
            "memory",
            f"peak RSS of a daemon-style sweep: {big:,} rows vs {small:,} ({label})",
            "MB",
            [peak[big]],
            [peak[small]],
            f"the same at {small:,} rows",
            higher_is_better=False,
            target=20.0,
            delta=True,
            note=f"settled {rss[big]['settled']:,} rows in {rss[big]['seconds']:.1f} s; "
            f"RSS after imports, before opening the ledger: {rss[big]['rss_before']:.0f} MB",
        )
    )
    return rows
