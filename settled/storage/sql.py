"""The ledger's operations, written once for both SQL backends (rule 21): each runs
the named statements of ``statements``, ``query`` and ``audit_sql`` through a few
primitives its backend supplies, as dbos writes its system database once and lets
its SQLite subclass override only what SQLite does otherwise.

A backend supplies its statements, rendered once in its dialect (``DIALECT``,
``READS``, ``WRITES``, ``BY_NAME``), and these primitives:

    _steps(), _migrate(on_step) its schema's steps, and applying the missing ones
    _all(sql, args)             one read on its own: the rows
    _snapshot(doing, read)      ``read(run)`` in one read snapshot, ``run(sql, args)``
                                giving the rows (SQLite: BEGIN … COMMIT, retried whole
                                while the file is busy; PostgreSQL: REPEATABLE READ,
                                READ ONLY)
    _holding(doing, how)        one transaction that ``rows`` reads through: a read
                                snapshot, a write, or the whole ledger held still
    _write(doing, one=False)    one write transaction, yielding its handle (SQLite: the
                                connection under BEGIN IMMEDIATE; PostgreSQL: a cursor);
                                ``one``: the block writes with ONE statement, which
                                PostgreSQL runs as its own transaction (autocommit)
    _fetch(h, sql, args)        a read inside that transaction: the rows
    _execute(h, sql, args)      a write inside it: how many rows it changed
    _execute_each(h, sql, rows) one write for each row of arguments
    _insert_row(h, rec, actor)  the new row and its ``recorded`` event (False: the id
                                is taken)
    _apply(h, move, everything) one guarded move with its event: the row, or None
    _due(h, cutoff, size)       the due scan (SQLite's index hint, PostgreSQL's
                                ``FOR UPDATE SKIP LOCKED``)
    _lease(h, leased, owner, until), _mark_moved(h, to, at)
    _copy_in(h, history), _copy_callbacks(h, rows)   a copied ledger's rows (``restore``)

A backend may also override what its database does better: ``_apply_all`` and
``_claim_new`` (PostgreSQL: one pipeline), ``_lock_values`` (PostgreSQL's advisory
locks; SQLite's write transaction holds the whole file), ``_worth_matching`` (SQLite
reads before it takes the write lock) and ``_storable`` (PostgreSQL text holds no
NUL). Everything else a backend keeps is its own: connections and transactions, error
mapping, the clock, the schema and its migrations, and the statements that are truly
its dialect's.

This module is a layer between ``base`` (the interface, which ``statements`` imports)
and the backends: an operation that runs statements cannot live in ``base`` without
a circle.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, TypeVar

from ..clock import to_text
from ..errors import LedgerError
from ..model import ActionRecord, Callback, Event, PendingCallback
from . import query, statements
from .base import (
    CALLBACK_COLUMNS,
    COLUMNS,
    CallbackFigures,
    Decide,
    DueBatch,
    Expire,
    Figures,
    History,
    Ledger,
    Move,
    Selection,
    Stats,
    Still,
    Sweep,
    Taken,
    callback_row,
    fold_stats,
    from_row,
    pending_from_row,
    retry_pending_at,
    same_action,
    sort_due,
)

DEFAULT_BUSY_TIMEOUT = 10.0  # s a writer waits for another one's lock
H = TypeVar("H")  # a backend's handle on its open write transaction
T = TypeVar("T")
Row = tuple[Any, ...]
Run = Callable[[str, Sequence[Any]], list[Row]]  # a read inside a snapshot: the rows
# What a transaction that ``rows`` reads through is for (``SqlLedger._holding``): a
# read snapshot (``verify``), a write (``restore``), or the ledger held still.
Hold = Literal["read", "write", "still"]


def busy_timeout_from_env() -> float:
    """``SETTLED_BUSY_TIMEOUT`` in seconds, or ``DEFAULT_BUSY_TIMEOUT``."""
    raw = os.environ.get("SETTLED_BUSY_TIMEOUT")
    if not raw:
        return DEFAULT_BUSY_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise LedgerError(f"SETTLED_BUSY_TIMEOUT={raw!r} is not a number of seconds") from None
    return max(0.0, value)


def newer_message(where: str, found: int, latest: int) -> str:
    """The refusal of a ledger a newer settled migrated: what this one is, and writes."""
    from .. import __version__

    return (
        f"{where} was written by a newer settled (schema {found}; settled {__version__} "
        f"writes schema {latest}): upgrade settled (`settled --version` on the newer one "
        "names its schema)"
    )


def records_of(rows: Iterable[Sequence[Any]]) -> list[ActionRecord]:
    """Rows of ``statements.SELECT`` (every column, in ``COLUMNS`` order) as records.
    A row that cannot be read as one (a column edited by hand, a damaged file) raises
    ``Damaged`` naming it, as ``settled verify`` does, never a decoder's error."""
    records = []
    for r in rows:
        values = dict(zip(COLUMNS, r, strict=True))
        try:
            records.append(from_row(values))
        except (KeyError, TypeError, ValueError) as exc:
            from .truth import Damaged

            raise Damaged(
                f"the ledger is damaged: actions row action_id {values.get('action_id')!r} "
                f"cannot be read ({type(exc).__name__}: {exc}); `settled verify` names "
                "every damaged row"
            ) from None
    return records


def callbacks_of(rows: Iterable[Sequence[Any]]) -> list[PendingCallback]:
    """Rows of ``CALLBACK_COLUMNS`` as the kept callbacks they are."""
    return [pending_from_row(dict(zip(CALLBACK_COLUMNS, r, strict=True))) for r in rows]


class SqlLedger(Ledger, Generic[H]):
    """A ``Ledger`` whose every operation is one of the shared statements run through
    its backend's primitives (see the module's docstring)."""

    DIALECT: ClassVar[query.Dialect]
    READS: ClassVar[statements.Reads]
    WRITES: ClassVar[statements.Writes]
    BY_NAME: ClassVar[dict[str, str]]  # ``statements.named_records(WRITES)``

    # -- the primitives ------------------------------------------------------------------

    @abstractmethod
    def _steps(self) -> Sequence[tuple[str, Any]]:
        """This backend's schema steps, in order: (name, what it does)."""

    @abstractmethod
    def _migrate(self, on_step: Callable[[int, str], None]) -> None:
        """Apply every pending step, each in its own transaction, calling ``on_step``
        with each step's number and name once it is committed."""

    @abstractmethod
    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """One read on its own (its own snapshot): every row."""

    @abstractmethod
    def _snapshot(self, doing: str, read: Callable[[Run], T]) -> T:
        """``read(run)`` inside one read-only snapshot: every ``run`` sees the same
        ledger. A callable, not a block: SQLite runs it again while the file is busy."""

    @abstractmethod
    def _write(self, doing: str, *, one: bool = False) -> AbstractContextManager[H]:
        """One write transaction, committed when the block ends and rolled back on an
        error, yielding the handle the other primitives take. ``one``: the block writes
        with one statement (reads may follow), which a backend may commit on its own."""

    @abstractmethod
    def _holding(self, doing: str, how: Hold) -> AbstractContextManager[H]:
        """One transaction whose rows ``rows`` reads (``Ledger.rows``), committed when
        the block ends: a read snapshot (``read``), a write (``write``), or a write in
        which no other writer can change the ledger until it ends (``still``)."""

    @abstractmethod
    def _copy_in(self, h: H, history: Iterable[History]) -> int:
        """Records and their events exactly as they were, inside ``h``: how many."""

    @abstractmethod
    def _copy_callbacks(self, h: H, rows: Iterable[Sequence[Any]]) -> None:
        """Kept callbacks' rows (``truth.CALLBACK_TABLE_COLUMNS``) as they were."""

    @abstractmethod
    def _fetch(self, h: H, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """A read inside the transaction ``h``: every row."""

    @abstractmethod
    def _execute(self, h: H, sql: str, args: Sequence[Any] = ()) -> int:
        """A write inside the transaction ``h``: how many rows it changed."""

    @abstractmethod
    def _execute_each(self, h: H, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """``sql`` once for each row of arguments, inside the transaction ``h``."""

    @abstractmethod
    def _insert_row(self, h: H, rec: ActionRecord, actor: str) -> bool:
        """The new row and its ``recorded`` event, unless the id is taken (False)."""

    @abstractmethod
    def _apply(self, h: H, m: Move, *, everything: bool) -> dict[str, Any] | None:
        """One guarded move with its event inside the transaction ``h``: the row (all
        columns when ``everything``, else just its attempt), or None when the guard did
        not hold."""

    @abstractmethod
    def _due(self, h: H, cutoff: str, size: int) -> list[ActionRecord]:
        """Up to ``size`` records due at ``cutoff``, oldest due first, that no other
        due scan holds, held for this transaction."""

    @abstractmethod
    def _lease(self, h: H, leased: Sequence[ActionRecord], owner: str, until: str) -> None:
        """Lease each of ``leased`` to ``owner`` until ``until``."""

    @abstractmethod
    def _mark_moved(self, h: H, to: str, at: str) -> None:
        """The row that says the ledger moved to ``to`` at ``at``."""

    # -- what a backend may do better ----------------------------------------------------

    def _apply_all(self, h: H, moves: Sequence[Move]) -> list[bool]:
        """Several guarded moves in the transaction ``h``; whether each guard held."""
        return [self._apply(h, m, everything=False) is not None for m in moves]

    def _claim_new(
        self, h: H, pairs: Sequence[tuple[ActionRecord, Move]], actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        """``record_and_claim`` for each pair, inside the transaction ``h``."""
        out: list[tuple[ActionRecord, bool]] = []
        for rec, claim in pairs:
            existing = self._insert(h, rec, actor, same=False)
            if existing is not None:
                out.append((existing, False))
                continue
            row = self._apply(h, claim, everything=True)
            assert row is not None  # inserted PENDING in this very transaction
            out.append((from_row(row), True))
        return out

    def _lock_values(self, h: H, provider: str, values: Sequence[str]) -> None:
        """Serialise, for the transaction ``h``, with every other transaction that
        keeps or matches a callback naming one of ``values``. Nothing to do where a
        write transaction holds the whole ledger."""

    def _worth_matching(self, rec: ActionRecord) -> bool:
        """Whether ``match_callbacks`` must open its write transaction for ``rec``."""
        return True

    def _storable(self, row: dict[str, Any]) -> dict[str, Any]:
        """A new row's values as the database can hold them."""
        return row

    # -- the schema ----------------------------------------------------------------------

    def pending_steps(self) -> list[tuple[int, str]]:
        now = self.schema_version()
        return [(n, name) for n, (name, _) in enumerate(self._steps(), 1) if n > now]

    def migrate(self, announce: Callable[[int, str], None] | None = None) -> list[tuple[int, str]]:
        applied: list[tuple[int, str]] = []

        def done(number: int, name: str) -> None:
            applied.append((number, name))
            if announce is not None:
                announce(number, name)

        self._migrate(done)
        self.schema = self.schema_version()
        return applied

    # -- inside a transaction ------------------------------------------------------------

    def _find_in(self, h: H, action_id: str) -> ActionRecord | None:
        found = records_of(self._fetch(h, self.READS.find, (action_id,)))
        return found[0] if found else None

    def _still_in(self, h: H) -> Still:
        """This ledger held still in the transaction ``h`` (what ``still`` yields)."""
        return HeldStill(
            self.location,
            self.rows,
            lambda now: int(self._fetch(h, self.READS.live_leases, (now,))[0][0]),
            lambda to, at: self._mark_moved(h, to, at),
        )

    def _insert(
        self, h: H, rec: ActionRecord, actor: str, *, same: bool = True
    ) -> ActionRecord | None:
        """The new PENDING row and its ``recorded`` event. Returns None when it
        inserted, else the record already under that id (``Conflict`` when it is
        another action, unless ``same`` is false: the caller compares)."""
        if self._insert_row(h, rec, actor):
            return None
        found = self._find_in(h, rec.action_id)
        assert found is not None
        if same:
            same_action(found, rec)
        return found

    # -- reads ---------------------------------------------------------------------------

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[ActionRecord]:
        return records_of(self._all(sql, args))

    def find(self, action_id: str) -> ActionRecord | None:
        found = self._rows(self.READS.find, (action_id,))
        return found[0] if found else None

    def events(self, action_id: str) -> list[Event]:
        return [statements.event_from_row(r) for r in self._all(self.READS.events, (action_id,))]

    def records(self, selection: Selection | None = None) -> list[ActionRecord]:
        sel = selection or Selection()
        d = self.DIALECT
        w = query.where(sel, d)
        cut, more = query.limit(sel, d)
        return self._rows(f"{statements.SELECT}{w.sql}{query.order_by(sel, d)}{cut}", w.args + more)

    def count(self, selection: Selection | None = None) -> int:
        w = query.where(selection or Selection(), self.DIALECT)
        return int(self._all(f"SELECT count(*) FROM actions{w.sql}", w.args)[0][0])

    def stats(
        self, selection: Selection | None = None, *, now: str, by: str | None = None
    ) -> Stats:
        todo = query.stats_statements(selection or Selection(), self.DIALECT, now, by)
        rows = self._snapshot(
            "read the figures", lambda run: {k: run(sql, args) for k, (sql, args) in todo.items()}
        )
        return fold_stats(rows["totals"][0], rows["cells"], rows["ages"], rows.get("ages_by"))

    def ids(self, prefix: str = "", limit: int = 200) -> list[str]:
        # action_id sorts by code point on both (PostgreSQL's COLLATE "C"): the range
        # on the key is exactly "starts with"
        return [str(r[0]) for r in self._all(self.READS.ids, statements.ids_args(prefix, limit))]

    def names(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._all(self.READS.names)]

    def status_counts(self) -> dict[tuple[str, str], int]:
        return {(r[0], r[1]): int(r[2]) for r in self._all(self.READS.status_counts)}

    def check_failures(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in self._all(self.READS.check_failures)}

    def rivals(self, rec: ActionRecord, limit: int = 5) -> list[str]:
        return [r[0] for r in self._all(self.READS.rivals, statements.rivals_args(rec, limit))]

    def figures(self) -> dict[tuple[str, str], Figures]:
        from . import audit_sql

        return self._snapshot(
            "read the audit's figures", lambda run: audit_sql.figures(run, self.DIALECT)
        )

    def export(self, *, after: str | None = None, limit: int = 500) -> list[History]:
        def page(run: Run) -> tuple[list[ActionRecord], list[Row]]:
            records = records_of(run(self.READS.page, (after or "", limit)))
            if not records:
                return records, []
            ends = (records[0].action_id, records[-1].action_id)
            return records, run(self.READS.page_events, ends)

        records, rows = self._snapshot("read a page of the ledger", page)
        return statements.pages(records, rows)

    # -- writes --------------------------------------------------------------------------

    def record(self, rec: ActionRecord, *, actor: str) -> tuple[ActionRecord, bool]:
        with self._write("record", one=True) as h:
            existing = self._insert(h, rec, actor)
        if existing is not None:
            return existing, False
        return rec, True

    def record_and_claim(
        self, rec: ActionRecord, *, actor: str, claim: Move
    ) -> tuple[ActionRecord, bool]:
        with self._write("record and claim") as h:
            existing = self._insert(h, rec, actor)  # Conflict: rolled back
            if existing is not None:
                return existing, False
            row = self._apply(h, claim, everything=True)
            assert row is not None  # inserted PENDING in this very transaction
        return from_row(row), True

    def record_and_claim_many(
        self, pairs: Sequence[tuple[ActionRecord, Move]], *, actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        if not pairs:
            return []
        with self._write("record and claim a group") as h:
            return self._claim_new(h, pairs, actor)

    def move(self, move: Move) -> ActionRecord | None:
        with self._write(f"record {move.kind or 'a schedule'}", one=True) as h:
            row = self._apply(h, move, everything=True)
        return from_row(row) if row is not None else None

    def commit(self, moves: Sequence[Move]) -> list[bool]:
        if not moves:
            return []
        with self._write("commit results") as h:
            return self._apply_all(h, moves)

    def claim_retries(self, pairs: Sequence[tuple[Move, Move]]) -> list[ActionRecord | None]:
        out: list[ActionRecord | None] = []
        if not pairs:
            return out
        with self._write("reopen and claim a group") as h:
            for reopen, claim in pairs:
                if self._apply(h, reopen, everything=False) is None:
                    out.append(None)
                    continue
                row = self._apply(h, claim, everything=True)
                assert row is not None  # reopened PENDING in this very transaction
                out.append(from_row(row))
        return out

    def lease_due(
        self,
        *,
        now: datetime,
        cutoff: str,
        size: int,
        owner: str,
        until: str,
        expire: Expire,
        pending: Sequence[Move] = (),
    ) -> DueBatch:
        batch = DueBatch()
        with self._write("lease a due batch") as h:
            batch.committed = self._apply_all(h, pending)
            rows = self._due(h, cutoff, size)
            batch.selected = len(rows)
            running, lapsed, batch.leased = sort_due(rows, now, owner)
            self._execute_each(
                h, self.WRITES.due_at, [(rec.lease_expires_at, rec.action_id) for rec in running]
            )
            for rec in lapsed:
                m = expire(rec)
                if self._apply(h, m, everything=False) is not None:
                    batch.expired.append((rec, m))
            if batch.leased:
                self._lease(h, batch.leased, owner, until)
        return batch

    def lease_one(self, rec: ActionRecord, *, owner: str, until: str, now: str) -> bool:
        args = (owner, until, rec.action_id, str(rec.status), now)
        with self._write("lease a record", one=True) as h:
            return self._execute(h, self.WRITES.lease_one, args) == 1

    # -- the whole ledger ----------------------------------------------------------------

    @contextmanager
    def still(self) -> Iterator[Still]:
        with self._holding("hold the ledger still", "still") as h:
            yield self._still_in(h)

    def verify(self, on_record: Callable[[int], None] | None = None) -> Any:
        """``Ledger.verify`` from one snapshot: every row read in one read transaction."""
        from . import truth

        with self._holding("verify the ledger", "read"):
            return truth.verify(self, on_record)

    def restore(
        self,
        history: Iterable[History],
        *,
        callbacks: Iterable[Sequence[Any]] = (),
        check: Callable[[Any], None] | None = None,
    ) -> int:
        with self._holding("restore a copied ledger", "write") as h:
            n = self._copy_in(h, history)
            self._copy_callbacks(h, callbacks)
            if check is not None:
                check(self)  # reads this transaction's rows: an error rolls it all back
        return n

    # -- callbacks -----------------------------------------------------------------------

    def take_callback(
        self, cb: Callback, decide: Decide, *, now: datetime
    ) -> tuple[Taken, Move | None]:
        row = self._storable(callback_row(cb))
        row["next_check_at"] = retry_pending_at(now, 0)
        sql = statements.insert("callbacks", list(row), "provider, event_id", self.DIALECT)
        with self._write("record a callback") as h:
            self._lock_values(h, cb.provider, [cb.key])
            if self._execute(h, sql, list(row.values())) != 1:
                return Taken.DUPLICATE, None
            return self._settle_callback(h, PendingCallback(cb), decide, now)

    def match_callbacks(self, rec: ActionRecord, decide: Decide, *, now: datetime) -> list[Move]:
        moves: list[Move] = []
        if not self._worth_matching(rec):
            return moves
        values = {v for v in (rec.action_id, rec.reconciliation_key, rec.provider_object_id) if v}
        with self._write("match callbacks") as h:
            self._lock_values(h, rec.provider, sorted(values))
            found = self._fetch(h, self.READS.pending_for, statements.pending_args(rec))
            for pending in callbacks_of(found):
                _, move = self._settle_callback(h, pending, decide, now)
                if move is not None:
                    moves.append(move)
        return moves

    def callback_figures(self) -> dict[str, CallbackFigures]:
        return statements.callback_figures(self._all(self.READS.callback_figures))

    def pending_callbacks(self, rec: ActionRecord) -> int:
        return int(self._all(self.READS.pending_count, statements.pending_args(rec))[0][0])

    def _settle_callback(
        self, h: H, pending: PendingCallback, decide: Decide, now: datetime
    ) -> tuple[Taken, Move | None]:
        """Apply one kept callback to the record it names, inside the caller's
        transaction (the record's row locked where rows are), or leave it pending
        (bound to its record while that is in flight)."""
        cb = pending.callback
        key = (cb.provider, cb.event_id)
        if pending.action_id is not None:
            found = records_of(self._fetch(h, self.WRITES.bound_record, (pending.action_id,)))
        else:
            found = records_of(self._fetch(h, self.BY_NAME[cb.names], (cb.provider, cb.key)))
        if len(found) != 1:
            return (Taken.AMBIGUOUS if found else Taken.PENDING), None
        rec = found[0]
        move = decide(pending, rec, now)
        if move is None or self._apply(h, move, everything=False) is None:
            attempt = pending.attempt or rec.attempt
            self._execute(h, self.WRITES.callback_bound, (rec.action_id, attempt, *key))
            return Taken.PENDING, None
        attempt = rec.attempt if pending.attempt is None else pending.attempt
        self._execute(h, self.WRITES.callback_matched, (rec.action_id, attempt, to_text(now), *key))
        return Taken.MATCHED, move

    def _sweep_one(
        self, h: H, pending: PendingCallback, decide: Decide, now: datetime, at: str, sweep: Sweep
    ) -> None:
        """One pending callback of a sweep at ``now`` (``at``, as text), inside the
        caller's transaction: expired once past its ``expires_at``, else matched where
        it now can be, else tried again later."""
        sweep.examined += 1
        key = (pending.callback.provider, pending.callback.event_id)
        if pending.callback.expires_at <= at:
            self._execute(h, self.WRITES.callback_expired, key)
            sweep.expired += 1
            return
        _, move = self._settle_callback(h, pending, decide, now)
        if move is not None:
            sweep.matched.append((pending, move))
        else:
            retry = retry_pending_at(now, pending.tries + 1)
            self._execute(h, self.WRITES.callback_retry, (retry, *key))


@dataclass
class HeldStill(Still):
    """A SQL ledger inside the transaction that holds it still (``Ledger.still``):
    its rows, and the statements of that transaction (``SqlLedger._still_in``)."""

    location: str
    read: Callable[[str, str], Iterator[Row]]  # ``Ledger.rows``
    count_live: Callable[[str], int]
    mark: Callable[[str, str], None]

    def rows(self, table: str, order: str = "") -> Iterator[Row]:
        return self.read(table, order)

    def live_leases(self, now: str) -> int:
        return self.count_live(now)

    def mark_moved(self, to: str, at: str) -> None:
        self.mark(to, at)


__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "HeldStill",
    "Run",
    "SqlLedger",
    "busy_timeout_from_env",
    "callbacks_of",
    "newer_message",
    "records_of",
]
