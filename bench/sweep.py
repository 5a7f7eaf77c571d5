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
from .fixtures import INSERT_ACTION, INSERT_EVENT, PAST, T0, awaiting_row, confirmed_row
from .fixtures import event_row, new_ledger
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
        conn.execute(
            "UPDATE actions SET status = 'AWAITING_VERIFICATION', acceptance = 'UNKNOWN',"
            " confirmed_at = NULL, confirmed_by = NULL, lease_owner = NULL, checks = 0,"
            " reason = 'accepted', next_check_at = ? WHERE action_id >= 'due-' AND"
            " action_id < 'due.'",
            (PAST,),
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def raw_batch(conn: sqlite3.Connection, batch: int) -> int:
    """The floor: select one batch through the due index, settle each row, commit."""
    now = "2030-01-01T00:00:00.000000Z"
    conn.execute("BEGIN IMMEDIATE")
    rows = conn.execute(
        "SELECT action_id, status, checks FROM actions WHERE next_check_at IS NOT NULL"
        " AND next_check_at <= ? ORDER BY next_check_at LIMIT ?",
        (now, batch),
    ).fetchall()
    for aid, status, checks in rows:
        conn.execute(
            "UPDATE actions SET lease_owner = NULL, next_check_at = NULL, checks = ?,"
            " acceptance = 'ACCEPTED', delivery = 'DELIVERED', confirmed_at = ?,"
            " confirmed_by = 'reconciliation', reason = NULL, status = 'CONFIRMED',"
            " updated_at = ? WHERE action_id = ? AND status = ?",
            (checks + 1, T0, T0, aid, status),
        )
        conn.execute(INSERT_EVENT, (aid, T0, "raw", "reconciled", status, "CONFIRMED", 1,
                                    json.dumps({"seen": "applied", "check": 1})))
    conn.execute("COMMIT")
    return len(rows)


def interleaved_sweep(raw_path: str, settled_path: str, batch: int, first: str
                      ) -> tuple[float, float, list[float]]:
    """Sweep two copies of one ledger batch by batch, alternating sides, so that both
    see the same machine. Returns (settled rows/s, raw rows/s, settled s per batch)."""
    from settled.ledger import Ledger
    from settled.reconcile import Reconciler

    from .fixtures import null_registry

    conn = raw_conn(raw_path)
    led = Ledger.open(settled_path)
    rec = Reconciler(led, null_registry(), batch=batch, actor="bench")
    spent = {"raw": 0.0, "settled": 0.0}
    rows = {"raw": 0, "settled": 0}
    per_batch: list[float] = []
    live = {"raw", "settled"}
    try:
        while live:
            for side in (("raw", "settled") if first == "raw" else ("settled", "raw")):
                if side not in live:
                    continue
                t = time.perf_counter()
                if side == "raw":
                    n = raw_batch(conn, batch)
                else:
                    n = len(rec.run_due(limit=batch).changes)
                dt = time.perf_counter() - t
                if not n:
                    live.discard(side)
                    continue
                spent[side] += dt
                rows[side] += n
                if side == "settled":
                    per_batch.append(dt)
    finally:
        conn.close()
        led.close()
    if rows["raw"] != rows["settled"]:
        raise RuntimeError(f"sweeps settled {rows['settled']} and {rows['raw']} rows (raw)")
    return rows["settled"] / spent["settled"], rows["raw"] / spent["raw"], per_batch


def peak_rss(path: str, batch: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "bench._sweeper", path, str(batch)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def sweeps(tmp: str, sizes: list[int], repeats: int, batch: int, quick: bool) -> list[Row]:
    import shutil
    import statistics

    path = os.path.join(tmp, "sweep.db")
    copy = os.path.join(tmp, "sweep-raw.db")
    per_size: dict[int, tuple[list[float], list[float], int]] = {}
    batch_s: dict[int, float] = {}
    rss: dict[int, dict[str, Any]] = {}
    for size in sizes:
        due = build(path, size)
        shutil.copyfile(path, copy)
        reps = repeats if due >= 10_000 else repeats * 3
        sett, base, batches = [], [], []
        for r in range(reps):
            reset(path)
            reset(copy)
            s, b, pb = interleaved_sweep(copy, path, batch, "raw" if r % 2 == 0 else "settled")
            sett.append(s)
            base.append(b)
            batches += pb
        per_size[size] = (sett, base, due)
        batch_s[size] = statistics.median(batches)
        remove_db(copy)
        reset(path)
        rss[size] = peak_rss(path, batch)
        remove_db(path)

    rows: list[Row] = []
    label = "quick sizes" if quick else "full sizes"
    for size, (sett, base, due) in per_size.items():
        rows.append(Row(
            "sweep", f"settle {due:,} due rows in a {size:,}-row ledger (batch {batch})",
            "rows/s", sett, base, f"raw sqlite3 indexed batches of {batch}",
            target=0.5 if size == max(sizes) else None,
        ))
    small, big = min(sizes), max(sizes)
    rows.append(Row(
        "sweep", f"time per batch: {big:,} rows vs {small:,} rows ({label})", "ms",
        [batch_s[big] * 1000], [batch_s[small] * 1000], f"the same at {small:,} rows",
        higher_is_better=False, target=1.5,
        note="median over all batches of all repeats",
    ))
    peak = {s: rss[s]["rss_peak"] for s in (small, big)}
    rows.append(Row(
        "memory", f"peak RSS of a daemon-style sweep: {big:,} rows vs {small:,} ({label})",
        "MB", [peak[big]], [peak[small]], f"the same at {small:,} rows",
        higher_is_better=False, target=20.0, delta=True,
        note=f"settled {rss[big]['settled']:,} rows in {rss[big]['seconds']:.1f} s; "
             f"RSS after imports, before opening the ledger: {rss[big]['rss_before']:.0f} MB",
    ))
    return rows


