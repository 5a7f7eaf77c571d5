"""What the PostgreSQL ledger takes from its driver (psycopg): connections set up as
the ledger needs them, values as the database holds them, and every psycopg error
mapped into ``settled.errors`` (``map_error``: the one place), with any password of
the location scrubbed from its message; and COPY, which loads a ledger's history in
bulk (``copy_history``, ``copy_callbacks``: ``settled migrate-ledger``).

Every connection runs with ``TimeZone=UTC``, ISO dates and a ``lock_timeout`` of the
ledger's ``busy_timeout``; a ``timestamptz`` is read back as the contract's text
(``YYYY-MM-DDTHH:MM:SS.ffffffZ``), so records and JSON are the same byte for byte as
SQLite's. One connection is opened directly, when the ledger opens (so a wrong password
or a missing database is reported at once, with its reason), and reused while one thread
at a time uses the ledger; threads that use it at the same time get connections of their
own from a ``psycopg_pool`` pool, so that one ledger object holds at most
``PostgresSettings.pool_max`` connections (``pool_min`` of them kept open); a thread
that finds them all in use waits up to ``busy_timeout`` for one, then ``LedgerBusy``.
A connection that sat unused for ``IDLE_CHECK`` seconds is checked before it is used
(the server may have restarted meanwhile), and one left in the middle of a command by
an interrupt is dropped: where its protocol stands is unknown.

Through PgBouncer in transaction mode (``pgbouncer``), a server connection belongs to
the client for one transaction only, so nothing is set for a session: no session
``SET`` (the settings are ``SET LOCAL`` at the start of every transaction the ledger
opens, ``transaction_settings``; a read outside one reads ``timestamptz`` in whatever
zone the server connection has, converted to UTC by the loader) and no server-side
prepared statements (``prepare_threshold=None``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import LedgerBusy, LedgerError, LedgerFull, LedgerMoved, LedgerReadOnly, MissingExtra
from .columns import CALLBACK_COLUMNS, COLUMNS, EVENT_COLUMNS, to_row
from .ledger import History, moved_message
from .location import scrub
from .sql import event_row

NO_DRIVER = "a postgresql:// ledger needs the PostgreSQL driver: pip install 'settled[postgres]'"
try:
    import psycopg
    from psycopg.adapt import Loader
except ImportError:  # pragma: no cover - exercised in a subprocess by the tests
    raise MissingExtra(NO_DRIVER) from None

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    Conn = psycopg.Connection[tuple[Any, ...]]
    Cursor = psycopg.Cursor[tuple[Any, ...]]

# The pool logs failed background connects itself; the ledger reports them as errors.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

IDLE_CHECK = 10.0  # s a connection may sit unused before it is checked before use


def clean(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: a provider's stray NUL byte is stored as U+FFFD
    rather than losing the write it came with."""
    if type(value) is str and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


class _UtcText(Loader):
    """``timestamptz`` (sent as ISO text in UTC by every connection of the ledger) read
    as the contract's text: ``2026-01-01 00:00:00.5+00`` → ``2026-01-01T00:00:00.500000Z``."""

    def load(self, data: Any) -> str:
        s = bytes(data).decode("ascii")
        if len(s) >= 22 and s[10] == " " and s.endswith("+00") and s[4] == "-":
            frac = s[20:-3] if s[19] == "." else ""
            return f"{s[:10]}T{s[11:19]}.{frac:0<6}Z"
        return _in_utc(s)


def _in_utc(s: str) -> str:
    """An ISO ``timestamptz`` in another zone (a pooled server connection's, through
    PgBouncer, where no session setting holds) as the contract's UTC text."""
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(s) if len(s) >= 22 and s[10] == " " else None
    except ValueError:
        when = None
    if when is not None and when.utcoffset() is not None:
        return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raise psycopg.DataError(f"unexpected timestamp from the database: {s!r}")


class Connections:
    """The connections of one ledger: ``connection()`` lends one to the calling thread.

    ``pool_max`` is the most it holds at once: the ledger's own connection and
    ``pool_max - 1`` more for threads that use the ledger while another has it;
    ``pool_min`` are kept open (the first from the opening on)."""

    def __init__(
        self,
        conninfo: str,
        timeout: float,
        location: str,
        *,
        pool_min: int = 1,
        pool_max: int = 2,
        pgbouncer: bool = False,
    ) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        self.location = location
        self.pool_min = max(1, pool_min)
        self.pool_max = max(self.pool_min, pool_max)
        self.pgbouncer = pgbouncer
        self.main: Conn | None = None
        self._main_lock = threading.Lock()
        self._main_used = 0.0
        self._pool: ConnectionPool[Any] | None = None
        self._pool_lock = threading.Lock()
        self._closed = False
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
        self.extra: dict[str, Any] = {}
        if "connect_timeout" not in given:
            self.extra["connect_timeout"] = max(2, round(timeout))
        if "application_name" not in given:
            self.extra["application_name"] = "settled"
        if pgbouncer:
            # A statement prepared on one server connection is unknown on the next.
            self.extra["prepare_threshold"] = None
        ms = max(1, round(timeout * 1000))
        self._settings = (
            f"lock_timeout = {ms}",
            "idle_in_transaction_session_timeout = 300000",
            "TIME ZONE 'UTC'",
            "datestyle = 'ISO, YMD'",
        )
        # What every transaction sets first through PgBouncer (empty without it: the
        # session has them).
        self.transaction_settings = (
            "; ".join(f"SET LOCAL {one}" for one in self._settings) if pgbouncer else ""
        )

    def open(self) -> Conn:
        """The first connection, made now: its error, if any, is the opening's."""
        self.main = self._new()
        self._main_used = time.monotonic()
        if self.pool_min > 1:
            self._overflow()  # the rest of pool_min, made in the background
        return self.main

    def configure(self, conn: Conn) -> None:
        conn.adapters.register_loader("timestamptz", _UtcText)
        if self.pgbouncer:
            style = conn.info.parameter_status("DateStyle") or ""
            if not style.startswith("ISO"):
                raise LedgerError(
                    f"ledger {self.location}: the server's DateStyle is "
                    f"{style!r}; through PgBouncer settled needs "
                    "ISO (the default): ALTER DATABASE ... SET datestyle = 'ISO, YMD'"
                )
            return  # nothing is set for the session: it would outlive the transaction
        conn.execute("; ".join(f"SET {one}" for one in self._settings))

    def _new(self) -> Conn:
        conn: Conn = psycopg.connect(self.conninfo, autocommit=True, **self.extra)
        try:
            self.configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def broken(self) -> bool:
        """Whether the ledger's own connection is gone (the server restarted)."""
        return self.main is not None and (self.main.closed or self.main.broken)

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        """The ledger's connection, or one from the pool while another thread has it
        (with ``pool_max`` 1: the ledger's, once the other thread is done with it)."""
        if self._closed:
            raise LedgerError(f"ledger {self.location}: cannot operate on a closed database")
        got = self._main_lock.acquire(blocking=False)
        if not got and self.pool_max == 1:
            got = self._main_lock.acquire(timeout=max(self.timeout, 0.001))
            if not got:
                raise self._exhausted()
        if got:
            try:
                yield self._ready_main()
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    # Interrupted mid-command (Ctrl-C, or SIGTERM taken as Ctrl-C during
                    # --wait): the connection is dropped (its open transaction rolls
                    # back) and the next use makes one.
                    self._drop_main()
                raise
            finally:
                self._main_used = time.monotonic()
                self._main_lock.release()
            return
        from psycopg_pool import PoolTimeout

        lent = False
        try:
            with self._overflow().connection() as conn:
                lent = True
                yield conn
        except PoolTimeout:
            if lent:
                raise
            raise self._exhausted() from None

    def _exhausted(self) -> LedgerBusy:
        return LedgerBusy(
            f"ledger {self.location}: all {self.pool_max} connections of [postgres] "
            f"pool_max are in use (waited {self.timeout:g} s)"
        )

    def _drop_main(self) -> None:
        conn, self.main = self.main, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: S110 - closing a connection left mid-command: nothing to keep
                pass

    def _ready_main(self) -> Conn:
        conn = self.main
        if conn is not None and not conn.closed and not conn.broken:
            if time.monotonic() - self._main_used < IDLE_CHECK:
                return conn
            try:  # idle for a while: the server may have restarted meanwhile
                conn.execute("")
                return conn
            except psycopg.OperationalError:
                conn.close()
        self.main = None
        self.main = self._new()
        return self.main

    def _overflow(self) -> ConnectionPool[Any]:
        with self._pool_lock:
            if self._pool is None:
                # Imported here, on first need: most ledgers are used by one thread.
                from psycopg_pool import ConnectionPool

                self._pool = ConnectionPool(
                    self.conninfo,
                    kwargs={"autocommit": True, **self.extra},
                    min_size=self.pool_min - 1,
                    max_size=self.pool_max - 1,
                    configure=self.configure,
                    timeout=max(self.timeout, 0.001),
                    name="settled",
                    open=True,
                )
            return self._pool

    def close(self) -> None:
        self._closed = True
        if self.main is not None:
            self.main.close()
            self.main = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None


_BUSY = {"40001", "40P01", "57014", "53300"}
_READ_ONLY = {"25006", "42501"}


@contextmanager
def mapped(location: str, doing: str, secrets: Sequence[str], waited: float) -> Iterator[None]:
    """The one place ``psycopg`` errors become settled's (``map_error``)."""
    try:
        yield
    except psycopg.Error as exc:
        raise map_error(exc, location, doing, secrets, waited) from None


def map_error(
    exc: psycopg.Error, location: str, doing: str, secrets: Sequence[str], waited: float
) -> LedgerError:
    """``exc`` as settled's error: what it means for ``doing`` (``waited``: the lock
    timeout), ``secrets`` scrubbed from its text."""
    state = exc.sqlstate or ""
    text = scrub(" ".join(str(exc).split()), secrets)
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


# -- COPY ------------------------------------------------------------------------------------


def copy_history(cur: Cursor, history: Iterable[History]) -> int:
    """COPY records and their events in chunks of 1,000, then move the events' sequence
    past the copied ids (``SqlLedger._copy_in``): how many records were copied."""
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


def copy_callbacks(cur: Cursor, rows: Iterable[Sequence[Any]]) -> None:
    with cur.copy(f"COPY callbacks ({', '.join(CALLBACK_COLUMNS)}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(tuple(clean(v) for v in row))


def _copy_chunk(cur: Cursor, chunk: Sequence[History]) -> int:
    """COPY records, then their events: the events' ids are written as given (COPY
    into an identity column keeps them, like OVERRIDING SYSTEM VALUE)."""
    if not chunk:
        return 0
    with cur.copy(f"COPY actions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
        for rec, _ in chunk:
            copy.write_row([clean(v) for v in to_row(rec).values()])
    with cur.copy(f"COPY events ({', '.join(EVENT_COLUMNS)}) FROM STDIN") as copy:
        for _, log in chunk:
            for e in log:
                copy.write_row(event_row(e, clean))
    return len(chunk)


__all__ = ["IDLE_CHECK", "NO_DRIVER", "Connections", "clean", "map_error", "mapped"]
