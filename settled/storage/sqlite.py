"""The SQLite ledger: one file, WAL, ``synchronous=FULL``. The default, for one host.

Durability is chosen on purpose. A claim (``PENDING → IN_FLIGHT``) that is lost after
its request has left the machine means the next caller sees ``PENDING`` and sends the
action a second time. WAL with ``synchronous=NORMAL`` survives a process crash but may
lose the last commits on power loss or an OS crash; ``FULL`` fsyncs the WAL on every
commit so a committed claim survives both. It costs about 3.7× in commit rate on the
machines we measured (≈5,000 against ≈18,500 claim+event transactions/s), which is
still far above what any provider API accepts.

The hot path (claim, moves, reads) is raw, guarded SQL through ``sqlite3``; the schema
is in ``sqlite_schema`` (made new by one script, migrated by steps written with
sqlite-utils, which is only imported when a ledger needs migrating).

Writers take the lock with ``BEGIN IMMEDIATE`` retried in the application after a
short random sleep, bounded by ``busy_timeout`` seconds: fairer than SQLite's own busy
handler (no writer starves for seconds) and never an unbounded wait. A lock that stays
taken past the bound raises ``LedgerBusy``; it is never reported as an action outcome.

Every ``sqlite3`` error is mapped into ``settled.errors`` here (``_mapped``), so no
caller ever sees the driver.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from ..clock import Clock, SteadyClock, boot_id, from_text, nap, steady, to_text, utcnow
from ..crashpoints import Probe, no_probe
from ..errors import (
    InvalidInput,
    LedgerBusy,
    LedgerError,
    LedgerMoved,
)
from ..model import ActionRecord
from . import query, sqlite_file, sqlite_schema, statements
from .columns import TABLES
from .ledger import (
    DUE_SQL,
    SchemaMode,
    check_schema,
    missing_for_reads,
    moved_message,
    version_after,
)
from .sql import Hold, Row, Run, SqlLedger, busy_timeout_from_env
from .sqlite_file import is_busy, map_error

APPLICATION_ID = 0x53544C44  # "STLD": marks a file as a settled ledger
SCHEMA_VERSION = sqlite_schema.LATEST
HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)  # UPDATE … RETURNING
_ANCHOR = ("boot_id", "wall", "steady")
DIALECT = query.Dialect(
    mark="?",
    one_of=lambda column, values: (f"{column} IN ({', '.join('?' * len(values))})", list(values)),
    find="instr({haystack}, {needle}) > 0",
    # SQLite's lower() folds ASCII only; these functions are registered on every
    # connection (``_setup``) so that both backends fold and group text alike.
    lower=lambda expr: f"settled_lower({expr})",
    collate="",  # binary: code point order for UTF-8 text
    detail_of_last_event=(
        "(SELECT json_extract(e.detail, '$.detail') FROM events e"
        " WHERE e.action_id = actions.action_id ORDER BY e.id DESC LIMIT 1)"
    ),
    age_seconds="(julianday(?) - julianday(created_at)) * 86400.0",
    reason_group=lambda expr: f"settled_reason_group({expr})",
    seconds=lambda frm, to: f"((julianday({to}) - julianday({frm})) * 86400.0)",
    json_field=lambda expr, key: f"json_extract({expr}, '$.{key}')",
    returning=HAS_RETURNING,
    by_status=" INDEXED BY actions_status",
    search=lambda words: (
        "rowid IN (SELECT rowid FROM actions_search WHERE actions_search MATCH ?)",
        [query.fts5_phrases(words)],
    ),
)
# The due scan. "+status": filter on status, never search by it. Without statistics
# SQLite may otherwise pick the status index, read every row waiting for verification
# and sort them, once per batch (≈ 150 ms at 100k due rows).
_DUE = (
    f"{statements.SELECT} WHERE next_check_at IS NOT NULL AND next_check_at <= ?"
    f" AND +status IN {DUE_SQL}"
    " ORDER BY next_check_at LIMIT ?"
)

T = TypeVar("T")


class SqliteLedger(SqlLedger[sqlite3.Connection]):
    backend = "sqlite"
    latest_schema = SCHEMA_VERSION
    DIALECT = DIALECT
    COUNTED_SINCE = version_after(sqlite_schema.MIGRATIONS, "counts")  # the kept counts
    CHECKPOINT_SINCE = version_after(sqlite_schema.MIGRATIONS, "verified")  # verify's checkpoint
    READS = statements.reads(DIALECT)
    WRITES = statements.writes(DIALECT)
    BY_NAME = statements.named_records(WRITES)
    DUE = _DUE
    MARK_MOVED = "INSERT INTO ledger_moved (only_row, moved_to, moved_at) VALUES (1, ?, ?)"

    def __init__(
        self, conn: sqlite3.Connection, path: str, busy_timeout: float, probe: Probe = no_probe
    ) -> None:
        self.conn = conn  # the backend's own; nothing above the storage package uses it
        self.path = path
        self.location = path
        self.busy_timeout = busy_timeout
        self.probe = probe
        self._clock: Clock | None = None

    # ------------------------------------------------------------------ opening
    @classmethod
    def open_file(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float | None = None,
        create: bool = True,
        probe: Probe = no_probe,
        mode: SchemaMode = SchemaMode.MIGRATE,
    ) -> SqliteLedger:
        """Open the ledger file at ``path``, creating it (mode 0600) unless ``create``
        is false: then a missing file is a ``LedgerError`` naming the path. ``mode``
        says what to do with an older schema (``Ledger.open``)."""
        path = os.fspath(path)
        timeout = busy_timeout_from_env() if busy_timeout is None else busy_timeout
        if path == ":memory:":
            mode = SchemaMode.MIGRATE  # always new
        new = path == ":memory:" or sqlite_file.prepare(path, create)
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {path}: {exc}") from None
        ledger = cls(conn, path, timeout, probe)
        try:
            with ledger._mapped("open"):
                if not new:
                    new = ledger._check_identity()
                if new and mode in (SchemaMode.READ, SchemaMode.AS_IS):
                    raise LedgerError(
                        f"no ledger at {path}: the file is empty; nothing has been recorded "
                        "there (check --db, SETTLED_DB or [ledger] path)"
                    )
                ledger._setup(new=new, mode=mode)
        except LedgerError as exc:
            conn.close()
            if "file is not a database" in str(exc):
                raise LedgerError(
                    f"{path} is not a settled ledger (not an SQLite database); refusing to "
                    "write to it"
                ) from None
            raise
        except BaseException:
            conn.close()
            raise
        return ledger

    def _check_identity(self) -> bool:
        """True when the file is an empty SQLite database we may initialise.

        The mark and the table count are read in one statement, so from one snapshot:
        two separate reads could straddle another process's first schema commit (no
        mark yet, then tables) and refuse a ledger that is being created."""
        app_id, count = self._read_one(
            "SELECT (SELECT application_id FROM pragma_application_id),"
            " (SELECT count(*) FROM sqlite_master)"
        )
        if app_id == APPLICATION_ID:
            return False
        if app_id == 0 and count == 0:
            return True
        raise LedgerError(
            f"{self.path} is an SQLite database but not a settled ledger; refusing to write to it"
        )

    def _setup(self, *, new: bool, mode: SchemaMode = SchemaMode.MIGRATE) -> None:
        c = self.conn
        c.create_function("settled_lower", 1, query.fold, deterministic=True)
        c.create_function("settled_reason_group", 1, query.reason_group, deterministic=True)
        c.execute("PRAGMA busy_timeout = 0")  # the application retries, fairly and bounded
        # A read-only open writes nothing, not even the journal mode in the header: a
        # ledger that is not in WAL mode is read in its own.
        if mode is not SchemaMode.READ and (
            new or self._read_one("PRAGMA journal_mode")[0] != "wal"
        ):
            self._retry(lambda: c.execute("PRAGMA journal_mode = WAL"))
        c.execute("PRAGMA synchronous = FULL")
        c.execute("PRAGMA foreign_keys = ON")
        (version,) = self._read_one("PRAGMA user_version")
        if (new and version < SCHEMA_VERSION) or check_schema(
            self.path, version, SCHEMA_VERSION, mode, self._unreadable
        ):
            sqlite_schema.migrate(c, self._begin_immediate, APPLICATION_ID)
            (version,) = self._read_one("PRAGMA user_version")
        self.schema = version

    def _unreadable(self) -> list[str]:
        """The columns settled reads that this (older) ledger's tables lack."""
        found: dict[str, set[str]] = {}
        for table, column in self._all(
            "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p"
            " WHERE m.type = 'table'"
        ):
            found.setdefault(table, set()).add(column)
        # the ledger clock reads its anchors (``clock``)
        return missing_for_reads(found) + missing_for_reads(found, {"clock_anchors": _ANCHOR})

    # ------------------------------------------------------------------ the schema
    def schema_version(self) -> int:
        with self._mapped("read the schema version"):
            return int(self._read_one("PRAGMA user_version")[0])

    def _steps(self) -> Sequence[tuple[str, Any]]:
        return sqlite_schema.MIGRATIONS

    def _migrate(self, on_step: Callable[[int, str], None]) -> None:
        with self._mapped("migrate"):
            if self._read_one("PRAGMA journal_mode")[0] != "wal":
                self._retry(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
            sqlite_schema.migrate(self.conn, self._begin_immediate, APPLICATION_ID, on_step=on_step)

    def backup(self, target: str) -> None:
        """``VACUUM INTO`` a new file, made 0600 first (it holds every action's params):
        one read transaction, so a consistent copy even while others write."""
        target = os.fspath(target)
        if self.path == ":memory:":
            raise InvalidInput("an in-memory ledger has no file to back up")
        sqlite_file.create_private(target, "--backup")
        try:
            with self._mapped("backup"):
                self._retry(lambda: self.conn.execute("VACUUM INTO ?", (target,)))
        except BaseException:
            sqlite_file.remove(target)
            raise

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------ errors and locking
    @contextmanager
    def _mapped(self, doing: str) -> Iterator[None]:
        """The one place ``sqlite3`` errors become settled's."""
        try:
            yield
        except sqlite3.Error as exc:
            if "settled: this ledger moved" in str(exc):
                raise self._moved_error() from None
            raise map_error(exc, self.path, doing) from None

    def _moved_error(self) -> LedgerMoved:
        """The refusal of a write to a moved ledger, naming where it went."""
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            found = self.conn.execute("SELECT moved_to, moved_at FROM ledger_moved").fetchone()
        except sqlite3.Error:
            found = None
        to, at = found if found else ("another ledger", "an unknown time")
        return LedgerMoved(moved_message(self.path, to, at))

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` until it stops failing with SQLITE_BUSY, within the bound."""
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.0005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise LedgerBusy(
                        f"ledger {self.path} is locked by another writer "
                        f"(waited {self.busy_timeout:g} s); nothing was changed"
                    ) from None
                nap(random.uniform(0.05, 1.0) * pause)
                pause = min(pause * 1.5, 0.02)

    def _begin_immediate(self) -> None:
        self._retry(lambda: self.conn.execute("BEGIN IMMEDIATE"))

    @contextmanager
    def _write(self, doing: str, *, one: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE … COMMIT, or ROLLBACK on error. ``one``
        changes nothing here: one statement or many, the commit is the one fsync."""
        with self._mapped(doing):
            self._begin_immediate()
            try:
                yield self.conn
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            try:
                self._retry(lambda: self.conn.execute("COMMIT"))
            except BaseException:
                if self.conn.in_transaction:  # a failed COMMIT leaves the transaction open
                    self.conn.execute("ROLLBACK")
                raise

    def _read_one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self._retry(lambda: self.conn.execute(sql, args).fetchone())

    # ------------------------------------------------------------ primitives (``sql``)
    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._mapped("read"):
            rows: list[Row] = self._retry(lambda: self.conn.execute(sql, args).fetchall())
        return rows

    def _snapshot(self, doing: str, read: Callable[[Run], T]) -> T:
        def run() -> T:
            c = self.conn
            c.execute("BEGIN")  # one snapshot for every statement (a read transaction)
            try:
                return read(lambda sql, args: self._fetch(c, sql, args))
            finally:
                if c.in_transaction:
                    c.execute("COMMIT")

        with self._mapped(doing):
            return self._retry(run)

    def _fetch(self, h: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return h.execute(sql, args).fetchall()

    def _execute(self, h: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> int:
        return h.execute(sql, args).rowcount

    def _execute_each(self, h: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        # one prepared statement, run for each row
        return h.executemany(sql, rows).rowcount if rows else 0

    def _worth_matching(self, rec: ActionRecord) -> bool:
        # A read first, without the write lock: a callback is kept in ONE write transaction
        # that reads the record and inserts, so after our outcome's commit it is either
        # committed (seen here) or not begun (it will see the outcome itself).
        return bool(self.pending_callbacks(rec))

    # ------------------------------------------------------------ the ledger itself
    def integrity_check(self) -> str:
        with self._mapped("read"):
            found = str(self._read_one("PRAGMA integrity_check")[0])
            left = self._left_allowances()
        if found != "ok":
            return found
        if left:  # SQLite cannot refuse it at commit, as PostgreSQL does: it is found here
            return f"{left} erasure allowance(s) left behind in erasing: delete them"
        return self._replay_summary()

    def _left_allowances(self) -> int:
        try:
            return int(self._read_one("SELECT count(*) FROM erasing")[0])
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a ledger of an older schema, read as it is
                return 0
            raise

    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]:
        t = TABLES[table]  # names from a fixed table, never from input
        sql = f"SELECT {', '.join(t.names)} FROM {table} ORDER BY {order or ', '.join(t.key)}"
        with self._mapped(f"read the {table}"):
            cur = self._retry(lambda: self.conn.execute(sql))
        while True:
            with self._mapped(f"read the {table}"):
                chunk = cur.fetchmany(500)
            if not chunk:
                return
            yield from (tuple(r) for r in chunk)

    @contextmanager
    def _holding(self, doing: str, how: Hold) -> Iterator[sqlite3.Connection]:
        # SQLite: any write transaction holds the ledger still (the write lock is the
        # file's); a read one is BEGIN … COMMIT, its snapshot taken by the first read
        if how != "read":
            with self._write(doing) as c:
                yield c
            return
        with self._mapped(doing):
            self._retry(lambda: self.conn.execute("BEGIN"))
            try:
                yield self.conn
            finally:
                if self.conn.in_transaction:
                    self.conn.execute("COMMIT")

    def moved(self) -> tuple[str, str] | None:
        with self._mapped("read"):
            try:
                row = self._read_one("SELECT moved_to, moved_at FROM ledger_moved")
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # a ledger of an older schema, read as it is
                    return None
                raise
        return (str(row[0]), str(row[1])) if row else None

    def clock(self, *, anchor: bool = True) -> Clock:
        """The host's steady ledger clock (see ``settled.clock``): this boot's anchor,
        taken by the first process that needed it, read by all the others."""
        if self._clock is None:
            bid = boot_id()
            if bid is None or self.path == ":memory:":
                self._clock = Clock()
                return self._clock
            read = "SELECT wall, steady FROM clock_anchors WHERE boot_id = ?"
            row = self._all(read, (bid,))
            if not row and not anchor:
                return Clock()  # nothing anchored on this boot yet: no step to correct
            if not row:
                with self._write("anchor the clock") as c:
                    c.execute(
                        "INSERT INTO clock_anchors (boot_id, wall, steady) VALUES (?, ?, ?)"
                        " ON CONFLICT(boot_id) DO NOTHING",
                        (bid, to_text(utcnow()), steady()),
                    )
                    row = c.execute(read, (bid,)).fetchall()
            wall, at = row[0]
            anchored = from_text(wall)
            assert anchored is not None
            self._clock = SteadyClock(anchored, float(at))
        return self._clock


__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteLedger"]
