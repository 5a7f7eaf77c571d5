"""The PostgreSQL server the PostgreSQL half of the suite runs against, and a fresh
schema for each test.

    unavailable()   -> None, or why the PostgreSQL half cannot run here
    new_schema()    -> the URL of a new, empty schema (search_path and application_name set)
    drop(url)       -> end its sessions and drop it
    admin()         -> a psycopg connection to the server (autocommit), for raw checks

``SETTLED_TEST_POSTGRES`` names the server (default ``postgresql:///test``: the local
socket, database ``test``). Schemas are named ``settled_t_<pid>_<n>``, so a run can drop
what an earlier, killed run left behind without touching a run still going.
"""

from __future__ import annotations

import atexit
import itertools
import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

SERVER = os.environ.get("SETTLED_TEST_POSTGRES", "postgresql:///test")
PREFIX = "settled_t_"

_state: dict[str, Any] = {}
_numbers = itertools.count(1)


def _connect() -> Any:
    import psycopg

    return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)


def unavailable() -> str | None:
    """Why no PostgreSQL tests can run here (asked once per run), or None."""
    if "reason" not in _state:
        _state["reason"] = _probe()
    reason: str | None = _state["reason"]
    return reason


def _probe() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]' brings it)"
    try:
        conn = _connect()
    except psycopg.Error as exc:
        return f"no PostgreSQL server at {SERVER} ({' '.join(str(exc).split())[:200]})"
    _state["admin"] = conn
    atexit.register(_close_admin)
    _drop_orphans(conn)
    _search_extension(conn)
    return None


def _search_extension(conn: Any) -> None:
    """Make ``pg_trgm`` once, as docs/postgres.md has the database's administrator do
    before the first ``settled migrate``: the tests that open a ledger as a role of
    their own, which may not create extensions, must not depend on an earlier test
    having made it (on a fresh server, the longest such file runs first). The lock is
    the one the schema step takes, so workers and that step never race to make it."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('settled pg_trgm'))")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public")


def _close_admin() -> None:
    """Close the admin connection as the process ends: left to the interpreter's
    teardown, psycopg warns that it was deleted while still open (a ResourceWarning
    each test worker printed after its last test)."""
    conn = _state.pop("admin", None)
    if conn is not None and not conn.closed:
        conn.close()


def admin() -> Any:
    if unavailable() is not None:
        raise RuntimeError(f"PostgreSQL unavailable: {unavailable()}")
    conn = _state["admin"]
    if conn.closed or conn.broken:
        conn = _state["admin"] = _connect()
    return conn


def _drop_orphans(conn: Any) -> None:
    """Drop the schemas of runs whose process is gone (killed runs leave them)."""
    rows = conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (PREFIX + "%",)
    ).fetchall()
    for (name,) in rows:
        try:
            pid = int(name[len(PREFIX) :].split("_")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _drop_schema(conn, name)


# The catalogs every schema the suite makes and drops leaves dead rows in (about 40
# per schema: its tables, columns, types, triggers, functions). On a server with
# autovacuum off they pile up run after run, and every catalog scan (what a schema
# holds, a DDL's checks) reads them all: once past this many, the suite vacuums them
# before it starts.
CATALOGS = (
    "pg_class",
    "pg_attribute",
    "pg_type",
    "pg_proc",
    "pg_depend",
    "pg_constraint",
    "pg_index",
    "pg_trigger",
    "pg_namespace",
    "pg_attrdef",
    "pg_description",
)
DEAD_ROWS = 100_000


# Within a run too: every schema a worker drops leaves its ~40 dead catalog rows, and a
# run makes about 1,500. Unvacuumed, they made every new session's first catalog reads
# and every schema's DDL slower as the run went on (measured near the end of a run:
# opening a ledger cost the server 33 ms of CPU instead of 15, making and dropping a
# schema 117 ms instead of 89). So each worker vacuums them after every this many drops.
DROPS_PER_VACUUM = 40


def vacuum_catalogs() -> int:
    """Vacuum the catalogs if their dead rows passed ``DEAD_ROWS``; the dead rows found
    (0 when the server is out of reach or nothing was needed)."""
    if unavailable() is not None:
        return 0
    conn = admin()
    (dead,) = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_sys_tables WHERE relname = ANY(%s)",
        (list(CATALOGS),),
    ).fetchone()
    if dead < DEAD_ROWS:
        return 0
    _vacuum(conn)
    return int(dead)


def _vacuum(conn: Any) -> None:
    import psycopg

    try:
        conn.execute("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in CATALOGS))
    except psycopg.Error:  # not the catalogs' owner, or another worker's vacuum held
        pass  # them past lock_timeout: the suite runs, only slower


def url_for(schema: str, base: str = SERVER) -> str:
    sep = "&" if urlsplit(base).query else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}&application_name={schema}"


def schema_of(url: str) -> str:
    query = dict(parse_qsl(urlsplit(str(url)).query))
    return query["application_name"]


class Location(str):
    """A test ledger's URL that answers ``exists()`` as a file path would: whether a
    ledger has been made in its schema (tests check that some commands never make one)."""

    def exists(self) -> bool:
        got = (
            admin()
            .execute(
                "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = 'settled_ledger'",
                (schema_of(self),),
            )
            .fetchall()
        )
        return bool(got)


def new_schema() -> Location:
    name = f"{PREFIX}{os.getpid()}_{next(_numbers)}"
    admin().execute(f'CREATE SCHEMA "{name}"')
    return Location(url_for(name))


_drops = itertools.count(1)


def drop(url: str) -> None:
    conn = admin()
    _drop_schema(conn, schema_of(url))
    if next(_drops) % DROPS_PER_VACUUM == 0:
        _vacuum(conn)


def _drop_schema(conn: Any, name: str) -> None:
    # Sessions a test left behind (a killed process's server side lingers a moment,
    # a daemon still stopping) would hold locks the drop waits for: end them first.
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = %s AND pid <> pg_backend_pid()",
        (name,),
    )
    import psycopg

    conn.execute("SET lock_timeout = '5s'")
    try:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    except psycopg.errors.LockNotAvailable:
        pass  # still in use: the next run's orphan sweep drops it
