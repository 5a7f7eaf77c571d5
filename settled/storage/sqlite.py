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
sqlite-utils), which is only imported when a ledger is new or needs migrating.

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
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ..clock import Clock, SteadyClock, boot_id, from_text, nap, steady, to_text, utcnow
from ..crashpoints import Probe, no_probe
from ..errors import (
    InvalidInput,
    LedgerBusy,
    LedgerError,
    LedgerFull,
    LedgerMoved,
    LedgerOutdated,
    LedgerReadOnly,
)
from ..model import ActionRecord, EventKind
from . import query, statements
from .base import (
    CALLBACK_COLUMNS,
    COLUMNS,
    DUE_STATUSES,
    Decide,
    History,
    Move,
    SchemaMode,
    Sweep,
    event_detail_text,
    missing_for_reads,
    moved_message,
    recorded_detail,
    to_row,
)
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

APPLICATION_ID = 0x53544C44  # "STLD": marks a file as a settled ledger
SCHEMA_VERSION = 8  # == sqlite_schema.LATEST (checked by a test)
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
)
READS = statements.reads(DIALECT)
WRITES = statements.writes(DIALECT)
_BY_NAME = statements.named_records(WRITES)

T = TypeVar("T")


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return True
    msg = str(exc)
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)


class SqliteLedger(SqlLedger[sqlite3.Connection]):
    backend = "sqlite"
    latest_schema = SCHEMA_VERSION
    DIALECT, READS, WRITES, BY_NAME = DIALECT, READS, WRITES, _BY_NAME

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        busy_timeout: float,
        probe: Probe = no_probe,
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
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            ledger = cls(conn, path, timeout, probe)
            ledger._setup(new=True)
            return ledger
        new = _prepare_file(path, create)
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
        if version > SCHEMA_VERSION:
            raise LedgerError(newer_message(self.path, version, SCHEMA_VERSION))
        if version < SCHEMA_VERSION and (new or mode is SchemaMode.MIGRATE):
            from . import sqlite_schema

            sqlite_schema.migrate(c, self._begin_immediate, APPLICATION_ID)
            (version,) = self._read_one("PRAGMA user_version")
        elif version < SCHEMA_VERSION and mode is SchemaMode.REFUSE:
            raise LedgerOutdated(self.path, version, SCHEMA_VERSION)
        elif version < SCHEMA_VERSION and mode is SchemaMode.READ and self._unreadable():
            raise LedgerOutdated(self.path, version, SCHEMA_VERSION)
        self.schema = version

    def _unreadable(self) -> list[str]:
        """The columns settled reads that this (older) ledger's tables lack."""
        rows = self._all(
            "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p"
            " WHERE m.type = 'table'"
        )
        found: dict[str, set[str]] = {}
        for table, column in rows:
            found.setdefault(table, set()).add(column)
        # the ledger clock reads its anchors (``clock``)
        return missing_for_reads(found) + missing_for_reads(found, {"clock_anchors": _ANCHOR})

    # ------------------------------------------------------------------ the schema
    def schema_version(self) -> int:
        with self._mapped("read the schema version"):
            return int(self._read_one("PRAGMA user_version")[0])

    def _steps(self) -> Sequence[tuple[str, Any]]:
        from . import sqlite_schema  # sqlite-utils: only for a ledger that is migrated

        return sqlite_schema.MIGRATIONS

    def _migrate(self, on_step: Callable[[int, str], None]) -> None:
        from . import sqlite_schema

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
        if os.path.lexists(target):
            raise InvalidInput(f"--backup {target}: a file is already there; name a new file")
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError as exc:
            raise InvalidInput(f"--backup {target}: cannot create it: {exc.strerror}") from None
        os.fchmod(fd, 0o600)
        os.close(fd)
        try:
            with self._mapped("backup"):
                self._retry(lambda: self.conn.execute("VACUUM INTO ?", (target,)))
        except BaseException:
            try:
                os.unlink(target)
            except OSError:
                pass
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
            raise _map(exc, self.path, doing) from None

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
                if not _is_busy(exc):
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
    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._mapped("read"):
            rows: list[tuple[Any, ...]] = self._retry(
                lambda: self.conn.execute(sql, args).fetchall()
            )
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

    def _execute_each(self, h: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        h.executemany(sql, rows)

    def _worth_matching(self, rec: ActionRecord) -> bool:
        # A read first, without the write lock: a callback is kept in ONE write transaction
        # that reads the record and inserts, so after our outcome's commit it is either
        # committed (seen here) or not begun (it will see the outcome itself).
        return bool(self.pending_callbacks(rec))

    # ------------------------------------------------------------ reads
    def integrity_check(self) -> str:
        with self._mapped("read"):
            found = str(self._read_one("PRAGMA integrity_check")[0])
        return found if found != "ok" else self._replay_summary()

    # ------------------------------------------------------------ history as the truth
    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]:
        from .truth import TABLES

        columns, key = TABLES[table]  # names from a fixed table, never from input
        by = order or ", ".join(key)
        with self._mapped(f"read the {table}"):
            cur = self._retry(
                lambda: self.conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {by}")
            )
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
                row = self._retry(
                    lambda: self.conn.execute(
                        "SELECT moved_to, moved_at FROM ledger_moved"
                    ).fetchall()
                )
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):  # a ledger of an older schema, read as it is
                    return None
                raise
        return (str(row[0][0]), str(row[0][1])) if row else None

    def _mark_moved(self, h: sqlite3.Connection, to: str, at: str) -> None:
        h.execute(
            "INSERT INTO ledger_moved (only_row, moved_to, moved_at) VALUES (1, ?, ?)", (to, at)
        )

    def clock(self, *, anchor: bool = True) -> Clock:
        """The host's steady ledger clock (see ``settled.clock``): this boot's anchor,
        taken by the first process that needed it, read by all the others."""
        if self._clock is None:
            bid = boot_id()
            if bid is None or self.path == ":memory:":
                self._clock = Clock()
                return self._clock
            row = self._all("SELECT wall, steady FROM clock_anchors WHERE boot_id = ?", (bid,))
            if not row and not anchor:
                return Clock()  # nothing anchored on this boot yet: no step to correct
            if not row:
                with self._write("anchor the clock") as c:
                    c.execute(
                        "INSERT INTO clock_anchors (boot_id, wall, steady) VALUES (?, ?, ?)"
                        " ON CONFLICT(boot_id) DO NOTHING",
                        (bid, to_text(utcnow()), steady()),
                    )
                    row = c.execute(
                        "SELECT wall, steady FROM clock_anchors WHERE boot_id = ?", (bid,)
                    ).fetchall()
            wall, at = row[0]
            anchored = from_text(wall)
            assert anchored is not None
            self._clock = SteadyClock(anchored, float(at))
        return self._clock

    # ------------------------------------------------------------ writes
    def _due(self, h: sqlite3.Connection, cutoff: str, size: int) -> list[ActionRecord]:
        # "+status": filter on status, never search by it. Without statistics SQLite
        # may otherwise pick the status index, read every row waiting for
        # verification and sort them, once per batch (≈ 150 ms at 100k due rows).
        return records_of(h.execute(_DUE, (cutoff, *map(str, DUE_STATUSES), size)).fetchall())

    def _lease(
        self, h: sqlite3.Connection, leased: Sequence[ActionRecord], owner: str, until: str
    ) -> None:
        h.executemany(  # one statement for the batch's leases
            "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?",
            [(owner, until, rec.action_id) for rec in leased],
        )

    def hand_back(self, leased: Sequence[ActionRecord], *, owner: str) -> None:
        if not leased:
            return
        with self._write("hand back a batch") as c:
            c.executemany(  # SQLite: one statement, run for each record
                "UPDATE actions SET lease_owner = NULL, next_check_at = ?"
                " WHERE action_id = ? AND lease_owner = ?",
                [(rec.next_check_at, rec.action_id, owner) for rec in leased],
            )

    # ------------------------------------------------------------ callbacks
    def sweep_callbacks(self, decide: Decide, *, now: datetime, size: int) -> Sweep:
        # SQLite: the whole batch in ONE write transaction (the write lock is the
        # file's), and a pass with nothing due takes no write lock at all.
        sweep = Sweep()
        at = to_text(now)
        due = self._all(
            "SELECT 1 FROM callbacks WHERE state = 'pending' AND next_check_at <= ? LIMIT 1", (at,)
        )
        if not due:
            return sweep
        with self._write("match pending callbacks") as c:
            rows = c.execute(
                f"SELECT {_CB_COLS} FROM callbacks WHERE state = 'pending' AND next_check_at <= ?"
                " ORDER BY next_check_at LIMIT ?",
                (at, size),
            ).fetchall()
            for pending in callbacks_of(rows):
                self._sweep_one(c, pending, decide, now, at, sweep)
        return sweep

    # ------------------------------------------------------------ copying
    def _copy_in(self, h: sqlite3.Connection, history: Iterable[History]) -> int:
        # SQLite: row by row (the no-replace trigger refuses a taken id without an
        # error: ``changes()`` tells), each record's events in one executemany
        n = 0
        names = ", ".join(COLUMNS)
        marks = ", ".join("?" * len(COLUMNS))
        for rec, events in history:
            row = to_row(rec)
            h.execute(f"INSERT INTO actions ({names}) VALUES ({marks})", list(row.values()))
            if h.execute("SELECT changes()").fetchone()[0] != 1:  # the no-replace trigger
                raise LedgerError(f"{self.path} already holds action {rec.action_id}")
            h.executemany(
                "INSERT INTO events (id, action_id, at, actor, kind, from_status, to_status,"
                " attempt, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        e.id,
                        e.action_id,
                        e.at,
                        e.actor,
                        e.kind,
                        e.from_status,
                        e.to_status,
                        e.attempt,
                        event_detail_text(e.detail),
                    )
                    for e in events
                ],
            )
            n += 1
        return n

    def _copy_callbacks(self, h: sqlite3.Connection, rows: Iterable[Sequence[Any]]) -> None:
        from .truth import CALLBACK_TABLE_COLUMNS

        h.executemany(
            f"INSERT INTO callbacks ({', '.join(CALLBACK_TABLE_COLUMNS)})"
            f" VALUES ({', '.join('?' * len(CALLBACK_TABLE_COLUMNS))})",
            [tuple(r) for r in rows],
        )

    # ------------------------------------------------------------ inside a transaction
    def _insert_row(self, h: sqlite3.Connection, rec: ActionRecord, actor: str) -> bool:
        """The new PENDING row, then its ``recorded`` event (unless the id is taken)."""
        if h.execute(_INSERT, list(to_row(rec).values())).rowcount != 1:
            return False
        self._event(
            h,
            rec.action_id,
            rec.created_at,
            actor,
            EventKind.RECORDED,
            None,
            str(rec.status),
            rec.attempt,
            recorded_detail(rec),
        )
        return True

    def _apply(self, c: sqlite3.Connection, m: Move, *, everything: bool) -> dict[str, Any] | None:
        """One guarded move inside the caller's transaction; the row (all columns when
        ``everything``, else just its attempt), or None when the guard did not hold.

        The event is written first, by an insert guarded like the update (it finds the
        row only while the guard holds), then the row: the database refuses a status
        change whose newest event does not record it (``actions_status_has_event``,
        rule 18), and SQLite can only check that when the change is made."""
        where, guard = statements.move_guard(m, DIALECT)
        if m.kind is not None:
            cur = c.execute(
                "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
                " detail) SELECT action_id, ?, ?, ?, ?, ?, coalesce(?, attempt), ?"
                f" FROM actions WHERE {where}",
                [
                    m.at,
                    m.actor,
                    str(m.kind),
                    str(m.frm),
                    str(m.to),
                    statements.move_values(m).get("attempt"),
                    event_detail_text(m.detail),
                    *guard,
                ],
            )
            if cur.rowcount != 1:
                return None
            # the guard holds (the write lock is held): the update below finds the row
            where, guard = "action_id = ?", [m.action_id]
        sql, args = statements.move_update(m, DIALECT, (where, guard))
        row: dict[str, Any] | None
        if HAS_RETURNING:  # the new row in the same statement: no SELECT after the UPDATE
            cur = c.execute(
                sql + (f" RETURNING {', '.join(COLUMNS)}" if everything else " RETURNING attempt"),
                args,
            )
            found = cur.fetchall()  # at most one row (action_id is the key); ends the statement
            if not found:
                return None
            row = dict(zip([d[0] for d in cur.description], found[0], strict=True))
        else:
            if c.execute(sql, args).rowcount != 1:
                return None
            cur = c.execute(READS.find, (m.action_id,))
            row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        if m.kind is not None:
            self.probe(f"before_commit:{m.kind}")
        return row

    @staticmethod
    def _event(  # noqa: PLR0913  (one argument per column of the event row)
        c: sqlite3.Connection,
        action_id: str,
        at: str,
        actor: str,
        kind: EventKind,
        frm: str | None,
        to: str,
        attempt: int,
        detail: Any,
    ) -> None:
        c.execute(
            "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
            " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (action_id, at, actor, str(kind), frm, to, attempt, event_detail_text(detail)),
        )


_CB_COLS = ", ".join(CALLBACK_COLUMNS)
_INSERT = statements.insert("actions", COLUMNS, "action_id", DIALECT)
_DUE = (
    f"{statements.SELECT} WHERE next_check_at IS NOT NULL AND next_check_at <= ?"
    f" AND +status IN ({', '.join('?' * len(DUE_STATUSES))}) ORDER BY next_check_at LIMIT ?"
)


def _prepare_file(path: str, create: bool) -> bool:
    """Refuse what is not a regular file or a new path; create a missing ledger 0600
    (unless ``create`` is false); tighten an existing one to 0600. True when new."""
    p = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise LedgerError(f"{path} is a directory, not a ledger file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise LedgerError(
            f"{path} is not a regular file (a device, FIFO or socket); a ledger must be a "
            "file or a new path"
        )
    if st is None:
        if not create:
            raise LedgerError(
                f"no ledger at {path}; nothing has been recorded there "
                "(check --db, SETTLED_DB or [ledger] path)"
            )
        if not p.parent.exists():
            raise LedgerError(f"cannot create ledger {path}: folder {p.parent} does not exist")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            pass  # another process created it first; validate it below
        except OSError as exc:
            raise LedgerError(f"cannot create ledger {path}: {exc.strerror}") from None
        else:
            os.fchmod(fd, 0o600)
            os.close(fd)
        return True
    _tighten(path, st)
    for side in ("-wal", "-shm"):
        try:
            _tighten(path + side, os.stat(path + side))
        except OSError:
            pass
    # The header is read through SQLite (``_check_identity``), never with open():
    # closing any descriptor of the file would drop the POSIX locks that another
    # connection of this process holds on it, mid-write (SQLite's "How To Corrupt", 2.2).
    return st.st_size == 0


def _tighten(path: str, st: os.stat_result) -> None:
    """A ledger readable by others leaks every action's params: make it 0600 when it
    is ours (group/other bits off); leave someone else's file as it is."""
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o600)
        except OSError:
            pass


def _map(exc: sqlite3.Error, path: str, doing: str) -> LedgerError:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = " ".join(str(exc).split())
    if _is_busy(exc):
        return LedgerBusy(f"ledger {path} is locked by another writer; {doing} did not happen")
    if name == "SQLITE_FULL" or "disk is full" in text:
        return LedgerFull(f"ledger {path}: the disk is full; {doing} did not happen ({text})")
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return LedgerReadOnly(
            f"ledger {path} cannot be written (read-only file, folder or mount); "
            f"{doing} did not happen"
        )
    if name.startswith("SQLITE_CANTOPEN") or name.startswith("SQLITE_IOERR"):
        return LedgerError(
            f"ledger {path}: cannot read or write the file ({text}); {doing} did not happen"
        )
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or (
        isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text)
    ):
        return LedgerError(f"{path} is unreadable or corrupt: {text}")
    return LedgerError(f"ledger {path}: {text} ({doing})")


__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteLedger"]
