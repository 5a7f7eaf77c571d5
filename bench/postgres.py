"""PostgreSQL: settled's PostgreSQL ledger against raw psycopg doing the same statements
in the same run, and against the SQLite ledger where the question is which to choose.

- claim + outcome (``Dispatcher.confirm`` with the null provider): two durable
  transactions, each one guarded ``UPDATE … RETURNING`` with its event in one statement;
- the sweep: N daemons (processes) settling the same due rows (``FOR UPDATE SKIP
  LOCKED`` batches), as a scaling ratio against one daemon;
- dispatch throughput with 4 processes against one process, and against SQLite.

Every ledger is a fresh schema in ``SETTLED_BENCH_POSTGRES`` (default
``postgresql:///test``), dropped afterwards. Figures are for reading, never for failing
a build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .common import Row, remove_db
from .fixtures import (
    COLUMNS,
    FAR,
    PAST,
    T0,
    awaiting_row,
    confirmed_row,
    event_row,
    null_registry,
    pending_row,
)
from .ledger_ops import interleave, interleave_many
from .procs import _run as run_workers

SERVER = os.environ.get("SETTLED_BENCH_POSTGRES", "postgresql:///test")
ROOT = str(Path(__file__).resolve().parent.parent)
LEASE = "2026-01-01T00:01:00.000000Z"
DUE_SHARE = 10


def _psycopg() -> Any:
    import psycopg

    return psycopg


def available() -> str | None:
    """Why the PostgreSQL rows cannot run here, or None."""
    try:
        psycopg = _psycopg()
    except ImportError:
        return "psycopg is not installed (pip install 'settled[postgres]')"
    try:
        psycopg.connect(SERVER, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL server at {SERVER}: {' '.join(str(exc).split())[:120]}"
    return None


_n = iter(range(1, 10**6))


@contextmanager
def schema() -> Iterator[str]:
    """A fresh, empty schema; its URL."""
    psycopg = _psycopg()
    name = f"settled_bench_{os.getpid()}_{next(_n)}"
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in SERVER else "?"
    url = f"{SERVER}{sep}options=-csearch_path%3D{name}&application_name={name}"
    try:
        yield url
    finally:
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')


def raw_conn(url: str) -> Any:
    conn = _psycopg().connect(url, autocommit=True)
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def fill(url: str, rows: list[tuple[Any, ...]], events: list[tuple[Any, ...]]) -> None:
    """Create the schema with settled's migrations, then COPY rows in (not timed)."""
    from settled import Ledger

    Ledger.open(url).close()
    with raw_conn(url) as conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        with cur.copy(f"COPY actions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)
        with cur.copy(
            "COPY events (action_id, at, actor, kind, from_status, to_status,"
            " attempt, detail) FROM STDIN"
        ) as copy:
            for e in events:
                copy.write_row(e)
        cur.execute("ANALYZE actions")


# -- raw psycopg: the statements settled issues, written out by hand ---------------------

_RET = (
    "action_id, provider, operation, params, params_hash, tier, reconciliation_key,"
    " eligible_at, requires_manual_verification, attempt, idempotency_key, dispatch_id,"
    " provider_object_id, status, delivery, acceptance, dispatched_at, confirmed_at,"
    " confirmed_by, created_at, updated_at, lease_owner, lease_expires_at, next_check_at,"
    " verify_started_at, verify_deadline_at, checks, reason, snapshot, lands_by,"
    " contradiction, declared"
)
_EVENT = (
    " e AS (INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
    " detail) SELECT action_id, %s::timestamptz, %s, %s, %s, %s, attempt, %s FROM m)"
)
RAW_CLAIM = (
    "WITH m AS (UPDATE actions SET delivery = %s, dispatch_id = %s, lease_owner = %s,"
    " lease_expires_at = %s, next_check_at = %s, dispatched_at = %s, eligible_at = %s,"
    " lands_by = %s, snapshot = %s, status = %s, updated_at = %s"
    f" WHERE action_id = %s AND status = %s RETURNING {_RET}),{_EVENT} SELECT {_RET} FROM m"
)
RAW_OUTCOME = (
    "WITH m AS (UPDATE actions SET provider_object_id = %s, delivery = %s, acceptance = %s,"
    " confirmed_at = %s, confirmed_by = %s, next_check_at = %s, reason = %s, lease_owner = %s,"
    " lease_expires_at = %s, status = %s, updated_at = %s WHERE action_id = %s AND status = %s"
    f" AND lease_owner = %s RETURNING {_RET}),{_EVENT} SELECT {_RET} FROM m"
)


def _raw_outcome(conn: Any, aid: str, owner: str) -> None:
    """The outcome of a claimed action, as settled writes it: one statement, its event
    with it."""
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
        RAW_OUTCOME,
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
            owner,
            T0,
            "bench",
            "outcome",
            "IN_FLIGHT",
            "CONFIRMED",
            json.dumps(detail),
        ),
    ).fetchall()


def raw_claim_outcome(conn: Any, aid: str) -> None:
    """Claim, then outcome: two durable transactions, the same statements as settled's
    (each one statement in autocommit: its own transaction, one round trip)."""
    owner = "d-" + aid
    conn.execute(
        RAW_CLAIM,
        (
            "IN_FLIGHT",
            owner,
            owner,
            LEASE,
            LEASE,
            T0,
            T0,
            LEASE,
            None,
            "IN_FLIGHT",
            T0,
            aid,
            "PENDING",
            T0,
            "bench",
            "claimed",
            "PENDING",
            "IN_FLIGHT",
            json.dumps({"lease_expires_at": LEASE, "idempotency_key": aid + ":1"}),
        ),
    ).fetchall()
    _raw_outcome(conn, aid, owner)


_INSERT_COLS = _RET.replace(", snapshot, lands_by, contradiction, declared", "")
RAW_RECORD_CLAIM = (
    f"WITH a AS (INSERT INTO actions ({_INSERT_COLS}, snapshot, lands_by, contradiction, declared)"
    f" VALUES ({', '.join(['%s'] * 32)}) ON CONFLICT (action_id) DO NOTHING RETURNING {_RET}),"
    " e AS (INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
    " detail) SELECT a.action_id, v.at, v.actor, v.kind, v.frm, v.tos, v.attempt, v.detail"
    " FROM a, (VALUES (1, %s::timestamptz, %s, %s, NULL::text, %s, %s::int, %s),"
    " (2, %s::timestamptz, %s, %s, %s, %s, %s::int, %s))"
    " AS v(n, at, actor, kind, frm, tos, attempt, detail) ORDER BY v.n)"
    f" SELECT {_RET} FROM a"
)


def raw_dispatch(conn: Any, aid: str) -> None:
    """Record + claim in one statement, then the outcome: settled's two durable
    transactions for a new action, written out by hand."""
    owner = "d-" + aid
    row = list(pending_row(aid))
    row[8] = False  # requires_manual_verification
    row[11], row[13], row[14] = owner, "IN_FLIGHT", "IN_FLIGHT"  # dispatch_id, status, delivery
    row[16], row[21], row[22], row[23] = T0, owner, LEASE, LEASE  # dispatched, lease, check
    row += [None, LEASE, None, '{"tier": "full"}']  # snapshot, lands_by, contradiction, declared
    conn.execute(
        RAW_RECORD_CLAIM,
        (
            *row,
            T0,
            "bench",
            "recorded",
            "PENDING",
            1,
            json.dumps({"tier": "full"}),
            T0,
            "bench",
            "claimed",
            "PENDING",
            "IN_FLIGHT",
            1,
            json.dumps({"lease_expires_at": LEASE, "idempotency_key": aid + ":1"}),
        ),
    ).fetchall()
    _raw_outcome(conn, aid, owner)


RAW_DUE = (
    f"SELECT {_RET} FROM actions WHERE next_check_at IS NOT NULL AND status IN ('IN_FLIGHT',"
    " 'AWAITING_VERIFICATION', 'DENIED_UNRESOLVED') AND next_check_at <= %s"
    " ORDER BY next_check_at LIMIT %s FOR UPDATE SKIP LOCKED"
)
RAW_SETTLE = (
    "WITH m AS (UPDATE actions SET lease_owner = %s, next_check_at = %s, checks = %s,"
    " acceptance = %s, delivery = %s, confirmed_at = %s, confirmed_by = %s, reason = %s,"
    " status = %s, updated_at = %s WHERE action_id = %s AND status = %s AND lease_owner = %s"
    f" RETURNING action_id, attempt),{_EVENT} SELECT attempt FROM m"
)


def raw_sweep(url: str, batch: int, owner: str) -> int:
    """The floor for one daemon: per batch one transaction that commits the previous
    batch's results (pipelined), selects the next batch with SKIP LOCKED and leases it."""
    now = "2030-01-01T00:00:00.000000Z"
    done = 0
    pending: list[tuple[Any, ...]] = []
    with raw_conn(url) as conn:
        while True:
            with conn.transaction():
                if pending:
                    with conn.pipeline(), conn.cursor() as cur:
                        cur.executemany(RAW_SETTLE, pending)
                    done += len(pending)
                    pending = []
                rows = conn.execute(RAW_DUE, (now, batch)).fetchall()
                if rows:
                    conn.execute(
                        "UPDATE actions SET lease_owner = %s, next_check_at = %s"
                        " WHERE action_id = ANY(%s)",
                        (owner, FAR, [r[0] for r in rows]),
                    )
            if not rows:
                return done
            for r in rows:  # the null check: applied
                pending.append(
                    (
                        None,
                        None,
                        r[26] + 1,
                        "ACCEPTED",
                        "DELIVERED",
                        T0,
                        "reconciliation",
                        None,
                        "CONFIRMED",
                        T0,
                        r[0],
                        r[13],
                        owner,
                        T0,
                        owner,
                        "reconciled",
                        r[13],
                        "CONFIRMED",
                        json.dumps({"seen": "applied", "check": 1}),
                    )
                )


# -- the measurements ---------------------------------------------------------------------


def _pending_ledger(url: str, ids: list[str]) -> None:
    fill(url, [pending_row(a) for a in ids], [event_row(a) for a in ids])


def claim_outcome(n: int, repeats: int, tmp: str) -> list[Row]:
    from settled import Ledger
    from settled.dispatch import Dispatcher

    settled_v, raw_v, lite_v, pg_v = [], [], [], []
    for r in range(repeats):
        with schema() as surl, schema() as burl:
            sids = [f"s{r}-{i}" for i in range(n)]
            bids = [f"b{r}-{i}" for i in range(n)]
            _pending_ledger(surl, sids)
            _pending_ledger(burl, bids)
            led = Ledger.open(surl)
            d = Dispatcher(led, null_registry(), actor="bench")
            conn = raw_conn(burl)

            def settled_op(i: int, d: Any = d, ids: list[str] = sids) -> None:
                rep = d.confirm(ids[i])
                assert rep.record is not None and rep.record.status == "CONFIRMED", rep

            try:
                s, b = interleave(
                    n,
                    lambda i, c=conn, ids=bids: raw_claim_outcome(c, ids[i]),
                    settled_op,
                    "base" if r % 2 == 0 else "settled",
                )
            finally:
                conn.close()
                led.close()
            settled_v.append(s)
            raw_v.append(b)
        p, q = _confirm_pg_vs_sqlite(n, r, tmp)
        pg_v.append(p)
        lite_v.append(q)
    return [
        Row(
            "postgres",
            "claim → null provider → outcome (Dispatcher.confirm), PostgreSQL",
            "actions/s",
            settled_v,
            raw_v,
            "raw psycopg: the same 2 durable txns, same SQL",
            target=0.7,
        ),
        Row(
            "postgres",
            "same, PostgreSQL ledger vs SQLite ledger (one process)",
            "actions/s",
            pg_v,
            lite_v,
            "Dispatcher.confirm on SQLite (WAL, synchronous=FULL)",
            note="one process: SQLite's in-process commit beats a round trip to a server",
        ),
    ]


def _confirm_pg_vs_sqlite(n: int, r: int, tmp: str) -> tuple[float, float]:
    from settled import Ledger
    from settled.dispatch import Dispatcher

    from .fixtures import bulk_insert, new_ledger

    path = os.path.join(tmp, "pg-vs-sqlite.db")
    remove_db(path)
    new_ledger(path)
    lids = [f"l{r}-{i}" for i in range(n)]
    bulk_insert(path, [pending_row(a) for a in lids], [event_row(a) for a in lids])
    with schema() as url:
        pids = [f"p{r}-{i}" for i in range(n)]
        _pending_ledger(url, pids)
        with Ledger.open(url) as pled, Ledger.open(path) as lled:
            dp = Dispatcher(pled, null_registry(), actor="bench")
            dl = Dispatcher(lled, null_registry(), actor="bench")
            rates = interleave_many(
                n,
                {"pg": lambda i: dp.confirm(pids[i]), "sqlite": lambda i: dl.confirm(lids[i])},
                ["pg", "sqlite"] if r % 2 == 0 else ["sqlite", "pg"],
            )
    remove_db(path)
    return rates["pg"], rates["sqlite"]


def _due_ledger(url: str, due: int) -> None:
    size = due * DUE_SHARE
    ids = [
        (f"due-{i:08d}" if i % DUE_SHARE == 0 else f"old-{i:08d}", i % DUE_SHARE == 0)
        for i in range(size)
    ]
    fill(
        url,
        [awaiting_row(a) if is_due else confirmed_row(a) for a, is_due in ids],
        [event_row(a) for a, _ in ids],
    )


def _reset_due(url: str) -> None:
    with raw_conn(url) as conn:
        conn.execute("SET synchronous_commit = off")
        with conn.transaction():  # each status change with the event that records it
            conn.execute(
                "INSERT INTO events (action_id, at, actor, kind, from_status, to_status,"
                " attempt, detail) SELECT action_id, %s, 'bench', 'reset', status,"
                " 'AWAITING_VERIFICATION', attempt, '{}' FROM actions WHERE action_id >= 'due-'"
                " AND action_id < 'due.' AND status <> 'AWAITING_VERIFICATION'",
                (PAST,),
            )
            conn.execute(
                "UPDATE actions SET status = 'AWAITING_VERIFICATION', acceptance = 'UNKNOWN',"
                " confirmed_at = NULL, confirmed_by = NULL, lease_owner = NULL, checks = 0,"
                " reason = 'accepted', next_check_at = %s WHERE action_id >= 'due-' AND"
                " action_id < 'due.'",
                (PAST,),
            )
        conn.execute("VACUUM ANALYZE actions")


def _sweepers(url: str, n: int, batch: int, raw: bool = False, latency: float = 0.0) -> float:
    """``n`` daemon processes sweeping at once; rows settled per second, from the first
    one's start (after its imports) to the last one's end."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    module = "bench._pg_raw_sweeper" if raw else "bench._sweeper"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, url, str(batch), str(latency)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(n)
    ]
    settled, starts, ends = 0, [], []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a sweeper failed ({p.returncode})")
        got = json.loads(out.strip().splitlines()[-1])
        settled += int(got["settled"])
        starts.append(got["t0"])
        ends.append(got["t1"])
    return settled / (max(ends) - min(starts))


QUERY_LATENCY = 0.005  # s: a provider's query answered in 5 ms


def sweep_scaling(due: int, batch: int, repeats: int, tmp: str) -> list[Row]:
    from . import sweep as sqlite_sweep

    rates: dict[tuple[str, int], list[float]] = {}
    lite = os.path.join(tmp, "pg-vs-sqlite-sweep.db")
    slow_lite = os.path.join(tmp, "pg-vs-sqlite-slow-sweep.db")
    sqlite_sweep.build(lite, due * DUE_SHARE)
    slow_due = max(500, due // 50)
    sqlite_sweep.build(slow_lite, slow_due * DUE_SHARE)
    with schema() as url, schema() as slow:
        _due_ledger(url, due)
        _due_ledger(slow, slow_due)
        for r in range(repeats):
            order = [(side, n) for n in (1, 2, 4) for side in ("settled", "raw", "slow")]
            for side, n in order if r % 2 == 0 else reversed(order):
                target = slow if side == "slow" else url
                _reset_due(target)
                rates.setdefault((side, n), []).append(
                    _sweepers(
                        target,
                        n,
                        batch,
                        raw=side == "raw",
                        latency=QUERY_LATENCY if side == "slow" else 0.0,
                    )
                )
            sqlite_sweep.reset(lite)
            rates.setdefault(("sqlite", 1), []).append(_sweepers(lite, 1, batch))
            sqlite_sweep.reset(slow_lite)
            rates.setdefault(("slow-sqlite", 4), []).append(
                _sweepers(slow_lite, 4, batch, latency=QUERY_LATENCY)
            )
    remove_db(lite)
    remove_db(slow_lite)
    one, raw_one = rates[("settled", 1)], rates[("raw", 1)]
    rows = [
        Row(
            "postgres",
            f"sweep {due:,} due rows of {due * DUE_SHARE:,}, 1 daemon, PostgreSQL",
            "rows/s",
            one,
            raw_one,
            "raw psycopg: same statements, 1 process",
            note="the null check costs nothing: the database is the whole cost",
        ),
        Row(
            "postgres",
            "same, PostgreSQL vs SQLite (1 daemon each)",
            "rows/s",
            one,
            rates[("sqlite", 1)],
            "the same sweep of a SQLite ledger",
        ),
    ]
    for n in (2, 4):
        rows.append(
            Row(
                "postgres",
                f"same, {n} daemons at once (SKIP LOCKED) vs 1 daemon",
                "rows/s",
                rates[("settled", n)],
                one,
                "1 daemon",
                note=f"raw psycopg, {n} processes vs 1: "
                f"{_median(rates[('raw', n)]) / _median(raw_one):.2f}× (2 cores: the CPU is full)",
            )
        )
    for n in (2, 4):
        rows.append(
            Row(
                "postgres",
                f"sweep {slow_due:,} due rows, 5 ms per check: {n} daemons vs 1",
                "rows/s",
                rates[("slow", n)],
                rates[("slow", 1)],
                "1 daemon, same checks",
                note="checks that wait on a provider: the daemons share the work, none waits",
            )
        )
    rows.append(
        Row(
            "postgres",
            "same, 4 daemons: PostgreSQL vs SQLite (one host)",
            "rows/s",
            rates[("slow", 4)],
            rates[("slow-sqlite", 4)],
            "4 daemons on one SQLite file",
            note="on one host SQLite's daemons share the work too; only PostgreSQL spans hosts",
        )
    )
    return rows


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def dispatch_processes(tmp: str, per_worker: int, repeats: int, workers: int = 4) -> list[Row]:
    from settled import Ledger

    from .fixtures import new_ledger

    rates: dict[str, list[float]] = {}
    path = os.path.join(tmp, "pg-procs.db")
    sides = ["single", "multi", "raw", "sqlite"]
    for r in range(repeats):
        for mode in sides if r % 2 == 0 else reversed(sides):
            if mode == "sqlite":
                remove_db(path)
                new_ledger(path)
                rate = run_workers(path, workers, per_worker, f"r{r}l")[0]
            else:
                with schema() as url:
                    Ledger.open(url).close()
                    if mode == "single":
                        rate = run_workers(url, 1, per_worker * workers, f"r{r}s")[0]
                    elif mode == "multi":
                        rate = run_workers(url, workers, per_worker, f"r{r}m")[0]
                    else:
                        rate = run_workers(
                            url, workers, per_worker, f"r{r}r", module="bench._pg_raw_worker"
                        )[0]
            rates.setdefault(mode, []).append(rate)
    remove_db(path)
    multi = rates["multi"]
    return [
        Row(
            "postgres",
            f"{workers} processes dispatching distinct actions (submit), PostgreSQL",
            "actions/s",
            multi,
            rates["raw"],
            f"raw psycopg: {workers} processes, same SQL",
            note="4 processes on 2 cores: the CPU is full, so this is settled's CPU per action",
        ),
        Row(
            "postgres",
            f"same, {workers} processes vs 1 process (PostgreSQL)",
            "actions/s",
            multi,
            rates["single"],
            "1 process dispatching as many",
            note="row locks, not one write lock: writers add throughput until the CPU is full",
        ),
        Row(
            "postgres",
            f"same, PostgreSQL vs SQLite ({workers} processes each)",
            "actions/s",
            multi,
            rates["sqlite"],
            f"{workers} processes on one SQLite file",
        ),
    ]


def run(tmp: str, cfg: dict[str, Any], batch: int) -> list[Row]:
    why = available()
    if why is not None:
        print(f"  postgres: skipped: {why}", file=sys.stderr)
        return []
    rows = claim_outcome(cfg["ops"], cfg["repeats"], tmp)
    rows += dispatch_processes(tmp, cfg["procs"], max(1, cfg["repeats"] // 2 + 1))
    due = 10_000 if cfg["ops"] < 1000 else 100_000
    rows += sweep_scaling(due, batch, max(1, cfg["repeats"] // 2), tmp)
    return rows


__all__ = ["available", "run"]
