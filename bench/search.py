"""python -m bench.search [--records N] [--backend sqlite|postgres|both] [--repeats N]:
how fast ``settled queue --search`` answers on a large ledger, against a scan.

A ledger of N records (default one million) is loaded in bulk, the way a copied or
migrated ledger is: the rows written straight into ``actions`` with the search index
set aside (SQLite: its triggers dropped; PostgreSQL: its index dropped; ``COPY``), then
the index built over them as the migration step builds it, and its triggers or index
put back. That build is timed too: it is what ``settled migrate`` costs an existing
ledger of that size.

Each search is then timed as the CLI runs it, through ``Ledger.records`` (the first
1000 rows, every status) and ``Ledger.count`` when the page is full, against a
baseline that finds the same rows with no index: a ``LIKE '%…%'`` over the same text
of every record. The figures are medians over the repeats; they are for reading,
never for failing a build (shared machines are noisy). The PostgreSQL rows need
``SETTLED_BENCH_POSTGRES`` (default ``postgresql:///test``).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from settled import Ledger, policy
from settled.clock import from_text, plus, to_text
from settled.model import Declared, Status, Tier
from settled.storage import postgres_schema, sqlite_schema
from settled.storage.columns import COLUMNS, to_row
from settled.storage.ledger import Selection

from .common import tempdir
from .postgres import available, raw_conn, schema

PAGE = 1000  # rows a search shows (``queue``'s default --limit)
START = from_text("2026-01-01T00:00:00.000000Z")

# What a person types, and roughly how many records each finds in N (the loaded text
# below says why): an order number, a recipient, an id's start, two words, a cause.
SEARCHES = (
    ("an order number", lambda n: str(1_000_000 + n // 2)),
    ("a recipient", lambda n: f"user{n // 3}@"),
    ("an id's start", lambda n: f"act-{n // 2:07d}"[:-3]),
    ("two words", lambda n: f"shop{(n // 5) % 997}.example 503"),
    ("a cause (5% of records)", lambda n: "HTTP 503"),
)


def template() -> dict[str, Any]:
    rec = policy.new_record(
        action_id="act-0000000",
        provider="mail",
        operation="send",
        params={"to": "x"},
        declared=Declared(Tier.BLIND),
        now=START,
    )
    return to_row(rec)


def rows(n: int) -> Iterator[list[Any]]:
    """N rows of ``actions``: every 20th a mail the relay answered 503 (unresolved),
    the others confirmed; recipients at 997 shops, order numbers from 1000000."""
    base = template()
    at = list(COLUMNS)
    for i in range(n):
        aid = f"act-{i:07d}"
        params = json.dumps(
            {
                "order": 1_000_000 + i,
                "sku": f"SKU-{i % 5000}",
                "to": f"user{i}@shop{i % 997}.example",
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        row = dict(base)
        when = to_text(plus(START, i))
        unresolved = i % 20 == 0
        row.update(
            action_id=aid,
            params=params,
            params_hash=f"{i:064x}",
            idempotency_key=f"{aid}:1",
            status=(Status.DENIED_UNRESOLVED if unresolved else Status.CONFIRMED).value,
            reason="outcome unknown (HTTP 503): the relay was busy" if unresolved else None,
            created_at=when,
            updated_at=when,
        )
        yield [row[c] for c in at]


# -- loading -----------------------------------------------------------------------------


def _stored(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if hasattr(v, "value"):
        return v.value
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    return v


def load_sqlite(path: Path, n: int) -> float:
    """The ledger at ``path`` with N records; the seconds the index took to build."""
    Ledger.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    triggers = [s for s in sqlite_schema.SEARCH if s.startswith("CREATE TRIGGER")]
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DROP TRIGGER actions_search_insert")
    conn.execute("DROP TRIGGER actions_search_update")
    marks = ", ".join("?" * len(COLUMNS))
    conn.executemany(
        f"INSERT INTO actions ({', '.join(COLUMNS)}) VALUES ({marks})",
        ([_stored(v) for v in r] for r in rows(n)),
    )
    conn.execute("COMMIT")
    began = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO actions_search(rowid, action_id, params, reason)"
        " SELECT rid, action_id, params, reason FROM actions_search_text"
    )
    for statement in triggers:
        conn.execute(statement)
    conn.execute("COMMIT")
    built = time.perf_counter() - began
    conn.execute("ANALYZE")
    conn.close()
    return built


def load_postgres(url: str, n: int) -> float:
    Ledger.open(url).close()
    conn = raw_conn(url)
    conn.execute("DROP INDEX actions_search")
    with conn.cursor() as cur, cur.copy(f"COPY actions ({', '.join(COLUMNS)}) FROM STDIN") as cp:
        for r in rows(n):
            cp.write_row([_stored(v) for v in r])
    began = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '256MB'")
    conn.execute(postgres_schema.SEARCH_INDEX)
    built = time.perf_counter() - began
    conn.execute("VACUUM ANALYZE actions")
    conn.close()
    return built


# -- timing ------------------------------------------------------------------------------


def median_ms(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    found = fn()  # warm: the first read of a cold cache is not what a person waits for
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        found = fn()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), found


def searched(led: Ledger, text: str) -> Callable[[], int]:
    sel = Selection(statuses=[s.value for s in Status], search=text)

    def run() -> int:
        page = led.records(Selection(**{**sel.__dict__, "limit": PAGE}))
        return led.count(sel) if len(page) >= PAGE else len(page)

    return run


def scanned(
    query: Callable[[str, list[Any]], list[Any]], mark: str, text: str
) -> Callable[[], int]:
    """The same rows with no index: every word a ``LIKE`` over each record's text."""
    words = text.split()
    haystack = "lower(action_id || ' ' || params || ' ' || COALESCE(reason, ''))"
    where = " AND ".join(f"{haystack} LIKE {mark}" for _ in words)
    args = [f"%{w.lower()}%" for w in words]

    def run() -> int:
        page = query(
            f"SELECT action_id FROM actions WHERE {where} ORDER BY created_at LIMIT {PAGE}", args
        )
        if len(page) < PAGE:
            return len(page)
        return int(query(f"SELECT count(*) FROM actions WHERE {where}", args)[0][0])

    return run


def report(
    backend: str, n: int, built: float, figures: list[tuple[str, str, float, float, int]]
) -> None:
    print(f"\n{backend}, {n:,} records: index built in {built:.1f} s")
    print(f"  {'search':<26} {'text':<22} {'found':>7} {'index ms':>9} {'scan ms':>9} {'x':>6}")
    for what, text, fast, slow, found in figures:
        print(f"  {what:<26} {text:<22} {found:>7} {fast:>9.1f} {slow:>9.1f} {slow / fast:>6.0f}")


def measure(led: Ledger, n: int, repeats: int, query: Any, mark: str) -> list[Any]:
    out = []
    for what, make in SEARCHES:
        text = make(n)
        fast, found = median_ms(searched(led, text), repeats)
        slow, same = median_ms(scanned(query, mark, text), max(1, repeats // 2))
        assert found == same, f"{what}: the index found {found}, the scan {same}"
        out.append((what, text, fast, slow, found))
    return out


def run_sqlite(n: int, repeats: int) -> None:
    with tempdir() as d:
        path = Path(d) / "search.db"
        began = time.perf_counter()
        built = load_sqlite(path, n)
        print(f"sqlite: loaded in {time.perf_counter() - began:.1f} s", flush=True)
        raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        with Ledger.open(path, create=False) as led:
            figures = measure(led, n, repeats, lambda q, a: raw.execute(q, a).fetchall(), "?")
        raw.close()
        report("SQLite (FTS5 trigram)", n, built, figures)


def run_postgres(n: int, repeats: int) -> None:
    why = available()
    if why:
        print(f"postgres: skipped ({why})")
        return
    with schema() as url:
        began = time.perf_counter()
        built = load_postgres(url, n)
        print(f"postgres: loaded in {time.perf_counter() - began:.1f} s", flush=True)
        raw = raw_conn(url)
        with Ledger.open(url, create=False) as led:
            figures = measure(led, n, repeats, lambda q, a: raw.execute(q, a).fetchall(), "%s")
        raw.close()
        report("PostgreSQL (pg_trgm GIN)", n, built, figures)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    if args.backend in ("sqlite", "both"):
        run_sqlite(args.records, args.repeats)
    if args.backend in ("postgres", "both"):
        run_postgres(args.records, args.repeats)


if __name__ == "__main__":
    main()
