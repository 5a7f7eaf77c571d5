"""The ledger's statements, written once: the named reads and writes both backends run,
the two builders every write of history goes through, and the rows they return turned
into values. A statement marks its parameters with ``?``; ``render`` writes it in a
backend's ``query.Dialect`` (``%s`` for psycopg), with the few fragments that differ
filled in:

- ``{time}``: a bound time that may be NULL (PostgreSQL must be told its type);
- ``{lock}``: the row lock a read inside a write transaction takes (``FOR UPDATE``
  on PostgreSQL; nothing on SQLite, whose write transaction holds the whole file);
- ``{skip}``: the same lock, passing over rows another transaction holds.

Every change of a record is one of two writes, each with the event that records it,
built here for both backends (``Unit``):

- ``move_unit``: a guarded move (``model.Move``): its values, only while the record
  is where the mover saw it (status, lease owner, attempt…), with its event;
- ``insert_unit``: a new record with its events (``recorded``, and ``claimed`` when
  it is written already claimed), or nothing when its id is taken.

Where the dialects differ is how a write and its event become one: PostgreSQL writes
both in ONE statement (a data-modifying ``WITH``); SQLite in two, the second run only
when the first changed a row: a move's event first, found by the move's own guard
(the database refuses a status change whose newest event does not record it, and
SQLite checks that as the row changes), then the row; a new record's row first, then
its events.

Both also keep the counts (``action_counts``: records per status, provider and
operation) in the same statement or transaction as the row: a new record adds one to
its status, a move that changes the status takes one from where it was and adds one
where it goes. The counts are rows of deltas summed by whoever reads them, one row
per (status, provider, operation, slot); a writer adds only to its own slot
(``Dialect.count_slot``: the PostgreSQL session's backend pid), so concurrent writers
never wait on, nor deadlock over, a shared count, and ``fold_counts`` folds the
slots of sessions that have ended into slot 0. A write that removes a record must
take one from its status in the same way, in its own transaction (``count_removed``).

The listings and the figures of ``settled stats`` are built from a ``Selection`` in
``query``; the audit's aggregates are in ``audit_sql``. Every value is a bound
parameter; the only names spliced in are column names from the fixed tables of
``columns``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from ..model import CALLBACK_NAMES, ActionRecord, Event, Move
from .columns import (
    CALLBACK_COLUMNS,
    COLUMNS,
    EVENT_COLUMNS,
    PENDING_COLUMNS,
    detail_text,
    event_of,
)
from .ledger import DUE_SQL, CallbackFigures, Prunable
from .query import Dialect

SELECT = f"SELECT {', '.join(COLUMNS)} FROM actions"
_EVENTS = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events"
_PENDING = f"SELECT {', '.join(PENDING_COLUMNS)} FROM callbacks"
_NEW_EVENT = ", ".join(EVENT_COLUMNS[1:])  # what a new event is written with (the id is numbered)

# Pending callbacks that name a record: bound to it, or naming one of its values
# (``pending_args``).
_NAMING = (
    "provider = ? AND state = 'pending' AND (action_id = ? OR (action_id IS NULL AND ("
    "(names = 'action_id' AND key = ?) OR (names = 'reconciliation_key' AND key = ?)"
    " OR (names = 'provider_object_id' AND key = ?))))"
)


@dataclass(frozen=True)
class Reads:
    """The named read statements, in one backend's dialect."""

    find: str = f"{SELECT} WHERE action_id = ?"
    events: str = f"{_EVENTS} WHERE action_id = ? ORDER BY id"
    # a page of the ledger (``export``): records by id, then the events of that range
    page: str = f"{SELECT} WHERE action_id > ? ORDER BY action_id LIMIT ?"
    page_events: str = f"{_EVENTS} WHERE action_id >= ? AND action_id <= ? ORDER BY action_id, id"
    # the range on the key is exactly "starts with" (text in code point order)
    ids: str = (
        "SELECT action_id FROM actions WHERE action_id >= ? AND action_id < ?"
        " ORDER BY action_id LIMIT ?"
    )
    names: str = (
        "SELECT provider, operation FROM action_counts GROUP BY 1, 2 HAVING sum(n) > 0"
        " ORDER BY 1, 2"
    )
    # the counts the writes keep (one row per slot), and the same figures recounted
    counts: str = (
        "SELECT status, provider, operation, sum(n) FROM action_counts GROUP BY 1, 2, 3"
        " HAVING sum(n) <> 0"
    )
    recount: str = "SELECT status, provider, operation, count(*) FROM actions GROUP BY 1, 2, 3"
    status_counts: str = (
        "SELECT status, provider, sum(n) FROM action_counts GROUP BY 1, 2 HAVING sum(n) <> 0"
    )
    # ``verify``'s checkpoint; the read's snapshot and newest event; the records with an
    # event after an id, and their rows and events (a chunk at a time)
    checkpoint: str = "SELECT established, seen, snapshot FROM verify_checkpoint"
    verify_top: str = "SELECT {snapshot}, coalesce(max(id), 0) FROM events"
    # (by the events' key, never the action index: that would walk every event)
    changed_since: str = "SELECT action_id FROM events WHERE id > ?"
    # the same figures aggregated from the records: a ledger older than its counts
    status_recount: str = "SELECT status, provider, count(*) FROM actions GROUP BY 1, 2"
    names_recount: str = "SELECT DISTINCT provider, operation FROM actions ORDER BY 1, 2"
    check_failures: str = (
        "SELECT provider, count(*) FROM actions WHERE check_error IS NOT NULL"
        " AND status NOT IN ('CONFIRMED', 'FAILED') GROUP BY 1"
    )
    # the failing checks of check_failures that are pauses (policy.paused: 429/503)
    paused_checks: str = (
        "SELECT provider, count(*) FROM actions WHERE substr(check_error, 1, 8) = 'paused: '"
        " AND status NOT IN ('CONFIRMED', 'FAILED') GROUP BY 1"
    )
    # other actions that asked for the same change and may have made it after the
    # record's snapshot: sent, not proven never sent, not observed before it was sent
    rivals: str = (
        "SELECT action_id FROM actions WHERE provider = ? AND operation = ?"
        " AND params_hash = ? AND action_id <> ? AND dispatched_at IS NOT NULL"
        " AND NOT (status = 'FAILED' AND delivery = 'FAILED')"
        " AND (confirmed_at IS NULL OR {time} IS NULL OR confirmed_at >= {time})"
        " ORDER BY created_at LIMIT ?"
    )
    callback_figures: str = (
        "SELECT provider, state, count(*), min(received_at) FROM callbacks GROUP BY 1, 2"
    )
    pending_count: str = f"SELECT count(*) FROM callbacks WHERE {_NAMING}"
    # dispatch leases that have not run out at a time: a copy waits for them
    live_leases: str = (
        "SELECT count(*) FROM actions WHERE status = 'IN_FLIGHT'"
        " AND (lease_expires_at IS NULL OR lease_expires_at > {time})"
    )
    pending_for: str = f"{_PENDING} WHERE {_NAMING} ORDER BY received_at, event_id{{lock}}"
    # pending callbacks due for another try (a sweep), then each one taken in its turn
    callbacks_due: str = (
        "SELECT provider, event_id, key FROM callbacks WHERE state = 'pending'"
        " AND next_check_at <= ? ORDER BY next_check_at LIMIT ?"
    )
    pending_one: str = (
        f"{_PENDING} WHERE provider = ? AND event_id = ? AND state = 'pending'{{skip}}"
    )
    # the events of the ledger itself, oldest first
    ledger_events: str = "SELECT id, at, actor, kind, detail FROM ledger_events ORDER BY id"


@dataclass(frozen=True)
class Writes:
    """The named write statements both backends run as they are, in one dialect. The
    writes of history are built per call (``move_unit``, ``insert_unit``): their
    columns are the move's, or the row's."""

    # lease one record for a check now, unless another checker holds it
    lease_one: str = (
        "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?"
        " AND status = ? AND (lease_owner IS NULL OR next_check_at IS NULL"
        " OR next_check_at <= ?)"
    )
    # a due batch's rows, each leased to one owner until a time (``lease_due``)
    lease: str = "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?"
    # records leased unchecked, handed back: due again at their due time
    hand_back: str = (
        "UPDATE actions SET lease_owner = NULL, next_check_at = ?"
        " WHERE action_id = ? AND lease_owner = ?"
    )
    # the records one checker still holds, their lease moved on (its heartbeat)
    # (through the due index: the lease's time, then its owner), skipping a row being
    # written meanwhile: its result clears the lease, and nobody waits on anybody
    renew: str = (
        "UPDATE actions SET next_check_at = ? WHERE action_id IN (SELECT action_id"
        " FROM actions WHERE next_check_at = ? AND lease_owner = ?"
        " AND next_check_at IS NOT NULL"
        f" AND status IN {DUE_SQL}{{skip}})"
    )
    # a due row whose dispatch lease still runs: due again when the lease ends
    due_at: str = "UPDATE actions SET next_check_at = ? WHERE action_id = ?"
    # the record a kept callback is bound to, read (and locked) to settle it
    bound_record: str = f"{SELECT} WHERE action_id = ?{{lock}}"
    # a kept callback left pending, bound to its record and attempt
    callback_bound: str = (
        "UPDATE callbacks SET action_id = ?, attempt = ? WHERE provider = ?"
        " AND event_id = ? AND state = 'pending'"
    )
    callback_matched: str = (
        "UPDATE callbacks SET state = 'matched', action_id = ?, attempt = ?, matched_at = ?,"
        " next_check_at = NULL WHERE provider = ? AND event_id = ? AND state = 'pending'"
    )
    callback_expired: str = (
        "UPDATE callbacks SET state = 'expired', next_check_at = NULL"
        " WHERE provider = ? AND event_id = ? AND state = 'pending'"
    )
    callback_retry: str = (
        "UPDATE callbacks SET tries = tries + 1, next_check_at = ?"
        " WHERE provider = ? AND event_id = ? AND state = 'pending'"
    )
    # retention and erasure: the audit of a run, the allowance it names, its end
    ledger_event: str = (
        "INSERT INTO ledger_events (at, actor, kind, detail) VALUES ({time}, ?, ?, ?)"
    )
    newest_ledger_event: str = "SELECT max(id) FROM ledger_events"
    allow: str = "INSERT INTO erasing (action_id, purpose, run) VALUES (?, ?, ?)"
    allowed_end: str = "DELETE FROM erasing WHERE purpose = ? AND run = ?"
    redacted_event: str = (
        f"INSERT INTO events ({_NEW_EVENT}) VALUES (?, {{time}}, ?, 'redacted', ?, ?, ?, ?)"
    )
    newest_event: str = "SELECT max(id) FROM events WHERE action_id = ?"
    redacted_row: str = (
        "UPDATE actions SET params = ?, reason = ?, snapshot = ?, updated_at = {time}"
        " WHERE action_id = ? AND updated_at = {time}"
    )
    event_detail: str = "UPDATE events SET detail = ? WHERE id = ? AND action_id = ?"
    # records added to (or, with a negative n, taken from) a status's count
    count_add: str = (
        "INSERT INTO action_counts (status, provider, operation, slot, n)"
        " VALUES (?, ?, ?, {slot}, ?) ON CONFLICT (status, provider, operation, slot)"
        " DO UPDATE SET n = action_counts.n + excluded.n"
    )
    # where ``verify`` got to: kept only if it goes forward (two runs at once)
    checkpoint: str = (
        "INSERT INTO verify_checkpoint (only_row, established, seen, snapshot, records, at)"
        " VALUES (?, ?, ?, ?, ?, {time}) ON CONFLICT (only_row) DO UPDATE SET"
        " established = excluded.established, seen = excluded.seen,"
        " snapshot = excluded.snapshot, records = excluded.records, at = excluded.at"
        " WHERE verify_checkpoint.seen <= excluded.seen"
    )
    # PostgreSQL: the slots of sessions that have ended, folded into slot 0 (a session
    # that still runs keeps its own; SQLite has slot 0 only)
    fold_counts: str = (
        "WITH gone AS (DELETE FROM action_counts WHERE slot <> 0 AND slot NOT IN"
        " (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)"
        " RETURNING status, provider, operation, n)"
        " INSERT INTO action_counts (status, provider, operation, slot, n)"
        " SELECT status, provider, operation, 0, sum(n) FROM gone GROUP BY 1, 2, 3"
        " ON CONFLICT (status, provider, operation, slot)"
        " DO UPDATE SET n = action_counts.n + excluded.n"
    )
    # by each value a callback may name its record by (``model.CALLBACK_NAMES``)
    named_record: str = f"{SELECT} WHERE provider = ? AND {{names}} = ? LIMIT 2{{lock}}"


def named_records(writes: Writes) -> dict[str, str]:
    """``Writes.named_record`` for each name a callback may use (column names from a
    fixed list, never input)."""
    return {n: writes.named_record.replace("{names}", n) for n in CALLBACK_NAMES}


def render(template: str, d: Dialect) -> str:
    """``template`` in dialect ``d``."""
    assert "%" not in template  # psycopg would read it as a placeholder
    text = template.format(
        time=d.time_mark, lock=d.lock, skip=d.skip_locked, slot=d.count_slot, snapshot=d.snapshot
    )
    return text.replace("?", d.mark) if d.mark != "?" else text


def reads(d: Dialect) -> Reads:
    """Every read statement in dialect ``d`` (rendered once, when a backend loads)."""
    return Reads(**{f.name: render(str(f.default), d) for f in fields(Reads)})


def writes(d: Dialect) -> Writes:
    """Every named write statement in dialect ``d`` (``{names}`` is left in place)."""
    return Writes(
        **{
            f.name: render(str(f.default).replace("{names}", "{{names}}"), d)
            for f in fields(Writes)
        }
    )


def insert(table: str, names: Sequence[str], conflict: str, d: Dialect) -> str:
    """An insert of one row of ``names`` that does nothing when ``conflict`` (the key's
    columns) is taken."""
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join([d.mark] * len(names))})"
        f" ON CONFLICT ({conflict}) DO NOTHING"
    )


# -- the writes of history -------------------------------------------------------------------

Statement = tuple[str, list[Any]]
Store = Callable[[Any], Any]  # a bound value as the database can hold it


def as_is(value: Any) -> Any:
    """A bound value as the database holds it, where that needs no change (the default
    ``Store``; a writer compares a ``Store`` with it to skip the calls)."""
    return value


_as_is = as_is


def _time(d: Dialect) -> str:
    """A bound time in ``d`` (the mark typed where the driver must be told)."""
    return d.time_mark.replace("?", d.mark)


@dataclass(frozen=True)
class Unit:
    """One write of history and its event(s), as statements: each after the first
    runs only when the one before changed a row (the unit stops there: its guard did
    not hold, or its id was taken). ``back``: the last statement returns the row's
    ``back`` columns (RETURNING); else what it changed is all it says. ``key``: the
    record it writes, when one (``alike``)."""

    statements: tuple[Statement, ...]
    back: tuple[str, ...] = ()
    key: str | None = None


def alike(units: Sequence[Unit]) -> Iterator[list[Unit]]:
    """``units`` cut, in order, into runs that can be written statement by statement
    for the whole run at once: each unit of a run has the same statements (texts), asks
    for nothing back and writes another record than the others. A unit that fits no
    run is one of its own."""
    run: list[Unit] = []
    texts: tuple[str, ...] | None = None
    keys: set[str] = set()
    for u in units:
        shape = None if u.back or u.key is None else tuple(sql for sql, _ in u.statements)
        if run and (shape is None or shape != texts or u.key in keys):
            yield run
            run, keys = [], set()
        run.append(u)
        texts = shape
        if u.key is not None:
            keys.add(u.key)
    if run:
        yield run


def move_values(m: Move) -> dict[str, Any]:
    """What a move writes to the row: its values, its new status unless it changes
    nothing, its time."""
    values = dict(m.values)
    if m.kind is not None and not m.kind.changes_nothing:
        values["status"] = str(m.to)
    values["updated_at"] = m.at
    return values


@lru_cache(maxsize=512)  # a few shapes of guard and of values, each built once
def _clause(names: tuple[str, ...], mark: str, joint: str) -> str:
    return joint.join(f"{name} = {mark}" for name in names)


def _guard(m: Move, since: str | None) -> tuple[tuple[str, ...], list[Any]]:
    names = ["action_id", "status"]
    args: list[Any] = [m.action_id, str(m.frm)]
    for name, value in (("lease_owner", m.owner), ("attempt", m.attempt), ("updated_at", since)):
        if value is not None:
            names.append(name)
            args.append(value)
    return tuple(names), args


def _where(names: tuple[str, ...], correction: bool, mark: str) -> str:
    where = _clause(names, mark, " AND ")
    return where + " AND contradiction IS NOT NULL" if correction else where


def move_guard(m: Move, d: Dialect, since: str | None = None) -> tuple[str, list[Any]]:
    """Where a move applies: only while the record is where the mover saw it (status,
    and lease owner, attempt and contradiction when given; ``since``: not moved since
    the record the mover holds was written, at its ``updated_at``)."""
    names, args = _guard(m, since)
    return _where(names, m.correction and not m.amends, d.mark), args


def move_update(
    m: Move, d: Dialect, guard: tuple[str, list[Any]] | None = None, store: Store = _as_is
) -> Statement:
    """A move's guarded ``UPDATE`` (no ``RETURNING``): ``move_values`` where
    ``move_guard`` holds, or where ``guard`` says (a caller that checked it already)."""
    values = move_values(m)
    where, args = guard if guard is not None else move_guard(m, d)
    sets = _clause(tuple(values), d.mark, ", ")
    return f"UPDATE actions SET {sets} WHERE {where}", [*map(store, values.values()), *args]


_COUNTED = (
    "INSERT INTO action_counts (status, provider, operation, slot, n)"
    " SELECT v.s, {src}.provider, {src}.operation, {slot}, v.k"
    " FROM {src}, (SELECT CAST({mark} AS text) AS s, -1 AS k UNION ALL SELECT {mark}, 1) AS v"
    " WHERE {where} ON CONFLICT (status, provider, operation, slot)"
    " DO UPDATE SET n = action_counts.n + excluded.n"
)


def _recount(d: Dialect, src: str, where: str) -> str:
    """A move of one record from one status's count (the first mark) to another's (the
    second), its provider and operation read from ``src`` where ``where`` holds."""
    return _COUNTED.format(src=src, slot=d.count_slot, mark=d.mark, where=where)


@lru_cache(maxsize=512)  # the statements of each shape of move, built once
def _move_sql(
    d: Dialect,
    sets: tuple[str, ...],
    guard: tuple[str, ...],
    correction: bool,
    event: bool,
    back: tuple[str, ...],
    counted: bool = False,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The texts of a move's statements, and the columns the last one returns;
    ``counted``: the move changes the status, so the counts move with it."""
    mark = d.mark
    update = f"UPDATE actions SET {_clause(sets, mark, ', ')} WHERE "
    where = _where(guard, correction, mark)
    if not event:
        return _returning_sql(d, update + where, back)
    add_event = (
        f"INSERT INTO events ({_NEW_EVENT}) SELECT action_id, {_time(d)},"
        f" {mark}, {mark}, {mark}, {mark}, coalesce({mark}, attempt), {mark}"
    )
    if d.writes_in_one:
        out = ", ".join(back) or "1"
        count = f", c AS ({_recount(d, 'm', 'true')})" if counted else ""
        sql = (
            f"WITH m AS ({update}{where} RETURNING *), e AS ({add_event} FROM m){count}"
            f" SELECT {out} FROM m"
        )
        return (sql,), back or ("1",)
    # the event first, found by the move's guard; then the counts, found by it too;
    # then the row, found by its id
    then, returned = _returning_sql(d, f"{update}action_id = {mark}", back)
    counts = (_recount(d, "actions", where),) if counted else ()
    return (f"{add_event} FROM actions WHERE {where}", *counts, *then), returned


def _returning_sql(
    d: Dialect, update: str, back: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``update`` giving the row's ``back`` columns: in the same statement, or (an SQLite
    without RETURNING) by a read of the row after it."""
    if not back:
        return (update,), back
    if d.returning:
        return (f"{update} RETURNING {', '.join(back)}",), back
    return (update, f"SELECT {', '.join(back)} FROM actions WHERE action_id = {d.mark}"), back


def move_unit(
    m: Move,
    d: Dialect,
    back: Sequence[str] = (),
    *,
    since: str | None = None,
    store: Store = _as_is,
) -> Unit:
    """A guarded move with its event (none for a change of schedule, ``kind`` None),
    returning the row's ``back`` columns when its guard held."""
    values = move_values(m)
    guard, guard_args = _guard(m, since)
    event = m.kind is not None
    to = values.get("status")
    counted = event and to is not None and to != str(m.frm)
    texts, returned = _move_sql(
        d, tuple(values), guard, m.correction and not m.amends, event, tuple(back), counted
    )
    sets = list(values.values()) if store is _as_is else [store(v) for v in values.values()]
    key = [m.action_id]
    if not event:
        args = [[*sets, *guard_args], key]
    else:
        said = (m.at, m.actor, str(m.kind), str(m.frm), str(m.to))
        recorded = [
            *(said if store is _as_is else map(store, said)),
            values.get("attempt"),  # a move that opens an attempt records it; else the row's
            detail_text(m.detail),
        ]
        moved = [str(m.frm), to] if counted else []
        if d.writes_in_one:
            args = [[*sets, *guard_args, *recorded, *moved]]
        else:
            count = [[*moved, *guard_args]] if counted else []
            args = [[*recorded, *guard_args], *count, [*sets, *key], key]
    return Unit(tuple(zip(texts, args, strict=False)), returned, m.action_id)


# A new record's event: (at, actor, kind, from_status, to_status, attempt, detail).
NewEvent = tuple[str, str, str, "str | None", str, int, Mapping[str, Any]]
_VALUES = "at, actor, kind, from_status, to_status, attempt, detail"


@lru_cache(maxsize=64)  # one shape per dialect and number of events
def _insert_sql(d: Dialect, names: tuple[str, ...], events: int) -> tuple[str, ...]:
    mark = d.mark
    insert_row = (
        f"INSERT INTO actions ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))})"
        " ON CONFLICT (action_id) DO NOTHING"
    )
    if d.writes_in_one:
        one = f"({mark}, {_time(d)}, {', '.join([mark] * 4)}, CAST({mark} AS integer), {mark})"
        text = f"CAST({mark} AS text)"
        count = (
            "INSERT INTO action_counts (status, provider, operation, slot, n)"
            f" SELECT {text}, {text}, {text}, {d.count_slot}, 1 FROM a"
            " ON CONFLICT (status, provider, operation, slot)"
            " DO UPDATE SET n = action_counts.n + excluded.n"
        )
        return (
            f"WITH a AS ({insert_row} RETURNING action_id), c AS ({count})"
            f" INSERT INTO events ({_NEW_EVENT})"
            f" SELECT a.action_id, {_VALUES} FROM a, (VALUES {', '.join([one] * events)})"
            f" AS v(n, {_VALUES}) ORDER BY n",
        )
    one = f"({', '.join([mark] * len(EVENT_COLUMNS[1:]))})"
    return (
        insert_row,
        f"INSERT INTO events ({_NEW_EVENT}) VALUES {', '.join([one] * events)}",
        render(str(Writes.count_add), d),
    )


def insert_unit(
    row: Mapping[str, Any], events: Sequence[NewEvent], d: Dialect, store: Store = _as_is
) -> Unit:
    """A new record's row (in its stored form) with its events, in that order; or
    nothing when its id is taken (the unit changes no row)."""
    texts = _insert_sql(d, tuple(row), len(events))
    rows = [
        [at, store(actor), kind, frm, to, attempt, detail_text(detail)]
        for at, actor, kind, frm, to, attempt, detail in events
    ]
    counted = [row["status"], row["provider"], row["operation"]]
    if d.writes_in_one:
        numbered = [v for n, r in enumerate(rows) for v in (n, *r)]
        return Unit(((texts[0], [*row.values(), *counted, *numbered]),), key=row["action_id"])
    aid = row["action_id"]
    return Unit(
        (
            (texts[0], list(row.values())),
            (texts[1], [v for r in rows for v in (aid, *r)]),
            (texts[2], [*counted, 1]),
        ),
        key=aid,
    )


def count_removed(rec: ActionRecord, d: Dialect, n: int = 1) -> Statement:
    """What a write that removes ``rec`` (and ``n - 1`` more like it: same status,
    provider and operation) from the ledger runs in the same transaction: ``n`` taken
    from their status's count (the writer's own slot)."""
    return render(str(Writes.count_add), d), [str(rec.status), rec.provider, rec.operation, -n]


# -- retention ---------------------------------------------------------------------------------

# What a prune may take (``base.Prunable``): settled, uncontradicted, unscheduled, last
# changed before a time, and no pending callback bound to it.
_PRUNABLE = (
    "contradiction IS NULL AND next_check_at IS NULL AND updated_at < {time}"
    " AND NOT EXISTS (SELECT 1 FROM callbacks c WHERE c.state = 'pending'"
    " AND c.action_id = actions.action_id)"
)


def prunable_where(which: Prunable, d: Dialect) -> tuple[str, list[Any]]:
    """The condition (without ``WHERE``) and arguments of the records ``which`` takes."""
    marks = ", ".join([d.mark] * len(which.statuses))
    sql = f"status IN ({marks}) AND {render(_PRUNABLE, d)}"
    args: list[Any] = [*which.statuses, which.before]
    for name in ("provider", "operation"):
        value = getattr(which, name)
        if value is not None:
            sql += f" AND {name} = {d.mark}"
            args.append(value)
    return sql, args


def prunable_counts(which: Prunable, d: Dialect) -> tuple[str, list[Any]]:
    """A prune's preview: how many records it would take, by status, provider, operation."""
    where, args = prunable_where(which, d)
    return (
        f"SELECT status, provider, operation, count(*) FROM actions WHERE {where}"
        " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        args,
    )


def prune_page(which: Prunable, d: Dialect, after: str, size: int) -> tuple[str, list[Any]]:
    """Up to ``size`` records ``which`` takes with an id after ``after``, in id order,
    their rows locked (a page walked on the key: each batch starts where the last ended)."""
    where, args = prunable_where(which, d)
    sql = f"{SELECT} WHERE action_id > {d.mark} AND {where} ORDER BY action_id LIMIT {d.mark}"
    return sql + render("{lock}", d), [after, *args, int(size)]


def of_ids(head: str, n: int, d: Dialect, tail: str = "") -> str:
    """``head`` followed by ``action_id IN`` a list of ``n`` bound ids, then ``tail``."""
    return f"{head} action_id IN ({', '.join([d.mark] * n)}){tail}"


# -- their arguments and rows ------------------------------------------------------------------


def rivals_args(rec: ActionRecord, limit: int) -> list[Any]:
    return [
        rec.provider,
        rec.operation,
        rec.params_hash,
        rec.action_id,
        rec.dispatched_at,
        rec.dispatched_at,
        limit,
    ]


def ids_args(prefix: str, limit: int) -> list[Any]:
    return [prefix, prefix + "\U0010ffff", int(limit)]


def pending_args(rec: ActionRecord) -> list[Any]:
    return [
        rec.provider,
        rec.action_id,
        rec.action_id,
        rec.reconciliation_key,
        rec.provider_object_id,
    ]


def callback_figures(rows: Sequence[Sequence[Any]]) -> dict[str, CallbackFigures]:
    """The ``callback_figures`` rows, per provider."""
    out: dict[str, CallbackFigures] = {}
    for provider, state, n, oldest in rows:
        f = out.setdefault(provider, CallbackFigures())
        setattr(f, state, int(n))
        if state == "pending":
            f.oldest_pending = oldest
    return out


def pages(records: Sequence[ActionRecord], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """A page of records with the events of their id range (``page_events``), each
    record with its own log, oldest first."""
    logs: dict[str, list[Event]] = {r.action_id: [] for r in records}
    for r in rows:
        if r[1] in logs:
            logs[r[1]].append(event_of(r))
    return [(rec, logs[rec.action_id]) for rec in records]


__all__ = [
    "CALLBACK_COLUMNS",
    "EVENT_COLUMNS",
    "SELECT",
    "NewEvent",
    "Reads",
    "Statement",
    "Unit",
    "Writes",
    "alike",
    "as_is",
    "callback_figures",
    "count_removed",
    "ids_args",
    "insert",
    "insert_unit",
    "move_guard",
    "move_unit",
    "move_update",
    "move_values",
    "named_records",
    "of_ids",
    "pages",
    "pending_args",
    "prunable_counts",
    "prunable_where",
    "prune_page",
    "reads",
    "render",
    "rivals_args",
    "writes",
]
