"""The PostgreSQL ledger: one database shared by many hosts, their dispatchers and
their daemons (``postgresql://`` locations; ``pip install 'settled[postgres]'``).

The promise is the SQLite ledger's, kept by PostgreSQL's own means:

- **One claim winner.** A claim is one conditional ``UPDATE … RETURNING`` guarded by
  status (and lease owner, attempt); a concurrent claimer waits on the row lock, then
  re-reads the row and finds the guard false. ``record_and_claim`` writes the new row
  already claimed, with both its events, in one ``INSERT … ON CONFLICT DO NOTHING``:
  whoever inserts the id owns the claim; whoever finds it taken claims nothing.
- **No double check.** A due batch is read with ``FOR UPDATE SKIP LOCKED`` and leased
  in the same transaction, so N daemons on N hosts take disjoint batches without
  waiting on each other.
- **One clock.** ``clock()`` follows the database's clock (``clock_timestamp()``),
  counted between readings on this host's steady clock (``settled.clock.steady``) and
  re-read every ``CLOCK_REFRESH`` seconds: every host decides leases and budgets by the
  same time, and neither a skewed host clock nor a step of it expires a lease early
  (rule 12 in docs/rules.md, for many hosts).
- **Durable before anything leaves.** Each method is one transaction, committed (with
  the server's ``synchronous_commit``, on by default) before it returns.
- **Append-only events**, enforced by triggers (``postgres_schema``).

What the ledger takes from psycopg (its connections, their settings, the values it
binds and reads back, every error mapped into ``settled.errors``) is
``postgres_driver``'s; a password in the location never reaches ``location``, a
message or a log (``location.redact``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import Clock, FollowingClock, from_text, steady
from ..crashpoints import Probe, no_probe
from ..errors import LedgerError
from . import postgres_schema, query, statements
from .columns import TABLES
from .ledger import History, PostgresSettings, SchemaMode, version_after
from .location import redact
from .postgres_driver import Connections, clean, copy_callbacks, copy_history, mapped
from .sql import Hold, Row, Run, SqlLedger, busy_timeout_from_env
from .statements import Unit

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[tuple[Any, ...]]
    Cursor = psycopg.Cursor[tuple[Any, ...]]

CLOCK_REFRESH = 30.0  # s between readings of the database's clock


def _reason_group(expr: str) -> str:
    """``query.REASON_PATTERNS`` applied in order, as SQL literals (constants, never
    input: a bound parameter would make each use a different expression to GROUP BY)."""
    for pattern, replacement in query.REASON_PATTERNS:
        assert "'" not in pattern + replacement
        expr = f"regexp_replace({expr}, '{pattern}', '{replacement}', 'g')"
    return expr


DIALECT = query.Dialect(
    mark="%s",
    one_of=lambda column, values: (f"{column} = ANY(%s)", [list(values)]),
    find="strpos({haystack}, {needle}) > 0",
    lower=lambda expr: f"lower({expr})",
    collate=' COLLATE "C"',  # code point order, whatever the database's collation
    detail_of_last_event=(
        "(SELECT e.detail::json ->> 'detail' FROM events e"
        " WHERE e.action_id = actions.action_id ORDER BY e.id DESC LIMIT 1)"
    ),
    age_seconds="extract(epoch FROM (%s::timestamptz - created_at))",
    reason_group=_reason_group,
    seconds=lambda frm, to: f"extract(epoch FROM {to} - {frm})",
    # the details are JSON text; ``::json`` reads them as they were written
    json_field=lambda expr, key: f"({expr}::json ->> '{key}')",
    time_mark="?::timestamptz",
    lock=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    writes_in_one=True,
    count_slot="pg_backend_pid()",
    snapshot="pg_current_snapshot()::text",
    search=lambda words: (
        "("
        + " AND ".join(["settled_search_text(action_id, params, reason) ILIKE %s"] * len(words))
        + ")",
        [query.like_escaped(w) for w in words],
    ),
)

T = TypeVar("T")
log = logging.getLogger("settled.storage.postgres")


class DatabaseClock(FollowingClock):
    """The database's clock, read on this host (``clock.FollowingClock``): a reading
    that fails is logged, and the clock counts on from the one before."""

    def __init__(self, read: Callable[[], tuple[datetime, float]], refresh: float) -> None:
        super().__init__(read, refresh, (LedgerError,), _clock_failed)


def _clock_failed(exc: Exception) -> None:
    log.warning("could not read the database's clock, counting on: %s", exc)


# -- the ledger ------------------------------------------------------------------------------


class PostgresLedger(SqlLedger["Cursor"]):
    thread_safe = True  # threads that use it at once get connections of their own
    backend = "postgresql"
    latest_schema = postgres_schema.LATEST
    DIALECT = DIALECT
    COUNTED_SINCE = version_after(postgres_schema.MIGRATIONS, "counts")  # the kept counts
    CHECKPOINT_SINCE = version_after(postgres_schema.MIGRATIONS, "verified")  # verify's checkpoint
    READS = statements.reads(DIALECT)
    WRITES = statements.writes(DIALECT)
    BY_NAME = statements.named_records(WRITES)
    # SKIP LOCKED: rows another daemon is leasing right now are its own; the rows it
    # has leased already are not due any more (their check time moved).
    DUE = (
        f"{statements.SELECT} WHERE {postgres_schema.DUE_PREDICATE} AND next_check_at <= %s"
        " ORDER BY next_check_at LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    MARK_MOVED = "INSERT INTO ledger_moved (moved_to, moved_at) VALUES (%s, %s::timestamptz)"
    # One transaction per pending callback, locked on the value it names and skipped
    # while another pass holds it, so that passes on many hosts share the work.
    SWEEP_ONE_BY_ONE = True

    def __init__(
        self,
        url: str,
        location: str,
        secrets: tuple[str, ...],
        busy_timeout: float,
        probe: Probe,
        settings: PostgresSettings | None = None,
    ) -> None:
        self.location = location
        self.busy_timeout = busy_timeout
        self.probe = probe
        self._secrets = secrets
        self.settings = settings or PostgresSettings()
        self._conns = Connections(
            url,
            busy_timeout,
            location,
            pool_min=self.settings.pool_min,
            pool_max=self.settings.pool_max,
            pgbouncer=self.settings.pgbouncer,
        )
        self._clock: Clock | None = None
        self._held: Conn | None = None  # the transaction ``rows`` reads through, when held
        self._cursors = 0

    # ------------------------------------------------------------------ opening
    @classmethod
    def connect(
        cls,
        url: str,
        *,
        create: bool = True,
        probe: Probe = no_probe,
        busy_timeout: float | None = None,
        mode: SchemaMode = SchemaMode.MIGRATE,
        settings: PostgresSettings | None = None,
    ) -> PostgresLedger:
        """Open the ledger in the schema ``url`` selects (the first of its
        ``search_path``), creating its tables unless ``create`` is false: then a schema
        without a ledger is a ``LedgerError`` naming the location. ``mode`` says what
        to do with an older schema (``Ledger.open``); ``settings``, how it holds its
        connections (``PostgresSettings``)."""
        timeout = busy_timeout_from_env() if busy_timeout is None else busy_timeout
        location, secrets = redact(url)
        ledger = cls(url, location, secrets, timeout, probe, settings)
        try:
            with ledger._mapped("open"):
                ledger.schema = postgres_schema.settle(
                    ledger._conns.open(), ledger.location, create, mode
                )
                ledger._clock = DatabaseClock(ledger._read_db_clock, CLOCK_REFRESH)
        except BaseException:
            ledger.close()
            raise
        return ledger

    # ------------------------------------------------------------------ the schema
    def schema_version(self) -> int:
        with self._mapped("read the schema version"), self._connection() as conn:
            return postgres_schema.version(conn)

    def _steps(self) -> Sequence[tuple[str, Any]]:
        return postgres_schema.MIGRATIONS

    def _migrate(self, on_step: Callable[[int, str], None]) -> None:
        with self._mapped("migrate"), self._connection() as conn:
            postgres_schema.migrate(conn, self.location, on_step=on_step)

    def close(self) -> None:
        self._conns.close()

    # ------------------------------------------------------------ connections and errors
    def _mapped(self, doing: str) -> AbstractContextManager[None]:
        return mapped(self.location, doing, self._secrets, self.busy_timeout)

    def _connection(self) -> AbstractContextManager[Conn]:
        return self._conns.connection()

    @contextmanager
    def _tx(self, doing: str) -> Iterator[Cursor]:
        """One transaction: committed when the block ends, rolled back on an error."""
        with self._mapped(doing), self._connection() as conn, conn.transaction():
            with conn.cursor() as cur:
                if self._conns.transaction_settings:  # through PgBouncer: none per session
                    cur.execute(self._conns.transaction_settings)
                yield cur

    @contextmanager
    def _one(self, doing: str) -> Iterator[Cursor]:
        """A write that is ONE statement (a guarded update with its event, say): run in
        autocommit it is its own transaction, atomic and durable, committed in the same
        round trip (no BEGIN, no COMMIT: 1 round trip instead of 3). With a crash probe
        armed (tests), it runs inside an explicit transaction instead, so that a test can
        die between the statement and its commit. Reads may follow the write. Through
        PgBouncer it runs in a transaction too: its ``lock_timeout`` is set there, for
        the transaction only (``Connections.transaction_settings``)."""
        if self.probe is no_probe and not self._conns.pgbouncer:
            with self._mapped(doing), self._connection() as conn, conn.cursor() as cur:
                yield cur
        else:
            with self._tx(doing) as cur:
                yield cur

    def _read(self, doing: str, fn: Callable[[Cursor], Any]) -> Any:
        """One read (autocommit: one statement, one snapshot). A connection found broken
        (the server restarted) is replaced and the read tried once more."""
        for n in (1, 2):
            try:
                with self._mapped(doing), self._connection() as conn, conn.cursor() as cur:
                    return fn(cur)
            except LedgerError:
                if n == 2 or not self._conns.broken:
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ primitives (``sql``)
    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        rows: list[Row] = self._read("read", lambda cur: self._fetch(cur, sql, args))
        return rows

    def _snapshot(self, doing: str, read: Callable[[Run], T]) -> T:
        with self._tx(doing) as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return read(lambda sql, args: self._fetch(cur, sql, args))

    def _write(self, doing: str, *, one: bool = False) -> AbstractContextManager[Cursor]:
        return self._one(doing) if one else self._tx(doing)

    def _fetch(self, h: Cursor, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        h.execute(sql, args)
        return h.fetchall()

    def _execute(self, h: Cursor, sql: str, args: Sequence[Any] = ()) -> int:
        h.execute(sql, args)
        return h.rowcount

    def _execute_each(self, h: Cursor, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        h.executemany(sql, rows)  # one pipeline: one round trip for them all
        return h.rowcount

    _store = staticmethod(clean)

    def _run_all(self, h: Cursor, units: Sequence[Unit]) -> list[Row | None]:
        """Several writes of history in one round trip (a pipeline): here each is one
        statement."""
        if len(units) <= 1 or any(len(u.statements) != 1 for u in units):
            return super()._run_all(h, units)
        return _each(h, units)

    def _lock_values(self, h: Cursor, provider: str, values: Sequence[str]) -> None:
        """Take, for this transaction, the lock on each value a callback may name, in
        order: a callback kept while an outcome naming it is written, and the match that
        follows the outcome, serialise on it, so neither can miss the other."""
        for value in values:
            h.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || %s, 0))",
                (clean(f"\x1fsettled callback\x1f{provider}\x1f{value}"),),
            )

    # ------------------------------------------------------------ reads
    def integrity_check(self) -> str:
        result: str = self._read("check the ledger", postgres_schema.check)
        return result if result != "ok" else self._replay_summary()

    # ------------------------------------------------------------ history as the truth
    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]:
        """Read with a server-side cursor inside the transaction ``_holding`` opened
        (``still``, ``restore``'s check, ``verify``); else all at once, in one read."""
        t = TABLES[table]  # names from a fixed table, never from input
        by = ", ".join(
            f'{c} COLLATE "C"' if c in ("action_id", "provider", "event_id") else c
            for c in (order.split(", ") if order else t.key)
        )
        sql = f"SELECT {', '.join(t.names)} FROM {table} ORDER BY {by}"
        held = self._held
        if held is None:
            yield from self._all(sql)
            return
        self._cursors += 1
        with self._mapped(f"read the {table}"):
            cur = held.cursor(name=f"settled_rows_{self._cursors}")
        try:
            cur.itersize = 500
            with self._mapped(f"read the {table}"):
                cur.execute(sql)
            while True:
                with self._mapped(f"read the {table}"):
                    chunk = cur.fetchmany(500)
                if not chunk:
                    return
                yield from chunk
        finally:
            if not held.closed and not held.broken:
                with self._mapped(f"read the {table}"):
                    cur.close()

    @contextmanager
    def _holding(self, doing: str, how: Hold) -> Iterator[Cursor]:
        """One transaction whose connection ``rows`` reads through, opened by the
        statements of ``how`` (an isolation level, a lock)."""
        with self._tx(doing) as cur:
            for statement in _HOLDING[how]:
                cur.execute(statement)
            self._held = cur.connection
            try:
                yield cur
            finally:
                self._held = None

    def moved(self) -> tuple[str, str] | None:
        def run(cur: Cursor) -> tuple[str, str] | None:
            cur.execute("SELECT to_regclass('ledger_moved') IS NOT NULL")
            if not cur.fetchone()[0]:  # type: ignore[index]
                return None  # a ledger of an older schema, read as it is
            cur.execute("SELECT moved_to, moved_at FROM settled_moved()")
            row = cur.fetchone()
            return (str(row[0]), str(row[1])) if row else None

        found: tuple[str, str] | None = self._read("read", run)
        return found

    def clock(self, *, anchor: bool = True) -> Clock:
        """The database's clock (``DatabaseClock``): one clock for every host. Reading
        it writes nothing, so ``anchor`` changes nothing here."""
        assert self._clock is not None  # read when the ledger connected
        return self._clock

    def _read_db_clock(self) -> tuple[datetime, float]:
        """The database's time and the steady instant it corresponds to, from the
        fastest of three round trips (its midpoint errs by at most half of it)."""

        def run(cur: Cursor) -> tuple[datetime, float]:
            best: tuple[float, str, float] | None = None
            for _ in range(3):
                t0 = steady()
                cur.execute("SELECT clock_timestamp()")
                t1 = steady()
                (text,) = cur.fetchone()  # type: ignore[misc]
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, text, (t0 + t1) / 2)
            assert best is not None
            wall = from_text(best[1])
            assert wall is not None
            return wall, best[2]

        reading: tuple[datetime, float] = self._read("read the database's clock", run)
        return reading

    # ------------------------------------------------------------ copying
    def _copy_in(self, cur: Cursor, history: Iterable[History]) -> int:
        return copy_history(cur, history)

    def _copy_callbacks(self, cur: Cursor, rows: Iterable[Sequence[Any]]) -> None:
        copy_callbacks(cur, rows)


# -- statements ------------------------------------------------------------------------------

# What opens a transaction ``rows`` reads through (``_holding``). EXCLUSIVE: readers go
# on (ACCESS SHARE), every writer waits for the commit; a writer that holds a lock
# longer than lock_timeout makes holding the ledger still LedgerBusy.
_HOLDING: dict[str, tuple[str, ...]] = {
    "read": ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",),
    "write": (),
    "still": (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "LOCK TABLE actions, events, callbacks IN EXCLUSIVE MODE",
    ),
}


def _each(cur: Cursor, units: Sequence[Unit]) -> list[Row | None]:
    """Writes of one statement each, in one pipeline (one round trip for all): what
    each gave (``SqlLedger._run``)."""
    conn = cur.connection
    cursors = []
    with conn.pipeline():
        for unit in units:
            c = conn.cursor()
            c.execute(*unit.statements[0])
            cursors.append(c)
    out: list[Row | None] = []
    for unit, c in zip(units, cursors, strict=True):
        if unit.back:
            out.append(c.fetchone())
        else:
            out.append(() if c.rowcount >= 1 else None)
        c.close()
    return out


__all__ = ["DatabaseClock", "PostgresLedger", "redact"]
