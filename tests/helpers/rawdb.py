"""Raw access to a test's ledger, past the ledger's own code, on either backend: what a
person with a SQL shell (or a bug) could do, and what the database itself must refuse.

    is_pg(location)           -> whether it is a PostgreSQL URL
    execute(location, sql)    -> rows; the driver's own error when the database refuses
    RAW_ERRORS                -> the drivers' error classes
    dump(location)            -> every row of every table, to compare before and after
    integrity(location)       -> "ok", or what the database found wrong
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

try:
    import psycopg

    RAW_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)
except ImportError:  # the PostgreSQL half is skipped then
    RAW_ERRORS = (sqlite3.Error,)


def is_pg(location: Any) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def execute(location: Any, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement and commit it. ``?`` placeholders work on both backends."""
    if is_pg(location):
        with psycopg.connect(str(location), autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), args)
            return cur.fetchall() if cur.description else []
    conn = sqlite3.connect(os.fspath(location), isolation_level=None)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def dump(location: Any) -> list[tuple[Any, ...]]:
    """Every row of every table, read through a separate connection: what a rejected
    command must leave unchanged."""
    if is_pg(location):
        return _dump_pg(str(location))
    conn = sqlite3.connect(f"file:{os.fspath(location)}?mode=ro", uri=True)
    try:
        out: list[tuple[Any, ...]] = []
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        ]
        for t in tables:
            out.append(("table", t))
            # the search index's own tables keep no rowid: in the order of their key
            keyed = t.startswith("actions_search_") and t.endswith(("_idx", "_config"))
            order = "1, 2" if keyed else "rowid"
            out.extend(conn.execute(f'SELECT * FROM "{t}" ORDER BY {order}').fetchall())
        out.append(
            ("schema", *[r[0] for r in conn.execute("SELECT sql FROM sqlite_master ORDER BY name")])
        )
        return out
    finally:
        conn.close()


def history(location: Any) -> list[tuple[Any, ...]]:
    """``dump`` without where ``verify`` got to (the one row a clean verify writes) and
    with the counts summed (a clean verify folds their rows, changing no figure): what
    a verify must leave unchanged."""
    out: list[tuple[Any, ...]] = []
    table = ""
    counts: dict[tuple[Any, ...], int] = {}
    for row in dump(location):
        if row and row[0] in ("table", "schema"):
            if table == "action_counts":
                out += sorted((*k, n) for k, n in counts.items())
            table = str(row[1]) if row[0] == "table" else ""
        elif table == "verify_checkpoint":
            continue
        elif table == "action_counts":
            counts[row[:3]] = counts.get(row[:3], 0) + int(row[4])
            continue
        out.append(row)
    return out


def _dump_pg(url: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
                " ORDER BY 1"
            ).fetchall()
        ]
        for t in tables:
            out.append(("table", t))
            out.extend(conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall())
        out.append(
            (
                "schema",
                *[
                    r[0]
                    for r in conn.execute(
                        "SELECT table_name || '.' || column_name || ':' || data_type"
                        " FROM information_schema.columns WHERE table_schema = current_schema()"
                        " ORDER BY 1"
                    ).fetchall()
                ],
            )
        )
    return out


def integrity(location: Any) -> str:
    """SQLite's ``PRAGMA integrity_check`` on the file; on PostgreSQL (whose storage
    checks itself) the ledger's own check: append-only triggers present and enabled,
    no event without its action."""
    if is_pg(location):
        from settled import Ledger

        with Ledger.open(str(location), create=False) as led:
            return led.integrity_check()
    conn = sqlite3.connect(os.fspath(location))
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()
