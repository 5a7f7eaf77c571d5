"""Bulk dispatch and concurrent verification against a provider that answers after
``latency`` seconds (the sim server in its own process, ``--latency``).

Sides, each timed in the same run, taking turns per repeat:

- settled: ``Dispatcher.submit_many`` (groups of 64, 32 threads; every group's claims
  committed before its requests leave, outcomes committed in groups);
- raw httpx POST loops with no ledger at all: sequential, and from 32 threads;
- raw sqlite3 + httpx doing the same durable work: each group's records and claims in
  one transaction, the POSTs from 32 threads, the outcomes in one transaction;
- today's one-at-a-time ``Dispatcher.submit`` loop;
- ``Reconciler.run_due`` with 32 threads against raw 32-thread GETs of the same
  resources, and against the same pass in turn (``reconcile --due`` as it was).

Sequential sides send fewer actions (a rate is a rate; 2,000 requests one at a time
at 50 ms would take 100 s)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .common import Row, remove_db
from .fixtures import INSERT_ACTION, INSERT_EVENT, event_row, new_ledger, pending_row
from .http_e2e import sim_process
from .ledger_ops import raw_claim, raw_conn

ROOT = str(Path(__file__).resolve().parent.parent)
THREADS = 32
GROUP = 64
PARAMS = {"to": "customer@example.com", "body": "your booking is confirmed"}
PAST = "2026-01-01T00:00:30.000000Z"


def _jsonl(prefix: str, n: int) -> bytes:
    return b"".join(
        json.dumps({"action_id": f"{prefix}-{i}", "params": {**PARAMS, "n": i}}).encode() + b"\n"
        for i in range(n)
    )


def _body(aid: str, i: int) -> dict[str, Any]:
    return {"action_id": aid, "reconciliation_key": "stl-" + aid, "params": {**PARAMS, "n": i}}


def _registry(url: str) -> Any:
    from settled.providers import Registry

    return Registry({"sim": {"type": "sim", "base_url": url, "timeout": 5.0}}, source="bench")


def _raw_outcome_many(conn: sqlite3.Connection, ids: list[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for aid in ids:
        conn.execute(
            INSERT_EVENT,
            (aid, PAST, "bench", "outcome", "IN_FLIGHT", "CONFIRMED", 1, '{"verdict": "proven"}'),
        )
        conn.execute(
            "UPDATE actions SET provider_object_id = ?, delivery = ?, acceptance = ?,"
            " confirmed_at = ?, confirmed_by = ?, next_check_at = ?, reason = ?,"
            " lease_owner = ?, lease_expires_at = ?, status = ?, updated_at = ?"
            " WHERE action_id = ? AND status = ? AND lease_owner = ?",
            (
                "obj-1",
                "DELIVERED",
                "ACCEPTED",
                PAST,
                "provider",
                None,
                None,
                None,
                None,
                "CONFIRMED",
                PAST,
                aid,
                "IN_FLIGHT",
                "d-" + aid,
            ),
        )
    conn.execute("COMMIT")


def dispatch_rows(tmp: str, n: int, seq: int, repeats: int, latencies: list[float]) -> list[Row]:
    import httpx

    from settled import Ledger
    from settled.bulk import read_lines
    from settled.dispatch import Dispatcher

    rows: list[Row] = []
    for latency in latencies:
        ms = f"{latency * 1000:g} ms"
        got: dict[str, list[float]] = {
            k: [] for k in ("bulk", "seq", "threads", "floor", "submit", "bulk_seq")
        }
        with (
            sim_process(latency) as url,
            httpx.Client(
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=THREADS * 2)
            ) as client,
        ):

            def post(aid: str, i: int, url: str = url, client: httpx.Client = client) -> None:
                resp = client.post(
                    f"{url}/v1/book",
                    json=_body(aid, i),
                    headers={"Idempotency-Key": aid + ":1"},
                    timeout=5.0,
                )
                assert resp.status_code == 201, resp.text

            for r in range(repeats):
                path = os.path.join(tmp, f"bulk-{r}.db")
                rpath = os.path.join(tmp, f"bulk-raw-{r}.db")
                for p in (path, rpath):
                    remove_db(p)
                new_ledger(rpath)
                reg = _registry(url)
                led = Ledger.open(path)
                conn = raw_conn(rpath)
                d = Dispatcher(led, reg, actor="bench")

                def bulk(conc: int, count: int, tag: str, d: Dispatcher = d) -> float:
                    t = time.perf_counter()
                    done = list(
                        d.submit_many(
                            "sim",
                            "book",
                            read_lines(io.BytesIO(_jsonl(tag, count))),
                            concurrency=conc,
                        )
                    )
                    dt = time.perf_counter() - t
                    assert all(x.report and x.report.result == "succeeded" for x in done), done[:1]
                    return count / dt

                def seq_loop(tag: str) -> float:
                    t = time.perf_counter()
                    for i in range(seq):
                        post(f"{tag}-{i}", i)
                    return seq / (time.perf_counter() - t)

                def thread_loop(tag: str) -> float:
                    t = time.perf_counter()
                    with ThreadPoolExecutor(THREADS) as pool:
                        list(pool.map(lambda i: post(f"{tag}-{i}", i), range(n)))
                    return n / (time.perf_counter() - t)

                def floor(tag: str, conn: sqlite3.Connection = conn) -> float:
                    t = time.perf_counter()
                    with ThreadPoolExecutor(THREADS) as pool:
                        for lo in range(0, n, GROUP):
                            ids = [f"{tag}-{i}" for i in range(lo, min(n, lo + GROUP))]
                            conn.execute("BEGIN IMMEDIATE")
                            for aid in ids:
                                conn.execute(INSERT_ACTION, pending_row(aid))
                                conn.execute(INSERT_EVENT, event_row(aid))
                                raw_claim(conn, aid, begin=False)
                            conn.execute("COMMIT")
                            list(pool.map(lambda a: post(a, 0), ids))
                            _raw_outcome_many(conn, ids)
                    return n / (time.perf_counter() - t)

                def submit_loop(tag: str, d: Dispatcher = d) -> float:
                    t = time.perf_counter()
                    for i in range(seq):
                        rep = d.submit("sim", "book", {**PARAMS, "n": i}, action_id=f"{tag}-{i}")
                        assert rep.result == "succeeded", rep
                    return seq / (time.perf_counter() - t)

                sides: dict[str, Callable[[], float]] = {
                    "bulk": lambda r=r: bulk(THREADS, n, f"b{r}"),
                    "seq": lambda r=r: seq_loop(f"q{r}"),
                    "threads": lambda r=r: thread_loop(f"t{r}"),
                    "floor": lambda r=r: floor(f"f{r}"),
                    "submit": lambda r=r: submit_loop(f"s{r}"),
                    "bulk_seq": lambda r=r: bulk(1, seq, f"o{r}"),
                }
                order = list(sides)
                order = order[r % len(order) :] + order[: r % len(order)]
                try:
                    bulk(THREADS, 64, f"warm{r}")
                    for side in order:
                        got[side].append(sides[side]())
                finally:
                    led.close()
                    reg.close()
                    conn.close()
                    remove_db(path)
                    remove_db(rpath)
        rows += [
            Row(
                "bulk",
                f"bulk dispatch, {n:,} actions, {THREADS} threads, provider {ms}",
                "actions/s",
                got["bulk"],
                got["seq"],
                "raw httpx sequential POST loop, no ledger",
                target=5.0 if latency == 0.01 else None,
                note=f"every group of {GROUP} claimed (1 fsync) before its requests leave",
            ),
            Row(
                "bulk",
                f"same, against {THREADS} threads with no ledger ({ms})",
                "actions/s",
                got["bulk"],
                got["threads"],
                f"raw httpx POSTs from {THREADS} threads, no ledger",
                target=0.85,
            ),
            Row(
                "bulk",
                f"same, against raw sqlite3 + httpx doing the same work ({ms})",
                "actions/s",
                got["bulk"],
                got["floor"],
                f"raw: group of {GROUP} claimed in 1 txn, {THREADS}-thread POSTs, outcomes in 1 txn",
                note="the fair floor",
            ),
            Row(
                "bulk",
                f"same, against today's one-at-a-time submit loop ({ms})",
                "actions/s",
                got["bulk"],
                got["submit"],
                "Dispatcher.submit per action, in turn",
                note=f"the loop sends {seq:,} actions",
            ),
            Row(
                "bulk",
                f"bulk in turn (concurrency 1) vs the submit loop ({ms})",
                "actions/s",
                got["bulk_seq"],
                got["submit"],
                "Dispatcher.submit per action, in turn",
                note="grouped commits alone",
            ),
        ]
    return rows


def _due_ledger(path: str, ids: list[str]) -> None:
    """Rows of the sim's ``send`` due for their check (each query finds nothing yet)."""
    from .fixtures import awaiting_row

    remove_db(path)
    new_ledger(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        for aid in ids:
            row = list(awaiting_row(aid))
            row[1], row[2] = "sim", "send"
            conn.execute(INSERT_ACTION, row)
            conn.execute(INSERT_EVENT, event_row(aid))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _make_due(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            "UPDATE actions SET lease_owner = NULL, checks = 0, next_check_at = ?", (PAST,)
        )
    finally:
        conn.close()


def reconcile_rows(tmp: str, n: int, seq: int, repeats: int, latencies: list[float]) -> list[Row]:
    import httpx

    from settled import Ledger
    from settled.clock import Clock
    from settled.reconcile import Reconciler

    rows: list[Row] = []
    for latency in latencies:
        ms = f"{latency * 1000:g} ms"
        got: dict[str, list[float]] = {"conc": [], "gets": [], "turn": [], "seq_gets": []}
        path, spath = os.path.join(tmp, "rec.db"), os.path.join(tmp, "rec-seq.db")
        ids = [f"r-{i}" for i in range(n)]
        _due_ledger(path, ids)
        _due_ledger(spath, ids[:seq])
        with (
            sim_process(latency) as url,
            httpx.Client(
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=THREADS * 2)
            ) as client,
        ):

            def get(aid: str, url: str = url, client: httpx.Client = client) -> None:
                resp = client.get(f"{url}/v1/effects/stl-{aid}", timeout=5.0)
                assert resp.status_code == 404

            for r in range(repeats):
                reg = _registry(url)
                led, sled = Ledger.open(path), Ledger.open(spath)

                def run(ledger: Ledger, conc: int, count: int, reg: Any = reg) -> float:
                    _make_due(ledger.location)
                    rec = Reconciler(ledger, reg, clock=Clock(), actor="bench", concurrency=conc)
                    t = time.perf_counter()
                    report = rec.run_due()
                    dt = time.perf_counter() - t
                    assert len(report.waiting) == count, (len(report.waiting), report.skipped[:1])
                    return count / dt

                def gets(threads: int, count: int, ids: list[str] = ids) -> float:
                    t = time.perf_counter()
                    if threads == 1:
                        for aid in ids[:count]:
                            get(aid)
                    else:
                        with ThreadPoolExecutor(threads) as pool:
                            list(pool.map(get, ids[:count]))
                    return count / (time.perf_counter() - t)

                sides: dict[str, Callable[[], float]] = {
                    "conc": lambda led=led: run(led, THREADS, n),
                    "gets": lambda: gets(THREADS, n),
                    "turn": lambda sled=sled: run(sled, 1, seq),
                    "seq_gets": lambda: gets(1, seq),
                }
                order = list(sides)
                order = order[r % len(order) :] + order[: r % len(order)]
                try:
                    for side in order:
                        got[side].append(sides[side]())
                finally:
                    led.close()
                    sled.close()
                    reg.close()
        remove_db(path)
        remove_db(spath)
        rows += [
            Row(
                "bulk",
                f"reconcile --due --concurrency {THREADS}, {n:,} due rows ({ms})",
                "rows/s",
                got["conc"],
                got["gets"],
                f"raw httpx GETs from {THREADS} threads, no ledger",
                target=0.85,
                note="each row: a leased batch, the query, a guarded write (group commit)",
            ),
            Row(
                "bulk",
                f"same, against reconcile --due in turn ({ms})",
                "rows/s",
                got["conc"],
                got["turn"],
                "Reconciler.run_due, concurrency 1",
                note=f"the pass in turn checks {seq:,} rows",
            ),
            Row(
                "bulk",
                f"reconcile --due in turn vs raw sequential GETs ({ms})",
                "rows/s",
                got["turn"],
                got["seq_gets"],
                "raw httpx sequential GETs, no ledger",
                note="reference",
            ),
        ]
    return rows


def reconcile_process_rows(tmp: str, n: int, repeats: int, latency: float) -> list[Row]:
    """``settled reconcile --due --concurrency 32`` as a whole CLI process (start-up,
    the pass, its lines on a pipe) against raw 32-thread GETs of the same resources."""
    import httpx

    ms = f"{latency * 1000:g} ms"
    got: dict[str, list[float]] = {"cli": [], "gets": []}
    path = os.path.join(tmp, "rec-cli.db")
    ids = [f"r-{i}" for i in range(n)]
    _due_ledger(path, ids)
    conf = os.path.join(tmp, "rec-cli.toml")
    env = dict(os.environ, SETTLED_DB=path, SETTLED_CONFIG=conf, NO_COLOR="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "settled", "reconcile", "--due", "--concurrency", str(THREADS)]
    with (
        sim_process(latency) as url,
        httpx.Client(
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=THREADS * 2)
        ) as client,
    ):
        with open(conf, "w", encoding="utf-8") as fh:
            fh.write(f'[providers.sim]\ntype = "sim"\nbase_url = "{url}"\ntimeout = 5.0\n')

        def get(aid: str) -> None:
            resp = client.get(f"{url}/v1/effects/stl-{aid}", timeout=5.0)
            assert resp.status_code == 404

        def cli() -> float:
            _make_due(path)
            t = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            dt = time.perf_counter() - t
            assert out.returncode == 0, out.stderr
            assert out.stdout.count("still waiting") == n, out.stdout[-300:] + out.stderr
            return n / dt

        def gets() -> float:
            t = time.perf_counter()
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(get, ids))
            return n / (time.perf_counter() - t)

        for r in range(repeats):
            for side in ("cli", "gets") if r % 2 == 0 else ("gets", "cli"):
                got[side].append(cli() if side == "cli" else gets())
    remove_db(path)
    return [
        Row(
            "bulk",
            f"reconcile --due --concurrency {THREADS} as a CLI process, {n:,} due rows ({ms})",
            "rows/s",
            got["cli"],
            got["gets"],
            f"raw httpx GETs from {THREADS} threads, no ledger",
            target=0.85,
            note="the whole process: start-up, the pass, a line per row on a pipe",
        )
    ]


def rss_rows(tmp: str, sizes: tuple[int, int]) -> list[Row]:
    """Peak RSS of ``settled dispatch --from FILE`` (a real process) for two sizes."""
    peak: dict[int, dict[str, Any]] = {}
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for size in sizes:
        src = os.path.join(tmp, f"lines-{size}.jsonl")
        with open(src, "wb") as fh:
            for lo in range(0, size, 10_000):
                fh.write(
                    _jsonl(f"m{size}", min(10_000, size - lo)).replace(
                        b'"m', b'"m' + str(lo).encode() + b"-"
                    )
                )
        db = os.path.join(tmp, f"rss-{size}.db")
        remove_db(db)
        out = subprocess.run(
            [sys.executable, "-m", "bench._bulk_rss", db, src],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=1800,
            check=True,
        ).stdout
        peak[size] = json.loads(out.strip().splitlines()[-1])
        remove_db(db)
        os.remove(src)
    small, big = sizes
    return [
        Row(
            "memory",
            f"peak RSS of dispatch --from: {big:,} lines vs {small:,}",
            "MB",
            [peak[big]["rss_peak"]],
            [peak[small]["rss_peak"]],
            f"the same with {small:,} lines",
            higher_is_better=False,
            target=20.0,
            delta=True,
            note=f"{big:,} lines (null provider, in turn) in {peak[big]['seconds']:.1f} s; "
            f"{peak[big]['rss_peak']:.0f} MB peak; the file is streamed, never loaded",
        )
    ]


__all__ = ["dispatch_rows", "reconcile_process_rows", "reconcile_rows", "rss_rows"]
