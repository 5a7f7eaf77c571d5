"""The action ledger: one SQLite file, WAL, ``synchronous=FULL``.

Durability is chosen on purpose. A claim (``PENDING → IN_FLIGHT``) that is lost after
its request has left the machine means the next caller sees ``PENDING`` and sends the
action a second time. WAL with ``synchronous=NORMAL`` survives a process crash but may
lose the last commits on power loss or an OS crash; ``FULL`` fsyncs the WAL on every
commit so a committed claim survives both. It costs about 3.7× in commit rate on the
machines we measured (≈5,000 against ≈18,500 claim+event transactions/s), which is
still far above what any provider API accepts.

The hot path (claim, transition, reads) is raw, guarded SQL through ``sqlite3``; the
schema is created and migrated through sqlite-utils in ``settled.migrations``, which is
only imported when a ledger needs migrating.

Writers take the lock with ``BEGIN IMMEDIATE`` retried in the application after a
short random sleep, bounded by ``busy_timeout`` seconds: fairer than SQLite's own busy
handler (no writer starves for seconds) and never an unbounded wait. A lock that stays
taken past the bound raises ``LedgerBusy``; it is never reported as an action outcome.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import faults
from .errors import Conflict, LedgerBusy, LedgerError, NotFound
from .model import ActionRecord, Event, Status, check_transition

APPLICATION_ID = 0x53544C44  # "STLD": marks a file as a settled ledger
SCHEMA_VERSION = 3  # == settled.migrations.LATEST (checked by a test)
DEFAULT_BUSY_TIMEOUT = 10.0
SQLITE_HEADER = b"SQLite format 3\x00"
HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)  # UPDATE … RETURNING

# Columns a transition may set. Names never come from user input, and this list
# keeps it that way.
WRITABLE = frozenset(
    {
        "status",
        "delivery",
        "acceptance",
        "attempt",
        "idempotency_key",
        "reconciliation_key",
        "eligible_at",
        "dispatch_id",
        "provider_object_id",
        "dispatched_at",
        "confirmed_at",
        "confirmed_by",
        "lease_owner",
        "lease_expires_at",
        "next_check_at",
        "verify_started_at",
        "verify_deadline_at",
        "checks",
        "reason",
        "snapshot",
    }
)


def same_action(rec: ActionRecord, row: Mapping[str, Any]) -> None:
    """An existing record under ``row``'s id must be the same action, else ``Conflict``."""
    if (
        rec.params_hash != row["params_hash"]
        or rec.provider != row["provider"]
        or rec.operation != row["operation"]
    ):
        raise Conflict(
            f"action {rec.action_id} already exists with different "
            f"{'params' if rec.params_hash != row['params_hash'] else 'provider/operation'}"
            "; use another --action-id"
        )


def _busy_timeout_from_env() -> float:
    raw = os.environ.get("SETTLED_BUSY_TIMEOUT")
    if not raw:
        return DEFAULT_BUSY_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise LedgerError(f"SETTLED_BUSY_TIMEOUT={raw!r} is not a number of seconds") from None
    return max(0.0, value)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc)
    return "locked" in msg or "busy" in msg


class Ledger:
    """The store behind everything. Usable without the CLI::

        with Ledger.open("settled.db") as ledger:
            record = ledger.get("a-1")
    """

    def __init__(self, conn: sqlite3.Connection, path: str, busy_timeout: float) -> None:
        self.conn = conn
        self.path = path
        self.busy_timeout = busy_timeout

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float | None = None,
        create: bool = True,
    ) -> Ledger:
        """Open the ledger at ``path``, creating it (mode 0600) unless ``create`` is
        false: then a missing file is a ``LedgerError`` naming the path."""
        path = os.fspath(path)
        timeout = _busy_timeout_from_env() if busy_timeout is None else busy_timeout
        if path == ":memory:":
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            ledger = cls(conn, path, timeout)
            ledger._setup(new=True)
            return ledger
        p = Path(path)
        new = False
        if p.is_dir():
            raise LedgerError(f"{path} is a directory, not a ledger file")
        if not p.exists():
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
        try:
            with open(path, "rb") as fh:
                head = fh.read(100)
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {path}: {exc.strerror}") from None
        if head and not head.startswith(SQLITE_HEADER):
            raise LedgerError(
                f"{path} is not a settled ledger (not an SQLite database); refusing to write to it"
            )
        new = not head
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {path}: {exc}") from None
        ledger = cls(conn, path, timeout)
        try:
            if not new:
                new = ledger._check_identity()
            ledger._setup(new=new)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise LedgerError(f"{path} is unreadable or corrupt: {exc}") from None
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

    def _setup(self, *, new: bool) -> None:
        c = self.conn
        c.execute("PRAGMA busy_timeout = 0")  # the application retries, fairly and bounded
        if new or self._read_one("PRAGMA journal_mode")[0] != "wal":
            self._retry(lambda: c.execute("PRAGMA journal_mode = WAL"))
        c.execute("PRAGMA synchronous = FULL")
        c.execute("PRAGMA foreign_keys = ON")
        (version,) = self._read_one("PRAGMA user_version")
        if version < SCHEMA_VERSION:
            from . import migrations

            migrations.migrate(c, self._begin_immediate, APPLICATION_ID)
        elif version > SCHEMA_VERSION:
            raise LedgerError(
                f"{self.path} was written by a newer settled (schema {version} > "
                f"{SCHEMA_VERSION}); upgrade settled"
            )

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ locking
    def _retry(self, fn: Any) -> Any:
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
                time.sleep(random.uniform(0.05, 1.0) * pause)
                pause = min(pause * 1.5, 0.02)

    def _begin_immediate(self) -> None:
        self._retry(lambda: self.conn.execute("BEGIN IMMEDIATE"))

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE … COMMIT, or ROLLBACK on error."""
        self._begin_immediate()
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self._retry(lambda: self.conn.execute("COMMIT"))

    def _read_one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self._retry(lambda: self.conn.execute(sql, args).fetchone())

    def _read_all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        rows: list[Any] = self._retry(lambda: self.conn.execute(sql, args).fetchall())
        return rows

    # ------------------------------------------------------------ events
    def _append_event(
        self,
        action_id: str,
        at: str,
        actor: str,
        kind: str,
        frm: str | None,
        to: str,
        attempt: int,
        detail: Mapping[str, Any],
    ) -> None:
        self.conn.execute(
            "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
            " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (action_id, at, actor, kind, frm, to, attempt, json.dumps(detail, default=str)),
        )

    # ------------------------------------------------------------ records
    def record(self, row: Mapping[str, Any], *, actor: str, at: str) -> tuple[ActionRecord, bool]:
        """Insert a new PENDING action (with its first event), or find the existing one.

        Returns ``(record, created)``. An existing id with other params is a conflict.
        """
        with self.write() as c:
            existing = self.insert(c, row, actor=actor, at=at)
            if existing is not None:
                return existing, False
            new = self._get_row(row["action_id"])
        assert new is not None
        return ActionRecord.from_row(new), True

    def insert(
        self, c: sqlite3.Connection, row: Mapping[str, Any], *, actor: str, at: str
    ) -> ActionRecord | None:
        """``record``'s insert inside a write transaction the caller already holds: the
        new PENDING row and its ``recorded`` event. Returns None when it inserted, else
        the record already under that id (``Conflict`` when it is another action)."""
        cols = list(row)
        cur = c.execute(
            f"INSERT INTO actions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            " ON CONFLICT(action_id) DO NOTHING",
            [row[k] for k in cols],
        )
        if cur.rowcount != 1:
            found = self._get_row(row["action_id"])
            assert found is not None
            existing = ActionRecord.from_row(found)
            same_action(existing, row)
            return existing
        self._append_event(
            row["action_id"],
            at,
            actor,
            "recorded",
            None,
            row["status"],
            row["attempt"],
            {
                "tier": row["tier"],
                "reconciliation_key": row["reconciliation_key"],
                "eligible_at": row["eligible_at"],
                "requires_manual_verification": bool(row["requires_manual_verification"]),
            },
        )
        return None

    def _get_row(self, action_id: str) -> dict[str, Any] | None:
        cur = self.conn.execute("SELECT * FROM actions WHERE action_id = ?", (action_id,))
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def find(self, action_id: str) -> ActionRecord | None:
        row = self._retry(lambda: self._get_row(action_id))
        return ActionRecord.from_row(row) if row else None

    def get(self, action_id: str) -> ActionRecord:
        rec = self.find(action_id)
        if rec is None:
            raise NotFound(f"no action {action_id!r} in {self.path}")
        return rec

    def events(self, action_id: str) -> list[Event]:
        rows = self._read_all(
            "SELECT id, action_id, at, actor, kind, from_status, to_status, attempt, detail"
            " FROM events WHERE action_id = ? ORDER BY id",
            (action_id,),
        )
        return [
            Event(
                id=r[0], action_id=r[1], at=r[2], actor=r[3], kind=r[4], from_status=r[5],
                to_status=r[6], attempt=r[7], detail=json.loads(r[8]),
            )
            for r in rows
        ]

    @staticmethod
    def _where(
        statuses: Sequence[str] | None,
        provider: str | None,
        operation: str | None,
        created_before: str | None,
    ) -> tuple[str, list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        if statuses:
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            args.extend(statuses)
        if provider:
            where.append("provider = ?")
            args.append(provider)
        if operation:
            where.append("operation = ?")
            args.append(operation)
        if created_before:
            where.append("created_at < ?")
            args.append(created_before)
        return (" WHERE " + " AND ".join(where)) if where else "", args

    def query(
        self,
        *,
        statuses: Sequence[str] | None = None,
        provider: str | None = None,
        operation: str | None = None,
        created_before: str | None = None,
        limit: int | None = None,
    ) -> list[ActionRecord]:
        """Records filtered by status/provider/operation/age, oldest first. Values are
        bound parameters, never spliced into SQL."""
        where, args = self._where(statuses, provider, operation, created_before)
        sql = "SELECT * FROM actions" + where + " ORDER BY created_at, action_id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))

        def run() -> list[dict[str, Any]]:
            cur = self.conn.execute(sql, args)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

        return [ActionRecord.from_row(r) for r in self._retry(run)]

    def count(
        self,
        *,
        statuses: Sequence[str] | None = None,
        provider: str | None = None,
        operation: str | None = None,
        created_before: str | None = None,
    ) -> int:
        """How many records ``query`` with the same filters would return, unlimited."""
        where, args = self._where(statuses, provider, operation, created_before)
        return int(self._read_one("SELECT count(*) FROM actions" + where, args)[0])

    def ids(self, prefix: str = "", limit: int = 200) -> list[str]:
        """Action ids starting with ``prefix`` (case-sensitive), in id order: shell
        completion. A range on the key, so it reads only what it returns."""
        rows = self._read_all(
            "SELECT action_id FROM actions WHERE action_id >= ? AND action_id < ?"
            " ORDER BY action_id LIMIT ?",
            (prefix, prefix + "\U0010ffff", int(limit)),
        )
        return [str(r[0]) for r in rows]

    def tally(self) -> list[tuple[str, str, str, int]]:
        """``(status, provider, operation, count)`` for every combination present:
        the names a filter may use, and the queue depth a monitor exports."""
        rows = self._read_all(
            "SELECT status, provider, operation, count(*) FROM actions"
            " GROUP BY status, provider, operation ORDER BY provider, operation, status"
        )
        return [(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    # ------------------------------------------------------------ moves
    def transition(
        self,
        action_id: str,
        frm: Status,
        to: Status,
        *,
        actor: str,
        kind: str,
        at: str,
        detail: Mapping[str, Any] | None = None,
        values: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> ActionRecord | None:
        """The one way a record changes status: checks the move against the table,
        applies it only if the record is still in ``frm`` (and still leased to
        ``owner`` when given), and appends the event in the same transaction.
        Returns the new record, or None when the guard did not hold."""
        with self.write() as c:
            return self.apply(
                c, action_id, frm, to, actor=actor, kind=kind, at=at, detail=detail,
                values=values, owner=owner,
            )

    def apply(
        self,
        c: sqlite3.Connection,
        action_id: str,
        frm: Status,
        to: Status,
        *,
        actor: str,
        kind: str,
        at: str,
        detail: Mapping[str, Any] | None = None,
        values: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> ActionRecord | None:
        """``transition`` inside a write transaction the caller already holds."""
        row = self._move(c, action_id, frm, to, actor, kind, at, detail, values, owner,
                         everything=True)
        return ActionRecord.from_row(row) if row is not None else None

    def move(
        self,
        c: sqlite3.Connection,
        action_id: str,
        frm: Status,
        to: Status,
        *,
        actor: str,
        kind: str,
        at: str,
        detail: Mapping[str, Any] | None = None,
        values: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> bool:
        """``apply`` for a caller that does not need the new record (a reconciliation
        pass): the same guarded move and event, without reading the row back. Returns
        whether the guard held."""
        return self._move(c, action_id, frm, to, actor, kind, at, detail, values, owner,
                          everything=False) is not None

    def _move(
        self,
        c: sqlite3.Connection,
        action_id: str,
        frm: Status,
        to: Status,
        actor: str,
        kind: str,
        at: str,
        detail: Mapping[str, Any] | None,
        values: Mapping[str, Any] | None,
        owner: str | None,
        *,
        everything: bool,
    ) -> dict[str, Any] | None:
        check_transition(frm, to)
        values = dict(values or {})
        bad = set(values) - WRITABLE
        if bad:
            raise ValueError(f"not writable: {sorted(bad)}")
        values["status"] = str(to)
        values["updated_at"] = at
        sets = ", ".join(f"{k} = ?" for k in values)
        sql = f"UPDATE actions SET {sets} WHERE action_id = ? AND status = ?"
        args: list[Any] = [*values.values(), action_id, str(frm)]
        if owner is not None:
            sql += " AND lease_owner = ?"
            args.append(owner)
        if HAS_RETURNING:  # the new row in the same statement: no SELECT after the UPDATE
            cur = c.execute(sql + (" RETURNING *" if everything else " RETURNING attempt"), args)
            found = cur.fetchall()  # at most one row (action_id is the key); ends the statement
            if not found:
                return None
            row: dict[str, Any] | None = dict(
                zip([d[0] for d in cur.description], found[0], strict=True)
            )
        else:
            if c.execute(sql, args).rowcount != 1:
                return None
            row = self._get_row(action_id)
        assert row is not None
        self._append_event(
            action_id, at, actor, kind, str(frm), str(to), row["attempt"], detail or {}
        )
        faults.point(f"before_commit:{kind}")
        return row

    def apply_schedule(
        self,
        c: sqlite3.Connection,
        action_id: str,
        *,
        frm: Status,
        owner: str,
        values: Mapping[str, Any],
        at: str,
    ) -> bool:
        """Update scheduling fields of a record this caller holds the lease on, inside a
        write transaction the caller holds, without a status change or an event (a
        check that found nothing new)."""
        values = dict(values)
        bad = set(values) - WRITABLE
        if bad:
            raise ValueError(f"not writable: {sorted(bad)}")
        values["updated_at"] = at
        sets = ", ".join(f"{k} = ?" for k in values)
        cur = c.execute(
            f"UPDATE actions SET {sets} WHERE action_id = ? AND status = ? AND lease_owner = ?",
            [*values.values(), action_id, str(frm), owner],
        )
        return cur.rowcount == 1

    def rivals(self, rec: ActionRecord, limit: int = 5) -> list[str]:
        """Other actions that asked for the same change (same provider, operation and
        params) and may have made it after ``rec``'s snapshot: sent, not proven never
        sent, and not already observed before ``rec`` was dispatched. When an effect is
        attributed by snapshot diff, any of them could explain it."""
        rows = self._read_all(
            "SELECT action_id FROM actions WHERE provider = ? AND operation = ?"
            " AND params_hash = ? AND action_id != ? AND dispatched_at IS NOT NULL"
            " AND NOT (status = 'FAILED' AND delivery = 'FAILED')"
            " AND (confirmed_at IS NULL OR confirmed_at >= ?)"
            " ORDER BY created_at LIMIT ?",
            (rec.provider, rec.operation, rec.params_hash, rec.action_id,
             rec.dispatched_at or "", limit),
        )
        return [r[0] for r in rows]

    def integrity_check(self) -> str:
        return str(self._read_one("PRAGMA integrity_check")[0])
