"""Durable transactions: settled's ledger and dispatcher against raw ``sqlite3`` doing
the same statements on the same schema, WAL and ``synchronous=FULL`` on both sides; and,
for reference, what ``synchronous=FULL`` itself costs against ``NORMAL``."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable

from .common import Row, remove_db
from .fixtures import (
    INSERT_ACTION,
    INSERT_EVENT,
    T0,
    bulk_insert,
    event_row,
    new_ledger,
    null_registry,
    pending_row,
)

LEASE = "2026-01-01T00:01:00.000000Z"


def raw_conn(path: str, synchronous: str = "FULL") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def _fresh(path: str, n: int, prefix: str, op: str = "do") -> list[str]:
    remove_db(path)
    new_ledger(path)
    ids = [f"{prefix}{i}" for i in range(n)]
    bulk_insert(path, [pending_row(a, op) for a in ids], [event_row(a) for a in ids])
    return ids


# -- raw baselines: the same statements settled issues, nothing else --------------------


def raw_claim(conn: sqlite3.Connection, aid: str, begin: bool = True) -> None:
    if begin:
        conn.execute("BEGIN IMMEDIATE")
    # the event first, as the ledger writes it: the schema refuses a status change
    # whose newest event does not record it
    conn.execute(
        INSERT_EVENT,
        (
            aid,
            T0,
            "bench",
            "claimed",
            "PENDING",
            "IN_FLIGHT",
            1,
            json.dumps({"lease_expires_at": LEASE, "idempotency_key": aid + ":1"}),
        ),
    )
    conn.execute(
        "UPDATE actions SET delivery = ?, dispatch_id = ?, lease_owner = ?, lease_expires_at = ?,"
        " next_check_at = ?, dispatched_at = ?, eligible_at = ?, snapshot = ?, status = ?,"
        " updated_at = ? WHERE action_id = ? AND status = ?",
        (
            "IN_FLIGHT",
            "d-" + aid,
            "d-" + aid,
            LEASE,
            LEASE,
            T0,
            T0,
            None,
            "IN_FLIGHT",
            T0,
            aid,
            "PENDING",
        ),
    )
    if begin:
        conn.execute("COMMIT")


def raw_outcome(conn: sqlite3.Connection, aid: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    detail = {
        "verdict": "proven",
        "tries": [
            {
                "try": 1,
                "wire": "answered",
                "status_code": 201,
                "verdict": "proven",
                "detail": "HTTP 201",
            }
        ],
        "reason": "proves the effect",
    }
    conn.execute(
        INSERT_EVENT, (aid, T0, "bench", "outcome", "IN_FLIGHT", "CONFIRMED", 1, json.dumps(detail))
    )
    conn.execute(
        "UPDATE actions SET provider_object_id = ?, delivery = ?, acceptance = ?,"
        " confirmed_at = ?, confirmed_by = ?, next_check_at = ?, reason = ?, lease_owner = ?,"
        " lease_expires_at = ?, status = ?, updated_at = ? WHERE action_id = ? AND status = ?"
        " AND lease_owner = ?",
        (
            "obj-1",
            "DELIVERED",
            "ACCEPTED",
            T0,
            "provider",
            None,
            None,
            None,
            None,
            "CONFIRMED",
            T0,
            aid,
            "IN_FLIGHT",
            "d-" + aid,
        ),
    )
    conn.execute("COMMIT")


def raw_record(conn: sqlite3.Connection, aid: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(INSERT_ACTION + " ON CONFLICT(action_id) DO NOTHING", pending_row(aid))
    conn.execute(INSERT_EVENT, event_row(aid))
    conn.execute("COMMIT")


def raw_record_claim(conn: sqlite3.Connection, aid: str) -> None:
    """Insert, event, guarded claim, event: one durable transaction."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(INSERT_ACTION + " ON CONFLICT(action_id) DO NOTHING", pending_row(aid))
    conn.execute(INSERT_EVENT, event_row(aid))
    raw_claim(conn, aid, begin=False)
    conn.execute("COMMIT")


# -- the measurements ---------------------------------------------------------------------

CHUNK = 50


def interleave(
    n: int,
    base_op: Callable[[int], object],
    settled_op: Callable[[int], object],
    first: str = "base",
) -> tuple[float, float]:
    """Run ``n`` operations on each side in alternating chunks, so that the machine's
    neighbours slow both sides alike. Returns (settled ops/s, baseline ops/s)."""
    order = ["base", "settled"] if first == "base" else ["settled", "base"]
    rates = interleave_many(n, {"base": base_op, "settled": settled_op}, order)
    return rates["settled"], rates["base"]


def interleave_many(
    n: int, ops: dict[str, Callable[[int], object]], order: list[str] | None = None
) -> dict[str, float]:
    """Like ``interleave``, for any number of sides: ops/s per side."""
    order = order or list(ops)
    spent = dict.fromkeys(ops, 0.0)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        for name in order:
            op = ops[name]
            t = time.perf_counter()
            for i in range(lo, hi):
                op(i)
            spent[name] += time.perf_counter() - t
    return {name: n / spent[name] for name in ops}


def _repeat(
    repeats: int, one: Callable[[int], tuple[float, float]]
) -> tuple[list[float], list[float]]:
    sett, base = [], []
    for r in range(repeats):
        s, b = one(r)
        sett.append(s)
        base.append(b)
    return sett, base


def claim_event(tmp: str, n: int, repeats: int) -> list[Row]:
    """One guarded UPDATE + one INSERT, committed: settled's ``Ledger.move``."""
    from settled import Ledger
    from settled.clock import to_text, utcnow
    from settled.model import EventKind, Status
    from settled.storage import Move

    bpath, spath = os.path.join(tmp, "claim-raw.db"), os.path.join(tmp, "claim-settled.db")

    def one(r: int, utils: bool = False) -> tuple[float, float]:
        bids = _fresh(bpath, n, f"b{r}-")
        sids = _fresh(spath, n, f"s{r}-")
        conn = raw_conn(bpath)
        led = Ledger.open(spath)
        if utils:
            import sqlite_utils

            uconn = raw_conn(spath)
            db = sqlite_utils.Database(uconn)

        def settled_op(i: int) -> None:
            aid = sids[i]
            if utils:
                with db.atomic():  # the event first, as the ledger writes it
                    db["events"].insert(
                        {
                            "action_id": aid,
                            "at": T0,
                            "actor": "bench",
                            "kind": "claimed",
                            "from_status": "PENDING",
                            "to_status": "IN_FLIGHT",
                            "attempt": 1,
                            "detail": "{}",
                        }
                    )
                    db["actions"].update(
                        aid,
                        {
                            "status": "IN_FLIGHT",
                            "delivery": "IN_FLIGHT",
                            "lease_owner": "d-" + aid,
                            "lease_expires_at": LEASE,
                            "updated_at": T0,
                        },
                    )
                return
            at = to_text(utcnow())
            led.move(
                Move(
                    aid,
                    Status.PENDING,
                    Status.IN_FLIGHT,
                    at,
                    "bench",
                    EventKind.CLAIMED,
                    detail={"lease_expires_at": LEASE, "idempotency_key": aid + ":1"},
                    values={
                        "delivery": "IN_FLIGHT",
                        "dispatch_id": "d-" + aid,
                        "lease_owner": "d-" + aid,
                        "lease_expires_at": LEASE,
                        "next_check_at": LEASE,
                        "dispatched_at": at,
                        "eligible_at": at,
                        "snapshot": None,
                    },
                )
            )

        try:
            return interleave(
                n,
                lambda i: raw_claim(conn, bids[i]),
                settled_op,
                "base" if r % 2 == 0 else "settled",
            )
        finally:
            conn.close()
            led.close()
            if utils:
                uconn.close()

    def durability(r: int) -> tuple[float, float]:
        """The same raw claim + event under the ledger's synchronous=FULL and under
        NORMAL (WAL both): what the durability choice costs per commit."""
        fids = _fresh(bpath, n, f"f{r}-")
        nids = _fresh(spath, n, f"n{r}-")
        full, normal = raw_conn(bpath, "FULL"), raw_conn(spath, "NORMAL")
        try:
            return interleave(
                n,
                lambda i: raw_claim(normal, nids[i]),
                lambda i: raw_claim(full, fids[i]),
                "base" if r % 2 == 0 else "settled",
            )
        finally:
            full.close()
            normal.close()

    sett_v, base_v = _repeat(repeats, one)
    util_v, base2 = _repeat(repeats, lambda r: one(r, utils=True))
    full_v, normal_v = _repeat(repeats, durability)
    remove_db(bpath)
    remove_db(spath)
    return [
        Row(
            "ledger",
            "claim + event, committed (Ledger.move)",
            "txn/s",
            sett_v,
            base_v,
            "raw sqlite3, same SQL",
            note="the durable floor everything else is measured against",
        ),
        Row(
            "ledger",
            "same through sqlite-utils update + insert (not used)",
            "txn/s",
            util_v,
            base2,
            "raw sqlite3, same SQL",
            note="why the hot path is raw SQL (sqlite-utils only creates and migrates)",
        ),
        Row(
            "ledger",
            "durability chosen vs not chosen: raw claim + event, synchronous=FULL",
            "txn/s",
            full_v,
            normal_v,
            "the same, synchronous=NORMAL (WAL both)",
            note="what the ledger's durability costs; NORMAL can lose the last commits"
            " on power loss",
        ),
    ]


def pipeline(tmp: str, n: int, repeats: int) -> list[Row]:
    """The in-process dispatch pipeline with the null provider."""
    from settled import Ledger
    from settled.dispatch import Dispatcher

    bpath, spath = os.path.join(tmp, "pipe-raw.db"), os.path.join(tmp, "pipe-settled.db")

    def confirm(r: int) -> tuple[float, float]:
        bids = _fresh(bpath, n, f"b{r}-")
        sids = _fresh(spath, n, f"s{r}-")
        conn = raw_conn(bpath)
        reg = null_registry()
        led = Ledger.open(spath)
        d = Dispatcher(led, reg, actor="bench")

        def base_op(i: int) -> None:  # claim + outcome: two durable transactions
            raw_claim(conn, bids[i])
            raw_outcome(conn, bids[i])

        def settled_op(i: int) -> None:
            rep = d.confirm(sids[i])
            assert rep.record is not None and rep.record.status == "CONFIRMED", rep

        try:
            return interleave(n, base_op, settled_op, "base" if r % 2 == 0 else "settled")
        finally:
            conn.close()
            led.close()

    def submit(r: int) -> tuple[float, float]:
        remove_db(bpath)
        remove_db(spath)
        new_ledger(bpath)
        conn = raw_conn(bpath)
        reg = null_registry()
        led = Ledger.open(spath)
        d = Dispatcher(led, reg, actor="bench")

        def base_op(i: int) -> None:  # record + claim, then outcome: two
            aid = f"b{r}-{i}"
            raw_record_claim(conn, aid)
            raw_outcome(conn, aid)

        def settled_op(i: int) -> None:
            rep = d.submit(
                "null", "do", {"to": "customer@example.com", "n": i}, action_id=f"s{r}-{i}"
            )
            assert rep.record is not None and rep.record.status == "CONFIRMED", rep

        try:
            return interleave(n, base_op, settled_op, "base" if r % 2 == 0 else "settled")
        finally:
            conn.close()
            led.close()

    c_s, c_b = _repeat(repeats, confirm)
    s_s, s_b = _repeat(repeats, submit)
    remove_db(bpath)
    remove_db(spath)
    return [
        Row(
            "dispatch",
            "claim → null provider → outcome (Dispatcher.confirm)",
            "actions/s",
            c_s,
            c_b,
            "raw sqlite3: the same 2 durable txns",
            target=0.66,
        ),
        Row(
            "dispatch",
            "record + claim → null provider → outcome (Dispatcher.submit)",
            "actions/s",
            s_s,
            s_b,
            "raw sqlite3: the same 2 durable txns",
            target=0.66,
        ),
    ]


__all__ = [
    "claim_event",
    "interleave",
    "interleave_many",
    "pipeline",
    "raw_claim",
    "raw_outcome",
    "raw_record",
    "raw_record_claim",
]
