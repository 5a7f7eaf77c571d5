"""A new ledger is made by one script of the current schema (``FRESH``, its actions table
generated from ``storage.columns``); an older one is brought up to date by the
migration steps. The two must give the same schema, on both backends: a real SQLite
file, a real PostgreSQL schema. So a record field without its step for older ledgers,
or a step that says otherwise than the script, fails here. An old ledger migrated step
by step then works as a new one does."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pg_schemas as pg
import pytest
import rawdb
import sqlite_utils
from records import move, new_record

from settled import Ledger
from settled.model import Status
from settled.storage import columns, postgres_schema, sqlite_schema
from settled.storage.sqlite import APPLICATION_ID


def _words(sql: str | None, *, unquote: bool = False) -> str | None:
    """SQL text with its layout taken out (``actions(id)`` and ``actions ( id )``
    alike) and, with ``unquote``, its identifiers' quotes (``"actions"("id")``, as
    sqlite-utils writes them): what differs then is what the SQL says."""
    if sql is None:
        return None
    if unquote:
        sql = sql.replace('"', "")
    return re.sub(r"\s*([(),])\s*", r"\1", " ".join(sql.split()))


# -- a ledger as every earlier settled made it -----------------------------------------------


def steps_of(location: Any) -> list[tuple[str, Any]]:
    return (postgres_schema if rawdb.is_pg(location) else sqlite_schema).MIGRATIONS


def _old_sqlite(path: Path, upto: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        db = sqlite_utils.Database(conn)
        conn.execute("BEGIN IMMEDIATE")
        for n, (name, step) in enumerate(sqlite_schema.MIGRATIONS[:upto], 1):
            step(db)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)"
            )
            conn.execute(
                "INSERT INTO _migrations VALUES (?, strftime('%Y-%m-%dT%H:%M:%fZ','now'))", (name,)
            )
            conn.execute(f"PRAGMA user_version = {n}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _old_pg(url: str, upto: int) -> None:
    mark = postgres_schema.MARK
    with rawdb.psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(
            f"CREATE TABLE {mark} (only_row boolean PRIMARY KEY DEFAULT true"
            " CHECK (only_row), application text NOT NULL, version integer NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE _migrations (name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        conn.execute(f"INSERT INTO {mark} (application, version) VALUES ('settled', 0)")
        with conn.cursor() as cur:
            for n, (name, step) in enumerate(postgres_schema.MIGRATIONS[:upto], 1):
                step(cur)
                cur.execute("INSERT INTO _migrations (name) VALUES (%s)", (name,))
                cur.execute(f"UPDATE {mark} SET version = %s", (n,))


def old_ledger(location: Any, upto: int) -> None:
    """A ledger as the settled whose last step was ``upto`` made a new one, before new
    ledgers had a script of their own: its steps replayed from an empty database, with
    their names, the version and the mark, in one transaction."""
    if rawdb.is_pg(location):
        _old_pg(location, upto)
    else:
        _old_sqlite(location, upto)


def migrated(location: Any) -> list[tuple[int, str]]:
    """``settled migrate`` on the ledger: each step it lacks in its own transaction; the
    steps it announced."""
    with Ledger.open_for_migration(location) as led:
        return led.migrate()


def made_new(location: Any) -> None:
    with Ledger.open(location) as led:
        assert led.schema_version() == led.latest_schema


# -- the schema, as each backend describes it ------------------------------------------------


def sqlite_schema_of(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{os.fspath(path)}?mode=ro", uri=True)
    try:
        master = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid"
        ).fetchall()
        tables = [name for kind, name, _, _ in master if kind == "table"]
        return {
            "objects": sorted((k, n, t, _words(sql, unquote=True)) for k, n, t, sql in master),
            # SQLite fires a table's triggers in the order they were made
            "trigger order": {
                table: [n for k, n, t, _ in master if k == "trigger" and t == table]
                for table in tables
            },
            "columns": {t: conn.execute(f"PRAGMA table_info({t})").fetchall() for t in tables},
            "foreign keys": {
                t: conn.execute(f"PRAGMA foreign_key_list({t})").fetchall() for t in tables
            },
            "version": conn.execute("PRAGMA user_version").fetchone(),
            "mark": conn.execute("PRAGMA application_id").fetchone(),
            "steps": conn.execute("SELECT name FROM _migrations ORDER BY name").fetchall(),
        }
    finally:
        conn.close()


PG_QUERIES = {
    "relations": "SELECT relname, relkind FROM pg_class"
    " WHERE relnamespace = current_schema()::regnamespace ORDER BY relname",
    "columns": "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
    " column_default, collation_name, is_identity, identity_generation"
    " FROM information_schema.columns WHERE table_schema = current_schema()"
    " ORDER BY table_name, ordinal_position",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes"
    " WHERE schemaname = current_schema() ORDER BY indexname",
    "triggers": "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled,"
    " t.tgdeferrable, t.tginitdeferred FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
    " WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal"
    " ORDER BY t.tgname",
    "constraints": "SELECT conrelid::regclass::text, conname, contype, condeferrable,"
    " condeferred, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE connamespace = current_schema()::regnamespace ORDER BY conname",
    "functions": "SELECT proname, pg_get_functiondef(oid), proconfig FROM pg_proc"
    " WHERE pronamespace = current_schema()::regnamespace ORDER BY proname",
    "version": "SELECT application, version FROM settled_ledger",
    "steps": "SELECT name FROM _migrations ORDER BY name",
}


def pg_schema_of(url: str) -> dict[str, Any]:
    """Each catalog's rows, the schema's own name taken out of them and the function
    bodies' layout normalised (the script indents them as the steps do not)."""
    schema = pg.schema_of(url)

    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, str):
            return _words(value.replace(f"{schema}.", "").replace(schema, "<schema>"))
        return value

    with rawdb.psycopg.connect(url, autocommit=True) as conn:
        return {
            what: [tuple(plain(v) for v in row) for row in conn.execute(sql).fetchall()]
            for what, sql in PG_QUERIES.items()
        }


def schema_of(location: Any) -> dict[str, Any]:
    return pg_schema_of(location) if rawdb.is_pg(location) else sqlite_schema_of(location)


# -- the proofs ------------------------------------------------------------------------------

# What a ledger's structure is, without its version and the names of its steps.
VERSIONED = ("version", "steps")


def test_a_new_ledger_has_the_schema_every_older_one_is_migrated_to(
    fresh_location: Callable[[str], Any],
) -> None:
    """A ledger as each older settled made it (steps 1 to ``k`` replayed from an empty
    database) differs from a new one until ``settled migrate`` has applied the steps
    after ``k``, one by one, and is the same after: from ``k = 1``, every step but the
    first is applied by the migrations; at the last ``k``, every step is replayed."""
    new = fresh_location("new.db")
    made_new(new)
    fresh = schema_of(new)
    steps = [(n, name) for n, (name, _) in enumerate(steps_of(new), 1)]
    for k in range(1, len(steps) + 1):
        old = fresh_location(f"old-{k}.db")
        old_ledger(old, k)
        before = schema_of(old)
        if k < len(steps):
            assert {w: v for w, v in before.items() if w not in VERSIONED} != {
                w: v for w, v in fresh.items() if w not in VERSIONED
            }, f"step {k + 1} changes nothing"
        assert migrated(old) == steps[k:]
        after = schema_of(old)
        assert set(after) == set(fresh)
        for what in fresh:
            assert after[what] == fresh[what], f"from schema {k}: {what}"


def test_the_comparison_sees_the_actions_table_and_its_triggers(
    fresh_location: Callable[[str], Any],
) -> None:
    new = fresh_location("new.db")
    made_new(new)
    seen = schema_of(new)
    if rawdb.is_pg(new):
        actions = [row for row in seen["columns"] if row[0] == "actions"]
        assert [row[2] for row in actions] == list(columns.COLUMNS)
        assert ("actions", "actions_status_has_event") in {row[:2] for row in seen["triggers"]}
        assert any(row[1] == "actions_status_check" for row in seen["constraints"])
    else:
        assert [row[1] for row in seen["columns"]["actions"]] == list(columns.COLUMNS)
        assert seen["trigger order"]["actions"][-6:] == [
            "actions_not_moved_insert",
            "actions_not_moved_update",
            "actions_no_delete",  # made anew by the erasure step, to honour prune's allowance
            "actions_search_insert",
            "actions_search_update",
            "actions_search_delete",
        ]
        assert seen["mark"] == (APPLICATION_ID,)


def test_an_old_ledger_migrated_step_by_step_then_works(
    fresh_location: Callable[[str], Any],
) -> None:
    old = fresh_location("old.db")
    old_ledger(old, 1)
    migrated(old)
    with Ledger.open(old) as led:
        rec = new_record("a-1")
        assert led.record(rec, actor="t")
        moved = led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT, delivery="IN_FLIGHT"))
        assert moved is not None and led.get("a-1") == moved
        assert [e.kind for e in led.events("a-1")] == ["recorded", "claimed"]
        assert led.integrity_check() == "ok"
    # the database refuses what it refuses on a new ledger
    with pytest.raises(rawdb.RAW_ERRORS, match="append-only"):
        rawdb.execute(old, "DELETE FROM events")
    with pytest.raises(rawdb.RAW_ERRORS, match="only with the event"):
        rawdb.execute(old, "UPDATE actions SET status = 'FAILED'")


@pytest.mark.sqlite_only
def test_making_a_new_sqlite_ledger_imports_no_sqlite_utils(tmp_path: Path) -> None:
    code = (
        "import sys, settled\n"
        f"with settled.Ledger.open({str(tmp_path / 'new.db')!r}) as led:\n"
        "    assert led.schema_version() == led.latest_schema\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlite_utils'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
