"""The ledger's operations, written once for both SQL backends (rule 21): each runs
the named statements and the two writes of history of ``statements`` (and the reads of
``query`` and ``audit_sql``) through a few primitives its backend supplies, as dbos
writes its system database once and lets its SQLite subclass override only what
SQLite does otherwise.

A backend supplies its dialect (``DIALECT``, with its statements rendered once:
``READS``, ``WRITES``, ``BY_NAME``), its due scan (``DUE``: SQLite's index hint,
PostgreSQL's ``FOR UPDATE SKIP LOCKED``), the row that marks a moved ledger
(``MARK_MOVED``) and the primitives below: a read, a read snapshot, a write
transaction and the reads and writes inside it, the transaction ``rows`` reads
through, and its schema's steps. Where its database does something better or
otherwise it overrides ``_run_all`` (PostgreSQL: several writes in one pipeline),
``_lock_values`` (PostgreSQL's advisory locks; SQLite's write transaction holds the
whole file), ``_worth_matching`` (SQLite reads before it takes the write lock),
``_store`` (PostgreSQL text holds no NUL), ``SWEEP_ONE_BY_ONE`` (PostgreSQL sweeps
callbacks a transaction each, so that passes on many hosts share them) and
``_copy_in``/``_copy_callbacks`` (PostgreSQL's COPY). Everything else a backend keeps
is its own: connections and transactions, error mapping, the clock, the schema.
"""

from __future__ import annotations

import json
import os
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Generic, Literal, TypeVar

from ..clock import from_text, to_text
from ..errors import Conflict, LedgerBusy, LedgerError, LedgerOutdated, LedgerReadOnly, NotFound
from ..model import ActionRecord, Callback, Event, EventKind, PendingCallback, Status
from . import audit_sql, event_log, query, statements, truth
from .columns import (
    CALLBACK_COLUMNS,
    COLUMNS,
    EVENT_COLUMNS,
    after_move,
    callback_row,
    detail_text,
    event_of,
    from_row,
    from_values,
    pending_of,
    recorded_detail,
    to_row,
)
from .event_log import LogFilter
from .ledger import (
    SETTLED_STATUSES,
    CallbackFigures,
    Damaged,
    Decide,
    DueBatch,
    Erase,
    Expire,
    Figures,
    History,
    Keep,
    Ledger,
    LedgerEvent,
    Move,
    Prunable,
    PruneBatch,
    Selection,
    Stats,
    Still,
    Sweep,
    Taken,
    fold_stats,
    retry_pending_at,
    same_action,
    sort_due,
)
from .statements import NewEvent, Unit, alike, insert_unit, move_unit

_EVENTS = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events"

DEFAULT_BUSY_TIMEOUT = 10.0  # s a writer waits for another one's lock
VERIFY_CHUNK = 500  # records an incremental verify reads at a time (bound parameters)
H = TypeVar("H")  # a backend's handle on its open write transaction
T = TypeVar("T")
Row = tuple[Any, ...]
Run = Callable[[str, Sequence[Any]], list[Row]]  # a read inside a snapshot: the rows
# What a transaction that ``rows`` reads through is for (``SqlLedger._holding``): a
# read snapshot (``verify``), a write (``restore``), or the ledger held still.
Hold = Literal["read", "write", "still"]
# The columns a due scan or a lease may set without a move (``Ledger.move``'s ``record``).
SCHEDULE = ("lease_owner", "next_check_at")


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


def records_of(rows: Iterable[Sequence[Any]]) -> list[ActionRecord]:
    """Rows of ``statements.SELECT`` (every column, in ``COLUMNS`` order) as records.
    A row that cannot be read as one (a column edited by hand, a damaged file) raises
    ``Damaged`` naming it, as ``settled verify`` does, never a decoder's error."""
    records = []
    for r in rows:
        try:
            records.append(from_values(r))
        except (IndexError, TypeError, ValueError) as exc:
            raise Damaged(
                f"the ledger is damaged: actions row action_id {r[0]!r} cannot be read "
                f"({type(exc).__name__}: {exc}); `settled verify` names every damaged row"
            ) from None
    return records


def callbacks_of(rows: Iterable[Sequence[Any]]) -> list[PendingCallback]:
    """Rows of ``columns.PENDING_COLUMNS`` as the kept callbacks they are."""
    return [pending_of(r) for r in rows]


_as_is = statements.as_is  # one function, so that ``store is _as_is`` finds it


def fusable(rec: ActionRecord, claim: Move) -> bool:
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


class SqlLedger(Ledger, Generic[H]):
    """A ``Ledger`` whose every operation is one of the shared statements run through
    its backend's primitives (see the module's docstring)."""

    DIALECT: ClassVar[query.Dialect]
    READS: ClassVar[statements.Reads]
    WRITES: ClassVar[statements.Writes]
    BY_NAME: ClassVar[dict[str, str]]  # ``statements.named_records(WRITES)``
    DUE: ClassVar[str]  # the due scan: (cutoff, size) → every column, oldest due first
    MARK_MOVED: ClassVar[str]  # the row that says the ledger moved: (to, at)
    SWEEP_ONE_BY_ONE: ClassVar[bool] = False  # a transaction per pending callback swept
    COUNTED_SINCE: ClassVar[int]  # the schema step that made the kept counts
    CHECKPOINT_SINCE: ClassVar[int]  # the schema step that made verify's checkpoint
    _store: Callable[[Any], Any] = staticmethod(_as_is)  # a bound text as it can be held

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
    def _fetch(self, h: H, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """A read inside the transaction ``h``: every row."""

    @abstractmethod
    def _execute(self, h: H, sql: str, args: Sequence[Any] = ()) -> int:
        """A write inside the transaction ``h``: how many rows it changed."""

    @abstractmethod
    def _execute_each(self, h: H, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """``sql`` once for each row of arguments, inside the transaction ``h``: how
        many rows they changed in all."""

    # -- what a backend may do better ----------------------------------------------------

    def _run_all(self, h: H, units: Sequence[Unit]) -> list[Row | None]:
        """Several writes of history in the transaction ``h``, in order (``_run``);
        each run of writes alike (a batch's results, a bulk group's claims or
        outcomes: ``statements.alike``) with its later statements run for the whole
        run at once (``_run_alike``)."""
        if len(units) == 1:
            return [self._run(h, units[0])]
        out: list[Row | None] = []
        for run in alike(units):
            together = len(run) > 1 and len(run[0].statements) > 1
            out.extend(self._run_alike(h, run) if together else [self._run(h, u) for u in run])
        return out

    def _run_alike(self, h: H, run: Sequence[Unit]) -> list[Row | None]:
        """``run`` (writes of one shape, each of another record): what each gave, as
        ``_run`` would. The first statement of each write (its guarded event, or its
        new row) runs on its own and says whether its guard held; each later one (the
        counts, the row by its id, a new row's events) runs once for every write
        whose guard held (``_execute_each``). Once its first statement held, each of
        them changes a row; one that does not fails the whole transaction."""
        (first, _), *later = run[0].statements
        held = [u for u in run if self._execute(h, first, u.statements[0][1]) >= 1]
        for n, (sql, _) in enumerate(later, 1):
            if held and self._execute_each(h, sql, [u.statements[n][1] for u in held]) < len(held):
                raise LedgerError(
                    f"a write of a group changed no row ({sql[:40]}…); nothing was changed"
                )
        kept = {id(u) for u in held}
        return [() if id(u) in kept else None for u in run]

    def _lock_values(self, h: H, provider: str, values: Sequence[str]) -> None:
        """Serialise, for the transaction ``h``, with every other transaction that
        keeps or matches a callback naming one of ``values``. Nothing to do where a
        write transaction holds the whole ledger."""

    def _worth_matching(self, rec: ActionRecord) -> bool:
        """Whether ``match_callbacks`` must open its write transaction for ``rec``."""
        return True

    def _copy_in(self, h: H, history: Iterable[History]) -> int:
        """Records and their events exactly as they were, inside ``h``: how many."""
        add_row = f"INSERT INTO actions ({', '.join(COLUMNS)}) VALUES ({_marks(self, COLUMNS)})"
        add_events = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({_marks(self, EVENT_COLUMNS)})"
        n = 0
        for rec, events in history:
            if self._execute(h, add_row, self._stored(to_row(rec))) != 1:  # no-replace trigger
                raise LedgerError(f"{self.location} already holds action {rec.action_id}")
            self._execute_each(h, add_events, [event_row(e, self._store) for e in events])
            n += 1
        return n

    def _copy_ledger_events(self, h: H, events: Sequence[LedgerEvent]) -> None:
        """The events of the ledger itself, in their order, read back and compared
        inside ``h`` (their ids are the database's own: numbered anew)."""
        said = [(e.at, self._store(e.actor), e.kind, detail_text(e.detail)) for e in events]
        self._execute_each(h, self.WRITES.ledger_event, said)
        back = [
            (str(at), str(actor), str(kind), json.loads(detail))
            for _, at, actor, kind, detail in self._fetch(h, self.READS.ledger_events)
        ]
        if back != [(e.at, e.actor, e.kind, e.detail) for e in events]:
            raise LedgerError(
                f"the ledger's own events copied to {self.location} differ from the "
                f"source's ({len(back)} against {len(events)}); nothing was written"
            )

    def _copy_callbacks(self, h: H, rows: Iterable[Sequence[Any]]) -> None:
        """Kept callbacks' rows (``columns.CALLBACK_COLUMNS``) as they were."""
        sql = f"INSERT INTO callbacks ({', '.join(CALLBACK_COLUMNS)}) VALUES ({_marks(self, CALLBACK_COLUMNS)})"
        self._execute_each(h, sql, [[self._store(v) for v in r] for r in rows])

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

    def _run(self, h: H, unit: Unit) -> Row | None:
        """One write of history: its row's ``back`` columns (``()`` when it asks for
        none), or None when it changed nothing (its guard failed, or its id was taken)."""
        *first, (sql, args) = unit.statements
        for before in first:
            if self._execute(h, *before) < 1:
                return None
        if unit.back:
            rows = self._fetch(h, sql, args)
            return rows[0] if rows else None
        return () if self._execute(h, sql, args) >= 1 else None

    def _applied(self, h: H, moves: Sequence[Move], units: Sequence[Unit]) -> list[Row | None]:
        """``units`` (the writes of ``moves``) in the transaction ``h``; a move that
        records an event passes its crash point before the commit."""
        out = self._run_all(h, units)
        for m, got in zip(moves, out, strict=True):
            if got is not None and m.kind is not None:
                self.probe(f"before_commit:{m.kind}")
        return out

    def _stored(self, values: dict[str, Any]) -> list[Any]:
        return [self._store(v) for v in values.values()]

    def _find_in(self, h: H, action_id: str) -> ActionRecord | None:
        found = records_of(self._fetch(h, self.READS.find, (action_id,)))
        return found[0] if found else None

    def _new(self, rec: ActionRecord, actor: str, claim: Move | None) -> tuple[Unit, ActionRecord]:
        """The write of ``rec`` with its ``recorded`` event, and, when ``claim``
        certainly holds on it, already claimed with the ``claimed`` event too; the
        record it leaves (as the database holds it)."""
        events: list[NewEvent] = [
            (
                rec.created_at,
                actor,
                str(EventKind.RECORDED),
                None,
                str(rec.status),
                rec.attempt,
                recorded_detail(rec),
            )
        ]
        if claim is not None:
            assert claim.kind is not None
            rec = after_move(rec, claim)
            events.append(
                (
                    claim.at,
                    claim.actor,
                    str(claim.kind),
                    str(claim.frm),
                    str(claim.to),
                    rec.attempt,
                    claim.detail,
                )
            )
        row = to_row(rec)
        if self._store is not _as_is:
            stored = {k: self._store(v) for k, v in row.items()}
            if any(stored[k] is not v for k, v in row.items()):
                rec = from_row(stored)  # what the database will read back
            row = stored
        return insert_unit(row, events, self.DIALECT, self._store), rec

    def _claim_new(
        self, h: H, pairs: Sequence[tuple[ActionRecord, Move]], actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        """``record_and_claim`` for each pair, inside the transaction ``h``: the rows
        written already claimed where the claim certainly holds (all at once where the
        backend can), else inserted and then claimed."""
        fused = [fusable(rec, claim) for rec, claim in pairs]
        writes = [
            self._new(rec, actor, claim if f else None)
            for (rec, claim), f in zip(pairs, fused, strict=True)
        ]
        done = self._run_all(h, [unit for unit, _ in writes])
        out: list[tuple[ActionRecord, bool]] = []
        for (rec, claim), f, (_, written), got in zip(pairs, fused, writes, done, strict=True):
            if got is None:  # the id was taken (before, or earlier in this group)
                found = self._find_in(h, rec.action_id)
                assert found is not None
                out.append((found, False))
            elif f:
                self.probe(f"before_commit:{claim.kind}")
                out.append((written, True))
            else:
                row = self._applied(
                    h, [claim], [move_unit(claim, self.DIALECT, COLUMNS, store=self._store)]
                )[0]
                assert row is not None  # inserted PENDING in this very transaction
                out.append((from_values(row), True))
        return out

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
        if move is None or self._applied(h, [move], [self._unit(move)])[0] is None:
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

    def _unit(self, m: Move, back: Sequence[str] = (), since: str | None = None) -> Unit:
        return move_unit(m, self.DIALECT, back, since=since, store=self._store)

    # -- reads ---------------------------------------------------------------------------

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[ActionRecord]:
        return records_of(self._all(sql, args))

    def find(self, action_id: str) -> ActionRecord | None:
        found = self._rows(self.READS.find, (action_id,))
        return found[0] if found else None

    def events(self, action_id: str) -> list[Event]:
        return [event_of(r) for r in self._all(self.READS.events, (action_id,))]

    def _searchable(self, sel: Selection) -> None:
        """A search needs the ledger's search index: a ledger older than its step is
        read as it is for everything else, and asked to migrate for a search."""
        if not sel.search:
            return
        step = next(n for n, (name, _) in enumerate(self._steps(), 1) if name.endswith("_search"))
        if self.schema < step:
            where = str(getattr(self, "location", None) or getattr(self, "path", "the ledger"))
            raise LedgerOutdated(where, self.schema, self.latest_schema)

    def activity(self, now: str) -> tuple[int, str | None]:
        # Every version writes an event with each change of status and stamps
        # updated_at with each change of a record (a lease taken included); both
        # columns are in the first schema, so this reads a ledger of any version.
        times: list[tuple[datetime, str]] = []
        for sql in ("SELECT max(at) FROM events", "SELECT max(updated_at) FROM actions"):
            for (t,) in self._all(sql):
                at = from_text(str(t)) if t is not None else None
                if at is not None:
                    times.append((at, str(t)))
        live = int(self._all(self.READS.live_leases, (now,))[0][0])
        return live, (max(times)[1] if times else None)

    def log(self, f: LogFilter | None = None) -> list[Event]:
        f = f or LogFilter()
        w, args = event_log.where(f, self.DIALECT)
        cols = ", ".join(f"e.{c}" for c in EVENT_COLUMNS)
        limit = max(1, min(f.limit, event_log.MAX_LOG))
        sql = f"SELECT {cols} FROM events e{w} ORDER BY e.id DESC LIMIT {self.DIALECT.mark}"
        return [event_of(r) for r in self._all(sql, [*args, limit])]

    def records(self, selection: Selection | None = None) -> list[ActionRecord]:
        sel = selection or Selection()
        self._searchable(sel)
        d = self.DIALECT
        w = query.where(sel, d)
        parts, backward = query.seek_parts(sel, d)
        rows: list[ActionRecord] = []
        for past, past_args, order in parts:
            want = None if sel.limit is None else sel.limit - len(rows)
            if want is not None and want <= 0:
                break
            sql, args = w.sql, list(w.args)
            if past:
                sql = f"{sql} AND {past}" if sql else f" WHERE {past}"
                args += past_args
            cut, more = query.limit(replace(sel, limit=want), d)
            rows += self._rows(f"{statements.SELECT}{sql}{order}{cut}", args + more)
        return rows[::-1] if backward else rows

    def count(self, selection: Selection | None = None) -> int:
        self._searchable(selection or Selection())
        w = query.where(selection or Selection(), self.DIALECT)
        return int(self._all(f"SELECT count(*) FROM actions{w.sql}", w.args)[0][0])

    def causes(self, selection: Selection | None = None) -> list[tuple[bool, str, int]]:
        sql, args = query.causes_statement(selection or Selection(), self.DIALECT)
        return [(bool(c), str(g or ""), int(n)) for c, g, n in self._all(sql, args)]

    def stats(
        self, selection: Selection | None = None, *, now: str, by: str | None = None
    ) -> Stats:
        sel = selection or Selection()
        if not self._counts_answer(sel, by):
            todo = query.stats_statements(sel, self.DIALECT, now, by)
            rows = self._snapshot(
                "read the figures",
                lambda run: {k: run(sql, args) for k, (sql, args) in todo.items()},
            )
            return fold_stats(rows["totals"][0], rows["cells"], rows["ages"], rows.get("ages_by"))
        # The settled records (most of a ledger) from the kept counts; the open ones,
        # whose reasons and ages are the point, aggregated through the status index:
        # the figures cost what is open, not what the ledger holds.
        wanted = [str(st) for st in sel.statuses] if sel.statuses else [str(st) for st in Status]
        opened = [st for st in wanted if st in query.OPEN]
        closed = {st for st in wanted if st not in query.OPEN}
        todo = query.stats_statements(
            replace(sel, statuses=opened), self.DIALECT, now, by, by_status=True
        )

        def read(run: Run) -> dict[str, list[Row]]:
            got = {k: run(sql, args) for k, (sql, args) in todo.items()} if opened else {}
            got["kept"] = run(self.READS.counts, ())
            return got

        rows = self._snapshot("read the figures", read)
        kept = [
            (st, p, o, None, int(n), "", None)
            for st, p, o, n in rows["kept"]
            if st in closed
            and int(n) > 0
            and sel.provider in (None, "", p)
            and sel.operation in (None, "", o)
        ]
        total, failing = rows["totals"][0] if opened else (0, 0)
        return fold_stats(
            (int(total) + sum(c[4] for c in kept), failing),
            [*rows.get("cells", []), *kept],
            rows.get("ages", []),
            rows.get("ages_by"),
        )

    def _counts_answer(self, sel: Selection, by: str | None) -> bool:
        """Whether the kept counts can answer ``stats`` of ``sel`` for its settled
        records: selected only by status, provider and operation, not grouped by reason."""
        other = (
            sel.created_before,
            sel.created_after,
            sel.ids,
            sel.contradicted,
            sel.also_contradicted,
            sel.delivery,
            sel.match,
        )
        return self.counted and by != "reason" and not any(other)

    def ids(self, prefix: str = "", limit: int = 200) -> list[str]:
        # action_id sorts by code point on both (PostgreSQL's COLLATE "C"): the range
        # on the key is exactly "starts with"
        return [str(r[0]) for r in self._all(self.READS.ids, statements.ids_args(prefix, limit))]

    @property
    def counted(self) -> bool:
        """Whether this ledger keeps its counts (an older one is read as it is)."""
        return self.schema >= self.COUNTED_SINCE

    def names(self) -> list[tuple[str, str]]:
        sql = self.READS.names if self.counted else self.READS.names_recount
        return [(r[0], r[1]) for r in self._all(sql)]

    def status_counts(self) -> dict[tuple[str, str], int]:
        sql = self.READS.status_counts if self.counted else self.READS.status_recount
        return {(r[0], r[1]): int(r[2]) for r in self._all(sql)}

    def counts(self) -> dict[tuple[str, str, str], int]:
        sql = self.READS.counts if self.counted else self.READS.recount
        return {(r[0], r[1], r[2]): int(r[3]) for r in self._all(sql)}

    def fold_counts(self) -> None:
        if self.DIALECT.count_slot == "0" or not self.counted:
            return  # one slot only: nothing to fold
        with self._write("fold the counts", one=True) as h:
            self._execute(h, self.WRITES.fold_counts)

    def check_failures(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in self._all(self.READS.check_failures)}

    def paused_checks(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in self._all(self.READS.paused_checks)}

    def rivals(self, rec: ActionRecord, limit: int = 5) -> list[str]:
        return [r[0] for r in self._all(self.READS.rivals, statements.rivals_args(rec, limit))]

    def figures(self) -> dict[tuple[str, str], Figures]:
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
        unit, written = self._new(rec, actor, None)
        with self._write("record", one=True) as h:
            if self._run(h, unit) is not None:
                return written, True
            found = self._find_in(h, rec.action_id)
        assert found is not None
        same_action(found, rec)  # Conflict: nothing was written
        return found, False

    def record_and_claim(
        self, rec: ActionRecord, *, actor: str, claim: Move
    ) -> tuple[ActionRecord, bool]:
        one = self.DIALECT.writes_in_one and fusable(rec, claim)
        with self._write("record and claim", one=one) as h:
            [(got, created)] = self._claim_new(h, [(rec, claim)], actor)
        if not created:
            same_action(got, rec)  # Conflict: nothing was written
        return got, created

    def record_and_claim_many(
        self, pairs: Sequence[tuple[ActionRecord, Move]], *, actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        if not pairs:
            return []
        with self._write("record and claim a group") as h:
            return self._claim_new(h, pairs, actor)

    def move(self, move: Move, *, record: ActionRecord | None = None) -> ActionRecord | None:
        if record is None:
            unit = self._unit(move, COLUMNS)
        else:  # read back only what a due scan may have set without a move
            unread = tuple(n for n in SCHEDULE if n not in move.values)
            unit = self._unit(move, unread, since=record.updated_at)
        with self._write(f"record {move.kind or 'a schedule'}", one=True) as h:
            row = self._applied(h, [move], [unit])[0]
        if row is None:
            return None
        if record is None:
            return from_values(row)
        values = dict(move.values)
        if self._store is not _as_is:
            values = {k: self._store(v) for k, v in values.items()}
        values.update(zip(unread, row, strict=False))  # PostgreSQL: ``1`` when none
        return after_move(record, move, values)

    def commit(self, moves: Sequence[Move]) -> list[bool]:
        if not moves:
            return []
        with self._write("commit results") as h:
            done = self._applied(h, moves, [self._unit(m) for m in moves])
        return [got is not None for got in done]

    def claim_retries(self, pairs: Sequence[tuple[Move, Move]]) -> list[ActionRecord | None]:
        out: list[ActionRecord | None] = []
        if not pairs:
            return out
        with self._write("reopen and claim a group") as h:
            for reopen, claim in pairs:
                if self._applied(h, [reopen], [self._unit(reopen)])[0] is None:
                    out.append(None)
                    continue
                row = self._applied(h, [claim], [self._unit(claim, COLUMNS)])[0]
                assert row is not None  # reopened PENDING in this very transaction
                out.append(from_values(row))
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
            done = self._applied(h, pending, [self._unit(m) for m in pending])
            batch.committed = [got is not None for got in done]
            rows = records_of(self._fetch(h, self.DUE, (cutoff, size)))
            batch.selected = len(rows)
            running, lapsed, batch.leased = sort_due(rows, now, owner)
            self._execute_each(
                h, self.WRITES.due_at, [(rec.lease_expires_at, rec.action_id) for rec in running]
            )
            for rec in lapsed:
                m = expire(rec)
                if self._applied(h, [m], [self._unit(m)])[0] is not None:
                    batch.expired.append((rec, m))
            self._execute_each(
                h, self.WRITES.lease, [(owner, until, rec.action_id) for rec in batch.leased]
            )
        return batch

    def lease_one(self, rec: ActionRecord, *, owner: str, until: str, now: str) -> bool:
        args = (owner, until, rec.action_id, str(rec.status), now)
        with self._write("lease a record", one=True) as h:
            return self._execute(h, self.WRITES.lease_one, args) == 1

    def hand_back(self, leased: Sequence[ActionRecord], *, owner: str) -> None:
        if not leased:
            return
        with self._write("hand back a batch") as h:
            self._execute_each(
                h, self.WRITES.hand_back, [(r.next_check_at, r.action_id, owner) for r in leased]
            )

    def renew_leases(self, held: Sequence[tuple[str, str]], *, until: str) -> dict[str, int]:
        still: dict[str, int] = {}
        if not held:
            return still
        with self._write("renew check leases") as h:
            for owner, now_until in held:
                still[owner] = self._execute(h, self.WRITES.renew, (until, now_until, owner))
        return still

    # -- the whole ledger ----------------------------------------------------------------

    @contextmanager
    def still(self) -> Iterator[Still]:
        with self._holding("hold the ledger still", "still") as h:
            yield HeldStill(
                self.location,
                self.rows,
                lambda now: int(self._fetch(h, self.READS.live_leases, (now,))[0][0]),
                lambda to, at: self._mark_moved(h, to, at),
            )

    def _mark_moved(self, h: H, to: str, at: str) -> None:
        self._execute(h, self.MARK_MOVED, (self._store(to), at))

    def verify(self, on_record: Callable[[int], None] | None = None, *, full: bool = True) -> Any:
        """``Ledger.verify`` from one snapshot: every row it reads read in one read
        transaction; then, when all agree, where it got to stored (``truth.established``)."""
        marked = self.schema >= self.CHECKPOINT_SINCE
        with self._holding("verify the ledger", "read") as h:
            snapshot, top = self._fetch(h, self.READS.verify_top)[0]
            got = self._fetch(h, self.READS.checkpoint) if marked else []
            prev: truth.Checkpoint | None = (
                (int(got[0][0]), int(got[0][1]), got[0][2]) if got else None
            )
            if full or not marked:
                verdict = truth.verify(self, on_record)
                if self.counted:
                    verdict.counts = truth.count_findings(
                        self._fetch(h, self.READS.counts), self._fetch(h, self.READS.recount)
                    )
            else:
                verdict = self._verify_since(h, prev[0] if prev else 0, on_record)
        if marked and verdict.ok:
            mark = truth.established(prev, int(top), snapshot)
            at = to_text(self.clock(anchor=False).now())
            args = (True, mark, int(top), snapshot, verdict.records, at)
            try:
                with self._write("store where verify got to", one=True) as w:
                    self._execute(w, self.WRITES.checkpoint, [self._store(a) for a in args])
                verdict.checkpoint = mark
                self.fold_counts()  # a run that writes keeps the counts' rows few too
            except (LedgerBusy, LedgerReadOnly):
                # what was checked stands; the next run starts from the old checkpoint
                pass
        return verdict

    def _verify_since(
        self, h: H, since: int, on_record: Callable[[int], None] | None
    ) -> truth.Verdict:
        """The records with an event after ``since``, each with its whole log, inside
        the read transaction ``h`` (a chunk of records at a time)."""
        verdict = truth.Verdict(mode="incremental", since=since)
        ids = sorted({str(r[0]) for r in self._fetch(h, self.READS.changed_since, (since,))})
        rows_of = f"SELECT {', '.join(truth.TABLES['actions'][0])} FROM actions WHERE "
        events_of = f"SELECT {', '.join(truth.TABLES['events'][0])} FROM events WHERE "
        for at in range(0, len(ids), VERIFY_CHUNK):
            chunk = ids[at : at + VERIFY_CHUNK]
            clause, args = self.DIALECT.one_of("action_id", chunk)
            truth.verify_some(
                self.location,
                chunk,
                self._fetch(h, rows_of + clause, args),
                self._fetch(h, f"{events_of}{clause} ORDER BY action_id, id", args),
                verdict,
                on_record,
            )
        return verdict

    def _replay_summary(self) -> str:
        """``integrity_check``'s share of rule 18: "ok", or what disagrees."""
        verdict = self.verify()
        if verdict.ok:
            return "ok"
        lines = verdict.lines()
        n = len(verdict.findings)
        head = f"{n} disagreement{'s' if n != 1 else ''} between records and events"
        if verdict.counts:
            head += f", {len(verdict.counts)} count(s) wrong"
        return f"{head}; {lines[0]}"

    def restore(
        self,
        history: Iterable[History],
        *,
        callbacks: Iterable[Sequence[Any]] = (),
        check: Callable[[Any], None] | None = None,
        ledger_events: Sequence[LedgerEvent] = (),
    ) -> int:
        counted: dict[tuple[str, str, str], int] = {}

        def counting(items: Iterable[History]) -> Iterator[History]:
            for rec, events in items:
                key = (str(rec.status), rec.provider, rec.operation)
                counted[key] = counted.get(key, 0) + 1
                yield rec, events

        with self._holding("restore a copied ledger", "write") as h:
            n = self._copy_in(h, counting(history))
            # the copied records counted, in the transaction that writes them
            self._execute_each(
                h,
                self.WRITES.count_add,
                [[*(self._store(v) for v in key), k] for key, k in sorted(counted.items())],
            )
            self._copy_callbacks(h, callbacks)
            self._copy_ledger_events(h, ledger_events)
            if check is not None:
                check(self)  # reads this transaction's rows: an error rolls it all back
        return n

    # -- retention and erasure -------------------------------------------------------------

    def prunable(self, which: Prunable) -> dict[tuple[str, str, str], int]:
        sql, args = statements.prunable_counts(which, self.DIALECT)
        return {(str(st), str(p), str(o)): int(n) for st, p, o, n in self._all(sql, args)}

    def prune_batch(
        self, which: Prunable, *, after: str, size: int, at: str, actor: str, keep: Keep
    ) -> PruneBatch:
        d, w = self.DIALECT, self.WRITES
        with self._write("prune a batch") as h:
            self._lock_values(h, "ledger_events", ["prune"])  # one prune batch at a time
            sql, args = statements.prune_page(which, d, after, size)
            records = records_of(self._fetch(h, sql, args))
            if not records:
                return PruneBatch()
            ids = [r.action_id for r in records]
            n = len(ids)
            rows = self._fetch(h, statements.of_ids(f"{_EVENTS} WHERE", n, d, " ORDER BY id"), ids)
            batch = PruneBatch(statements.pages(records, rows))
            detail = keep(batch.histories)  # archived, durably, before anything is deleted
            self._execute(
                h, w.ledger_event, (at, self._store(actor), "pruned", detail_text(detail))
            )
            batch.run = int(self._fetch(h, w.newest_ledger_event)[0][0])
            allow = statements.of_ids(
                f"INSERT INTO erasing (action_id, purpose, run) SELECT action_id, 'prune',"
                f" CAST({d.mark} AS bigint) FROM actions WHERE",
                n,
                d,
            )  # one statement for the batch, not one round trip per record
            if self._execute(h, allow, [batch.run, *ids]) != n:
                raise LedgerError(f"{self.location}: a prune batch's allowance was refused")
            deleted = self._execute(h, statements.of_ids("DELETE FROM events WHERE", n, d), ids)
            gone = self._execute(h, statements.of_ids("DELETE FROM actions WHERE", n, d), ids)
            alike: dict[tuple[str, str, str], list[ActionRecord]] = {}
            for r in records:  # the kept counts lose what the batch took
                alike.setdefault((str(r.status), r.provider, r.operation), []).append(r)
            for same in alike.values():
                self._execute(h, *statements.count_removed(same[0], d, len(same)))
            self._execute(h, w.allowed_end, ("prune", batch.run))
            if deleted != batch.events or gone != n:  # the rows read are the rows deleted
                raise LedgerError(
                    f"{self.location}: a prune batch read {n} records and {batch.events} "
                    f"events but would delete {gone} and {deleted}; nothing was deleted"
                )
            self.probe("before_commit:pruned")
        return batch

    def ledger_events(self, kind: str | None = None) -> list[LedgerEvent]:
        out = []
        for i, at, actor, k, detail in self._all(self.READS.ledger_events):
            if kind is None or k == kind:
                out.append(LedgerEvent(int(i), str(at), str(actor), str(k), json.loads(detail)))
        return out

    def redact(self, action_id: str, erase: Erase) -> ActionRecord | None:
        w = self.WRITES
        with self._write("redact a record") as h:
            found = records_of(self._fetch(h, w.bound_record, (action_id,)))
            if not found:
                raise NotFound(f"no action {action_id!r} in {self.location}")
            rec = found[0]
            if rec.status not in SETTLED_STATUSES or rec.contradiction or rec.next_check_at:
                raise Conflict(
                    f"action {action_id} is {rec.status}"
                    f"{' and contradicted' if rec.contradiction else ''}: only a settled, "
                    "uncontradicted record is redacted (settle it first)"
                )
            log = [event_of(r) for r in self._fetch(h, self.READS.events, (action_id,))]
            todo = erase(rec, log)
            if todo is None:
                return None
            status = str(rec.status)
            who = self._store(todo.actor)
            said = detail_text(todo.detail)
            self._execute(
                h, w.redacted_event, (action_id, todo.at, who, status, status, rec.attempt, said)
            )
            run = int(self._fetch(h, w.newest_event, (action_id,))[0][0])
            self._execute(h, w.allow, (action_id, "redact", run))
            values = (
                self._store(todo.params),
                self._store(todo.reason),
                self._store(todo.snapshot),
            )
            if self._execute(h, w.redacted_row, (*values, todo.at, action_id, rec.updated_at)) != 1:
                raise Conflict(f"action {action_id} changed while it was redacted; try again")
            self._execute_each(
                h,
                w.event_detail,
                [(self._store(detail_text(d)), i, action_id) for i, d in todo.details.items()],
            )
            self._execute(h, w.allowed_end, ("redact", run))
            self.probe("before_commit:redacted")
            rec = records_of(self._fetch(h, self.READS.find, (action_id,)))[0]
        return rec

    # -- callbacks -----------------------------------------------------------------------

    def take_callback(
        self, cb: Callback, decide: Decide, *, now: datetime
    ) -> tuple[Taken, Move | None]:
        row = {k: self._store(v) for k, v in callback_row(cb, retry_pending_at(now, 0)).items()}
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

    def sweep_callbacks(self, decide: Decide, *, now: datetime, size: int) -> Sweep:
        # Only what is due is read, without any lock (a pass with nothing due writes
        # nothing); each is then taken again inside the write transaction, where one
        # matched or taken by another pass meanwhile is no longer found.
        sweep = Sweep()
        at = to_text(now)
        due = self._all(self.READS.callbacks_due, (at, size))
        groups = [[row] for row in due] if self.SWEEP_ONE_BY_ONE else [due] if due else []
        for group in groups:
            with self._write("match pending callbacks") as h:
                for provider, event_id, key in group:
                    self._lock_values(h, provider, [key])
                    found = self._fetch(h, self.READS.pending_one, (provider, event_id))
                    for pending in callbacks_of(found):
                        self._sweep_one(h, pending, decide, now, at, sweep)
        return sweep

    def callback_figures(self) -> dict[str, CallbackFigures]:
        return statements.callback_figures(self._all(self.READS.callback_figures))

    def pending_callbacks(self, rec: ActionRecord) -> int:
        return int(self._all(self.READS.pending_count, statements.pending_args(rec))[0][0])


def event_row(e: Event, store: Callable[[Any], Any] = _as_is) -> list[Any]:
    """An event as its row (``EVENT_COLUMNS``), its id included: a copied ledger's."""
    row = [e.id, e.action_id, e.at, store(e.actor), e.kind, e.from_status, e.to_status]
    return [*row, e.attempt, detail_text(e.detail)]


def _marks(ledger: SqlLedger[Any], names: Sequence[str]) -> str:
    return ", ".join([ledger.DIALECT.mark] * len(names))


@dataclass
class HeldStill(Still):
    """A SQL ledger inside the transaction that holds it still (``Ledger.still``):
    its rows, and the statements of that transaction."""

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
    "SCHEDULE",
    "HeldStill",
    "Run",
    "SqlLedger",
    "busy_timeout_from_env",
    "callbacks_of",
    "event_row",
    "fusable",
    "records_of",
]
