"""The ledger's statements, written once: the named reads (and the writes that are the
same SQL on both backends) that both backends run, and the rows they return turned
into values. A statement marks its parameters with ``?``;
``render`` writes it in a backend's ``query.Dialect`` (``%s`` for psycopg), with the
few fragments that differ filled in:

- ``{time}``: a bound time that may be NULL (PostgreSQL must be told its type);
- ``{lock}``: the row lock a read inside a write transaction takes (``FOR UPDATE``
  on PostgreSQL; nothing on SQLite, whose write transaction holds the whole file).

The listings and the figures of ``settled stats`` are built from a ``Selection`` in
``query``; the audit's aggregates are in ``audit_sql``. Every value is a bound
parameter; the only names spliced in are column names from fixed tables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..model import CALLBACK_NAMES, ActionRecord, Event
from .base import CALLBACK_COLUMNS, CallbackFigures, Move
from .columns import COLUMNS
from .query import Dialect

SELECT = f"SELECT {', '.join(COLUMNS)} FROM actions"
EVENT_COLUMNS = (
    "id",
    "action_id",
    "at",
    "actor",
    "kind",
    "from_status",
    "to_status",
    "attempt",
    "detail",
)
_EVENTS = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events"
_CALLBACKS = f"SELECT {', '.join(CALLBACK_COLUMNS)} FROM callbacks"

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
    names: str = "SELECT DISTINCT provider, operation FROM actions ORDER BY 1, 2"
    status_counts: str = "SELECT status, provider, count(*) FROM actions GROUP BY 1, 2"
    check_failures: str = (
        "SELECT provider, count(*) FROM actions WHERE check_error IS NOT NULL"
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
    pending_for: str = f"{_CALLBACKS} WHERE {_NAMING} ORDER BY received_at, event_id{{lock}}"


@dataclass(frozen=True)
class Writes:
    """The named write statements both backends run as they are, in one dialect. A
    move's guarded update (``move_update``) and the inserts are built per call: their
    columns are the move's, or the row's."""

    # lease one record for a check now, unless another checker holds it
    lease_one: str = (
        "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?"
        " AND status = ? AND (lease_owner IS NULL OR next_check_at IS NULL"
        " OR next_check_at <= ?)"
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
    # by each value a callback may name its record by (``model.CALLBACK_NAMES``)
    named_record: str = f"{SELECT} WHERE provider = ? AND {{names}} = ? LIMIT 2{{lock}}"


def named_records(writes: Writes) -> dict[str, str]:
    """``Writes.named_record`` for each name a callback may use (column names from a
    fixed list, never input)."""
    return {n: writes.named_record.replace("{names}", n) for n in CALLBACK_NAMES}


def insert(table: str, names: Sequence[str], conflict: str, d: Dialect) -> str:
    """An insert of one row of ``names`` that does nothing when ``conflict`` (the key's
    columns) is taken."""
    marks = ", ".join([d.mark] * len(names))
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})"
        f" ON CONFLICT ({conflict}) DO NOTHING"
    )


def move_values(m: Move) -> dict[str, Any]:
    """What a move writes to the row: its values, its new status unless it changes
    nothing, its time."""
    values = dict(m.values)
    if m.kind is not None and not m.kind.changes_nothing:
        values["status"] = str(m.to)
    values["updated_at"] = m.at
    return values


def move_guard(m: Move, d: Dialect) -> tuple[str, list[Any]]:
    """Where a move applies: only while the record is where the mover saw it (status,
    and lease owner, attempt and contradiction when given)."""
    mark = d.mark
    where = f"action_id = {mark} AND status = {mark}"
    args: list[Any] = [m.action_id, str(m.frm)]
    if m.owner is not None:
        where += f" AND lease_owner = {mark}"
        args.append(m.owner)
    if m.attempt is not None:
        where += f" AND attempt = {mark}"
        args.append(m.attempt)
    if m.correction:
        where += " AND contradiction IS NOT NULL"
    return where, args


def move_update(
    m: Move, d: Dialect, guard: tuple[str, list[Any]] | None = None
) -> tuple[str, list[Any]]:
    """A move's guarded ``UPDATE`` (no ``RETURNING``): ``move_values`` where
    ``move_guard`` holds, or where ``guard`` says (a caller that checked it already)."""
    values = move_values(m)
    where, args = guard if guard is not None else move_guard(m, d)
    sets = ", ".join(f"{k} = {d.mark}" for k in values)
    return f"UPDATE actions SET {sets} WHERE {where}", [*values.values(), *args]


def render(template: str, d: Dialect) -> str:
    """``template`` in dialect ``d``."""
    assert "%" not in template  # psycopg would read it as a placeholder
    text = template.format(time=d.time_mark, lock=d.lock)
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


def event_from_row(r: Sequence[Any]) -> Event:
    """An events row (``EVENT_COLUMNS``) as its event."""
    return Event(
        id=r[0],
        action_id=r[1],
        at=r[2],
        actor=r[3],
        kind=r[4],
        from_status=r[5],
        to_status=r[6],
        attempt=r[7],
        detail=json.loads(r[8]),
    )


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
            logs[r[1]].append(event_from_row(r))
    return [(rec, logs[rec.action_id]) for rec in records]


__all__ = [
    "EVENT_COLUMNS",
    "SELECT",
    "Reads",
    "Writes",
    "callback_figures",
    "event_from_row",
    "ids_args",
    "insert",
    "move_update",
    "named_records",
    "pages",
    "pending_args",
    "reads",
    "render",
    "rivals_args",
    "writes",
]
