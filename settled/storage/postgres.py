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

Connections: one per ledger, opened directly (so a wrong password or a missing
database is reported at once, with its reason), reused while one thread at a time uses
the ledger; threads that use it concurrently get connections from a ``psycopg_pool``
pool made on first need. Every connection runs with ``TimeZone=UTC`` and a
``lock_timeout`` of ``busy_timeout`` seconds; timestamps are read back as the
contract's text (``YYYY-MM-DDTHH:MM:SS.ffffffZ``), so records and JSON are the same
byte for byte as SQLite's.

Every ``psycopg`` error is mapped into ``settled.errors`` here (``_map``); a password
in the location never reaches ``location``, a message or a log (``redact``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from ..clock import Clock, SteadyClock, from_text, steady, to_text
from ..crashpoints import Probe, no_probe
from ..errors import (
    LedgerBusy,
    LedgerError,
    LedgerFull,
    LedgerMoved,
    LedgerOutdated,
    LedgerReadOnly,
    MissingExtra,
)
from ..model import (
    ActionRecord,
    EventKind,
    Status,
)
from . import postgres_schema, query, statements
from .base import (
    CALLBACK_COLUMNS,
    COLUMNS,
    Decide,
    History,
    Move,
    SchemaMode,
    Sweep,
    event_detail_text,
    from_row,
    missing_for_reads,
    moved_message,
    recorded_detail,
    same_action,
    to_row,
)
from .columns import BOOLS
from .sql import (
    Hold,
    Row,
    Run,
    SqlLedger,
    busy_timeout_from_env,
    callbacks_of,
    newer_message,
    records_of,
)

try:
    import psycopg
    from psycopg.adapt import Loader
except ImportError:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtra(
        "a postgresql:// ledger needs the PostgreSQL driver: pip install 'settled[postgres]'"
    ) from None

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    Conn = psycopg.Connection[tuple[Any, ...]]
    Cursor = psycopg.Cursor[tuple[Any, ...]]

CLOCK_REFRESH = 30.0  # s between readings of the database's clock
IDLE_CHECK = 10.0  # s a connection may sit unused before it is checked before use
POOL_MAX = 8  # connections for threads that use one ledger at the same time
_COLS = ", ".join(COLUMNS)
_EVENT_COLS = "action_id, at, actor, kind, from_status, to_status, attempt, detail"


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
)
READS = statements.reads(DIALECT)
WRITES = statements.writes(DIALECT)
_BY_NAME = statements.named_records(WRITES)

T = TypeVar("T")
log = logging.getLogger("settled.storage.postgres")
# The pool logs failed background connects itself; the ledger reports them as errors.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


# -- locations and secrets -------------------------------------------------------------------


def redact(url: str) -> tuple[str, tuple[str, ...]]:
    """``url`` with any password masked as ``***``, and the secrets to scrub from
    messages (each password as written and percent-decoded)."""
    parts = urlsplit(url)
    secrets: list[str] = []
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        secrets += [password, unquote(password)]
        netloc = f"{user}:***@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            for k, v in pairs:
                if k == "password":
                    secrets += [v, quote(v)]
            query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    if not secrets:
        return url, ()
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    shown += f"?{query}" if query else ""
    shown += f"#{parts.fragment}" if parts.fragment else ""
    return shown, tuple(sorted({s for s in secrets if s}, key=len, reverse=True))


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _clean(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: a provider's stray NUL byte is stored as U+FFFD
    rather than losing the write it came with."""
    if type(value) is str and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


# -- time at the boundary ----------------------------------------------------------------


class _UtcText(Loader):
    """``timestamptz`` (sent as ISO text in UTC by every connection of the ledger) read
    as the contract's text: ``2026-01-01 00:00:00.5+00`` → ``2026-01-01T00:00:00.500000Z``."""

    def load(self, data: Any) -> str:
        s = bytes(data).decode("ascii")
        if len(s) >= 22 and s[10] == " " and s.endswith("+00") and s[4] == "-":
            frac = s[20:-3] if s[19] == "." else ""
            return f"{s[:10]}T{s[11:19]}.{frac:0<6}Z"
        raise psycopg.DataError(f"unexpected timestamp from the database: {s!r}")


class DatabaseClock(SteadyClock):
    """The database's clock, read on this host: its last reading plus the steady time
    elapsed since (``SteadyClock``), re-read every ``refresh`` seconds. The first
    reading is taken when it is made (the ledger makes it when it connects); a later
    reading that fails keeps the clock counting from the one before."""

    def __init__(self, read: Callable[[], tuple[datetime, float]], refresh: float) -> None:
        wall, at = read()
        super().__init__(wall, at)
        self._read = read
        self._refresh = refresh
        self._checked = at

    def now(self) -> datetime:
        s = steady()
        if s - self._checked >= self._refresh:
            self._checked = s
            try:
                self._wall, self._at = self._read()
            except LedgerError as exc:
                log.warning("could not read the database's clock, counting on: %s", exc)
        return super().now()


# -- the ledger ------------------------------------------------------------------------------


class PostgresLedger(SqlLedger["Cursor"]):
    thread_safe = True  # threads that use it at once get connections of their own
    backend = "postgresql"
    latest_schema = postgres_schema.LATEST
    DIALECT, READS, WRITES, BY_NAME = DIALECT, READS, WRITES, _BY_NAME

    def __init__(
        self,
        conninfo: str,
        location: str,
        secrets: tuple[str, ...],
        busy_timeout: float,
        probe: Probe = no_probe,
    ) -> None:
        self.location = location
        self.busy_timeout = busy_timeout
        self.probe = probe
        self._conninfo = conninfo
        self._secrets = secrets
        self._main: Conn | None = None
        self._main_lock = threading.Lock()
        self._main_used = 0.0
        self._pool: ConnectionPool[Any] | None = None
        self._pool_lock = threading.Lock()
        self._clock: Clock | None = None
        self._closed = False
        self._extra: dict[str, Any] = {}
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
    ) -> PostgresLedger:
        """Open the ledger in the schema ``url`` selects (the first of its
        ``search_path``), creating its tables unless ``create`` is false: then a schema
        without a ledger is a ``LedgerError`` naming the location. ``mode`` says what
        to do with an older schema (``Ledger.open``)."""
        timeout = busy_timeout_from_env() if busy_timeout is None else busy_timeout
        location, secrets = redact(url)
        ledger = cls(url, location, secrets, timeout, probe)
        try:
            with ledger._mapped("open"):
                ledger._extra = ledger._connect_params()
                ledger._main = ledger._new_connection()
                ledger._main_used = time.monotonic()
                ledger._setup(ledger._main, create, mode)
                ledger._clock = DatabaseClock(ledger._read_db_clock, CLOCK_REFRESH)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def _connect_params(self) -> dict[str, Any]:
        given = psycopg.conninfo.conninfo_to_dict(self._conninfo)
        extra: dict[str, Any] = {}
        if "connect_timeout" not in given:
            extra["connect_timeout"] = max(2, round(self.busy_timeout))
        if "application_name" not in given:
            extra["application_name"] = "settled"
        return extra

    def _new_connection(self) -> Conn:
        conn: Conn = psycopg.connect(self._conninfo, autocommit=True, **self._extra)
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: Conn) -> None:
        conn.adapters.register_loader("timestamptz", _UtcText)
        ms = max(1, round(self.busy_timeout * 1000))
        conn.execute(
            "SET TIME ZONE 'UTC'; SET datestyle = 'ISO, YMD';"
            f" SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = 300000"
        )

    def _setup(self, conn: Conn, create: bool, mode: SchemaMode = SchemaMode.MIGRATE) -> None:
        latest = postgres_schema.LATEST
        with conn.cursor() as cur:
            found, other = postgres_schema.inspect(cur)
            if found is None:
                if other:
                    raise LedgerError(
                        f"{self.location} holds other tables ({', '.join(other)}) and is not "
                        "a settled ledger; refusing to write to it (use an empty schema)"
                    )
                if not create:
                    raise LedgerError(
                        f"no ledger at {self.location}; nothing has been recorded there "
                        "(check --db, SETTLED_DB or [ledger] url)"
                    )
        if found is not None and found > latest:
            raise LedgerError(newer_message(self.location, found, latest))
        if found is None or (found < latest and mode is SchemaMode.MIGRATE):
            postgres_schema.migrate(conn, self.location)
            found = self._read_version(conn)
        elif found < latest and mode is SchemaMode.REFUSE:
            raise LedgerOutdated(self.location, found, latest)
        elif found < latest and mode is SchemaMode.READ and self._unreadable(conn):
            raise LedgerOutdated(self.location, found, latest)
        self.schema = found

    def _unreadable(self, conn: Conn) -> list[str]:
        """The columns settled reads that this (older) ledger's tables lack."""
        rows = conn.execute(
            "SELECT table_name::text, column_name::text FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ).fetchall()
        found: dict[str, set[str]] = {}
        for table, column in rows:
            found.setdefault(table, set()).add(column)
        return missing_for_reads(found)

    @staticmethod
    def _read_version(conn: Conn) -> int:
        row = conn.execute(f"SELECT version FROM {postgres_schema.MARK}").fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------ the schema
    def schema_version(self) -> int:
        with self._mapped("read the schema version"), self._connection() as conn:
            return self._read_version(conn)

    def _steps(self) -> Sequence[tuple[str, Any]]:
        return postgres_schema.MIGRATIONS

    def _migrate(self, on_step: Callable[[int, str], None]) -> None:
        with self._mapped("migrate"), self._connection() as conn:
            postgres_schema.migrate(conn, self.location, on_step=on_step)

    def close(self) -> None:
        self._closed = True
        if self._main is not None:
            self._main.close()
            self._main = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ------------------------------------------------------------ connections and errors
    @contextmanager
    def _mapped(self, doing: str) -> Iterator[None]:
        """The one place ``psycopg`` errors become settled's."""
        try:
            yield
        except psycopg.Error as exc:
            raise _map(exc, self.location, doing, self._secrets, self.busy_timeout) from None

    @contextmanager
    def _connection(self) -> Iterator[Conn]:
        """This ledger's connection, or one from the pool while another thread has it."""
        if self._closed:
            raise LedgerError(f"ledger {self.location}: cannot operate on a closed database")
        if self._main_lock.acquire(blocking=False):
            try:
                yield self._ready_main()
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    # Interrupted mid-command (Ctrl-C, or SIGTERM taken as Ctrl-C during
                    # --wait): where the protocol stands is unknown, so the connection is
                    # dropped (its open transaction rolls back) and the next use makes one.
                    self._drop_main()
                raise
            finally:
                self._main_used = time.monotonic()
                self._main_lock.release()
            return
        with self._overflow().connection() as conn:
            yield conn

    def _drop_main(self) -> None:
        conn, self._main = self._main, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: S110 - closing a connection left mid-command: nothing to keep
                pass

    def _ready_main(self) -> Conn:
        conn = self._main
        if conn is not None and not conn.closed and not conn.broken:
            if time.monotonic() - self._main_used < IDLE_CHECK:
                return conn
            try:  # idle for a while: the server may have restarted meanwhile
                conn.execute("")
                return conn
            except psycopg.OperationalError:
                conn.close()
        self._main = None
        self._main = self._new_connection()
        return self._main

    def _overflow(self) -> ConnectionPool[Any]:
        with self._pool_lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool

                self._pool = ConnectionPool(
                    self._conninfo,
                    kwargs={"autocommit": True, **self._extra},
                    min_size=0,
                    max_size=POOL_MAX,
                    configure=self._configure,
                    timeout=max(self.busy_timeout, 1.0),
                    name="settled",
                    open=True,
                )
            return self._pool

    @contextmanager
    def _tx(self, doing: str) -> Iterator[Cursor]:
        """One transaction: committed when the block ends, rolled back on an error."""
        with self._mapped(doing), self._connection() as conn, conn.transaction():
            with conn.cursor() as cur:
                yield cur

    @contextmanager
    def _one(self, doing: str) -> Iterator[Cursor]:
        """A write that is ONE statement (a guarded update with its event, say): run in
        autocommit it is its own transaction, atomic and durable, committed in the same
        round trip (no BEGIN, no COMMIT: 1 round trip instead of 3). With a crash probe
        armed (tests), it runs inside an explicit transaction instead, so that a test can
        die between the statement and its commit. Reads may follow the write."""
        if self.probe is no_probe:
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
                if n == 2 or self._main is None or not (self._main.closed or self._main.broken):
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

    def _execute_each(self, h: Cursor, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        for args in rows:  # in turn (the dispatch leases a due batch finds running: few)
            h.execute(sql, args)

    def _storable(self, row: dict[str, Any]) -> dict[str, Any]:
        return {k: _clean(v) for k, v in row.items()}

    def _lock_values(self, h: Cursor, provider: str, values: Sequence[str]) -> None:
        """Take, for this transaction, the lock on each value a callback may name, in
        order: a callback kept while an outcome naming it is written, and the match that
        follows the outcome, serialise on it, so neither can miss the other."""
        for value in values:
            h.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || %s, 0))",
                (_clean(f"\x1fsettled callback\x1f{provider}\x1f{value}"),),
            )

    # ------------------------------------------------------------ reads
    def integrity_check(self) -> str:
        def run(cur: Cursor) -> str:
            cur.execute(
                "SELECT t.tgname FROM pg_trigger t WHERE t.tgenabled <> 'D'"
                " AND t.tgrelid IN (to_regclass('actions'), to_regclass('events'),"
                " to_regclass('callbacks'))"
            )
            enabled = {r[0] for r in cur.fetchall()}
            missing = [t for t in postgres_schema.TRIGGERS if t not in enabled]
            if missing:
                return f"append-only triggers missing or disabled: {', '.join(missing)}"
            cur.execute(
                "SELECT count(*) FROM events e LEFT JOIN actions a USING (action_id)"
                " WHERE a.action_id IS NULL"
            )
            orphans = int(cur.fetchone()[0])  # type: ignore[index]
            return "ok" if not orphans else f"{orphans} events without their action"

        result: str = self._read("check the ledger", run)
        return result if result != "ok" else self._replay_summary()

    # ------------------------------------------------------------ history as the truth
    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]:
        """Read with a server-side cursor inside the transaction ``_holding`` opened
        (``still``, ``restore``'s check, ``verify``); else all at once, in one read."""
        from .truth import TABLES

        columns, key = TABLES[table]  # names from a fixed table, never from input
        by = ", ".join(
            f'{c} COLLATE "C"' if c in ("action_id", "provider", "event_id") else c
            for c in (order.split(", ") if order else key)
        )
        sql = f"SELECT {', '.join(columns)} FROM {table} ORDER BY {by}"
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

    def _mark_moved(self, h: Cursor, to: str, at: str) -> None:
        h.execute(
            "INSERT INTO ledger_moved (moved_to, moved_at) VALUES (%s, %s::timestamptz)",
            (_clean(to), at),
        )

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

    # ------------------------------------------------------------ writes
    def record_and_claim(
        self, rec: ActionRecord, *, actor: str, claim: Move
    ) -> tuple[ActionRecord, bool]:
        if not _fusable(rec, claim):
            return super().record_and_claim(rec, actor=actor, claim=claim)
        # PostgreSQL: the row written already claimed, with both its events, in ONE
        # statement (one round trip, its own transaction)
        with self._one("record and claim") as cur:
            cur.execute(*_claimed_insert(rec, actor, claim))
            got = cur.fetchone()
            if got is None:
                found = self._find_in(cur, rec.action_id)
                assert found is not None
                same_action(found, rec)  # Conflict: nothing was written
                return found, False
            self.probe(f"before_commit:{claim.kind}")
        return from_row(dict(zip(COLUMNS, got, strict=True))), True

    def _claim_new(
        self, cur: Cursor, pairs: Sequence[tuple[ActionRecord, Move]], actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        if not all(_fusable(rec, m) for rec, m in pairs):
            return super()._claim_new(cur, pairs, actor)
        # PostgreSQL: every row written already claimed, in one pipeline (one round trip)
        out: list[tuple[ActionRecord, bool]] = []
        rows = _each(cur, [_claimed_insert(rec, actor, m) for rec, m in pairs])
        for (rec, claim), got in zip(pairs, rows, strict=True):
            if got is None:  # the id was taken (before, or earlier in this group)
                found = self._find_in(cur, rec.action_id)
                assert found is not None
                out.append((found, False))
                continue
            self.probe(f"before_commit:{claim.kind}")
            out.append((from_row(dict(zip(COLUMNS, got, strict=True))), True))
        return out

    def _due(self, h: Cursor, cutoff: str, size: int) -> list[ActionRecord]:
        # SKIP LOCKED: rows another daemon is leasing right now are its own; the
        # rows it has leased already are not due any more (their check time moved).
        return records_of(self._fetch(h, _DUE, (cutoff, size)))

    def _lease(self, h: Cursor, leased: Sequence[ActionRecord], owner: str, until: str) -> None:
        h.execute(  # the whole batch bound as one array: one statement, one round trip
            "UPDATE actions SET lease_owner = %s, next_check_at = %s WHERE action_id = ANY(%s)",
            (owner, until, [rec.action_id for rec in leased]),
        )

    def hand_back(self, leased: Sequence[ActionRecord], *, owner: str) -> None:
        if not leased:
            return
        with self._one("hand back a batch") as cur:
            cur.execute(
                "UPDATE actions AS a SET lease_owner = NULL, next_check_at = b.due"
                " FROM unnest(%s::text[], %s::timestamptz[]) AS b(id, due)"
                " WHERE a.action_id = b.id AND a.lease_owner = %s",
                ([r.action_id for r in leased], [r.next_check_at for r in leased], owner),
            )

    # ------------------------------------------------------------ callbacks
    def sweep_callbacks(self, decide: Decide, *, now: datetime, size: int) -> Sweep:
        # PostgreSQL: one transaction per callback, locked on the value it names and
        # skipped when another pass holds it, so passes on many hosts share the work.
        sweep = Sweep()
        at = to_text(now)
        due = self._all(
            "SELECT provider, event_id, key FROM callbacks WHERE state = 'pending'"
            " AND next_check_at <= %s ORDER BY next_check_at LIMIT %s",
            (at, size),
        )
        for provider, event_id, key in due:
            with self._tx("match a pending callback") as cur:
                self._lock_values(cur, provider, [key])
                found = self._fetch(
                    cur,
                    f"SELECT {_CB_COLS} FROM callbacks WHERE provider = %s AND event_id = %s"
                    " AND state = 'pending' FOR UPDATE SKIP LOCKED",
                    (provider, event_id),
                )
                # none found: matched meanwhile, or another pass has it
                for pending in callbacks_of(found):
                    self._sweep_one(cur, pending, decide, now, at, sweep)
        return sweep

    # ------------------------------------------------------------ copying
    def _copy_in(self, cur: Cursor, history: Iterable[History]) -> int:
        # PostgreSQL: COPY in chunks, then the events' sequence moved past the copied ids
        n = 0
        chunk: list[History] = []
        for item in history:
            chunk.append(item)
            if len(chunk) >= 1000:
                n += _copy_chunk(cur, chunk)
                chunk = []
        n += _copy_chunk(cur, chunk)
        cur.execute(
            "SELECT setval(pg_get_serial_sequence('events', 'id'), max(id)) FROM events"
            " HAVING max(id) IS NOT NULL"
        )
        return n

    def _copy_callbacks(self, cur: Cursor, rows: Iterable[Sequence[Any]]) -> None:
        from .truth import CALLBACK_TABLE_COLUMNS

        with cur.copy(f"COPY callbacks ({', '.join(CALLBACK_TABLE_COLUMNS)}) FROM STDIN") as cp:
            for row in rows:
                cp.write_row(tuple(_clean(v) for v in row))

    # ------------------------------------------------------------ inside a transaction
    def _insert_row(self, cur: Cursor, rec: ActionRecord, actor: str) -> bool:
        """The new PENDING row and its ``recorded`` event, in one statement (unless the
        id is taken)."""
        row = _row(rec)
        cur.execute(
            f"WITH a AS (INSERT INTO actions ({', '.join(row)})"
            f" VALUES ({', '.join(['%s'] * len(row))}) ON CONFLICT (action_id) DO NOTHING"
            f" RETURNING action_id) INSERT INTO events ({_EVENT_COLS})"
            " SELECT action_id, %s::timestamptz, %s, %s, NULL, %s, %s::int, %s FROM a",
            [
                *row.values(),
                rec.created_at,
                _clean(actor),
                str(EventKind.RECORDED),
                str(rec.status),
                rec.attempt,
                event_detail_text(recorded_detail(rec)),
            ],
        )
        return cur.rowcount == 1

    def _apply(self, cur: Cursor, m: Move, *, everything: bool) -> dict[str, Any] | None:
        """One guarded move inside the caller's transaction, with its event, in one
        statement; the row (all columns when ``everything``, else its attempt), or
        None when the guard did not hold."""
        cur.execute(*_move_sql(m, everything))
        got = cur.fetchone()
        if got is None:
            return None
        if m.kind is not None:
            self.probe(f"before_commit:{m.kind}")
        if everything:
            return dict(zip(COLUMNS, got, strict=True))
        return {"attempt": got[0]}

    def _apply_all(self, cur: Cursor, moves: Sequence[Move]) -> list[bool]:
        """Several guarded moves in one round trip (a pipeline); whether each held."""
        if len(moves) <= 1:
            return [self._apply(cur, m, everything=False) is not None for m in moves]
        rows = _each(cur, [_move_sql(m, False) for m in moves])
        held = []
        for m, got in zip(moves, rows, strict=True):
            if got is not None and m.kind is not None:
                self.probe(f"before_commit:{m.kind}")
            held.append(got is not None)
        return held


# -- statements ------------------------------------------------------------------------------

_CB_COLS = ", ".join(CALLBACK_COLUMNS)
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
_DUE = (
    f"{statements.SELECT} WHERE {postgres_schema.DUE_PREDICATE} AND next_check_at <= %s"
    " ORDER BY next_check_at LIMIT %s FOR UPDATE SKIP LOCKED"
)


Statement = tuple[str, list[Any]]


def _row(rec: ActionRecord) -> dict[str, Any]:
    row = to_row(rec)
    for name in BOOLS:  # ``boolean`` columns here, 0/1 in the portable row
        row[name] = bool(row[name])
    return {k: _clean(v) for k, v in row.items()}


def _event_args(m: Move, frm: str | None) -> list[Any]:
    return [m.at, _clean(m.actor), str(m.kind), frm, str(m.to), event_detail_text(m.detail)]


def _move_sql(m: Move, everything: bool) -> Statement:
    update, args = statements.move_update(m, DIALECT)
    args = [_clean(v) for v in args]
    back = _COLS if everything else "attempt"
    if m.kind is None:
        return f"{update} RETURNING {back}", args
    sql = (
        f"WITH m AS ({update} RETURNING {_COLS if everything else 'action_id, attempt'}),"
        f" e AS (INSERT INTO events ({_EVENT_COLS})"
        " SELECT action_id, %s::timestamptz, %s, %s, %s, %s, attempt, %s FROM m)"
        f" SELECT {back} FROM m"
    )
    return sql, args + _event_args(m, str(m.frm))


def _fusable(rec: ActionRecord, claim: Move) -> bool:
    """Whether ``claim`` certainly holds on ``rec`` freshly inserted, so that the row
    can be written already claimed (the same row and events as insert, then move)."""
    return (
        rec.status is Status.PENDING
        and claim.action_id == rec.action_id
        and claim.frm is Status.PENDING
        and claim.kind is not None
        and not claim.kind.changes_nothing
        and claim.owner in (None, rec.lease_owner)
        and claim.attempt in (None, rec.attempt)
        and not claim.correction
    )


def _claimed_insert(rec: ActionRecord, actor: str, claim: Move) -> Statement:
    """``rec`` inserted already claimed, with its ``recorded`` and ``claim`` events in
    that order, or nothing when its id is taken: one statement, one round trip."""
    row = _row(rec)
    for k, v in claim.values.items():
        row[k] = _clean(v)
    row["status"] = str(claim.to)
    row["updated_at"] = claim.at
    attempt = int(row["attempt"])
    sql = (
        f"WITH a AS (INSERT INTO actions ({', '.join(row)})"
        f" VALUES ({', '.join(['%s'] * len(row))}) ON CONFLICT (action_id) DO NOTHING"
        f" RETURNING {_COLS}),"
        f" e AS (INSERT INTO events ({_EVENT_COLS})"
        " SELECT a.action_id, v.at, v.actor, v.kind, v.frm, v.tos, v.attempt, v.detail"
        " FROM a, (VALUES (1, %s::timestamptz, %s, %s, NULL::text, %s, %s::int, %s),"
        " (2, %s::timestamptz, %s, %s, %s, %s, %s::int, %s))"
        " AS v(n, at, actor, kind, frm, tos, attempt, detail) ORDER BY v.n)"
        f" SELECT {_COLS} FROM a"
    )
    args = [
        *row.values(),
        rec.created_at,
        _clean(actor),
        str(EventKind.RECORDED),
        str(rec.status),
        rec.attempt,
        event_detail_text(recorded_detail(rec)),
        claim.at,
        _clean(claim.actor),
        str(claim.kind),
        str(claim.frm),
        str(claim.to),
        attempt,
        event_detail_text(claim.detail),
    ]
    return sql, args


def _copy_chunk(cur: Cursor, chunk: Sequence[History]) -> int:
    """COPY records, then their events: the events' ids are written as given (COPY
    into an identity column keeps them, like OVERRIDING SYSTEM VALUE)."""
    if not chunk:
        return 0
    with cur.copy(f"COPY actions ({_COLS}) FROM STDIN") as copy:
        for rec, _ in chunk:
            copy.write_row(tuple(_row(rec).values()))
    with cur.copy(f"COPY events (id, {_EVENT_COLS}) FROM STDIN") as copy:
        for _, log in chunk:
            for e in log:
                copy.write_row(
                    (
                        e.id,
                        e.action_id,
                        e.at,
                        _clean(e.actor),
                        e.kind,
                        e.from_status,
                        e.to_status,
                        e.attempt,
                        event_detail_text(e.detail),
                    )
                )
    return len(chunk)


def _each(cur: Cursor, statements: Sequence[Statement]) -> list[tuple[Any, ...] | None]:
    """Run statements that each return at most one row, in one pipeline (one round
    trip for all); the row of each, or None."""
    conn = cur.connection
    cursors = []
    with conn.pipeline():
        for sql, args in statements:
            c = conn.cursor()
            c.execute(sql, args)
            cursors.append(c)
    out = []
    for c in cursors:
        out.append(c.fetchone())
        c.close()
    return out


# -- errors ----------------------------------------------------------------------------------

_BUSY = {"40001", "40P01", "57014", "53300"}
_READ_ONLY = {"25006", "42501"}


def _map(
    exc: psycopg.Error, location: str, doing: str, secrets: Sequence[str], waited: float
) -> LedgerError:
    state = exc.sqlstate or ""
    text = _scrub(" ".join(str(exc).split()), secrets)
    if state == "55P03":  # lock_timeout: another writer held the row or table too long
        return LedgerBusy(
            f"ledger {location} is locked by another writer (waited {waited:g} s); "
            f"{doing} did not happen"
        )
    if state in _BUSY:
        return LedgerBusy(f"ledger {location} is busy: {text}; {doing} did not happen")
    if state == "53100":
        return LedgerFull(
            f"ledger {location}: the database's disk is full; {doing} did not happen ({text})"
        )
    if state in _READ_ONLY:
        return LedgerReadOnly(
            f"ledger {location} cannot be written ({text}); {doing} did not happen"
        )
    if state.startswith(("28", "3D", "3F")):
        return LedgerError(f"cannot open ledger {location}: {text}")
    if state.startswith(("08", "57P")) or (isinstance(exc, psycopg.OperationalError) and not state):
        return LedgerError(
            f"cannot reach ledger {location} ({text}); {doing} is not known to have happened"
        )
    if state == "P0001" and text.startswith("settled: this ledger moved to "):
        to, _, at = text.removeprefix("settled: this ledger moved to ").rpartition(" at ")
        return LedgerMoved(moved_message(location, to, at))
    if state == "P0001" and text.startswith("settled:"):
        return LedgerError(f"ledger {location}: {text}")
    return LedgerError(f"ledger {location}: {text} ({doing})")


__all__ = ["DatabaseClock", "PostgresLedger", "redact"]
