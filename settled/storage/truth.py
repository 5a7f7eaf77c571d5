"""What a ledger holds, read from its own rows: the digest that verifies a copy
(rule 17) and the replay of each record's events against its fields (rule 18).

Both read the tables directly, row by row, through the backend's own cursor
(``Ledger.rows``), never through the export a copy is made from: a count and a digest
taken from the rows that were copied always agree with the copy, whatever the export
missed. A row that cannot be read as what it must be (JSON that does not parse, a
status that is no status) is a ``Damaged`` row, named by its ledger, table and key.

    Digest           per table: rows and a SHA-256 over them, in key order
    digest(ledger)   the digest of every table that holds history
    replay(rec, log) every disagreement between a record and its events
    verify(ledger)   the replay of every record, and every event without its record

This module is pure over rows; the backends own the SQL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..model import (
    CORRECTIONS,
    EVIDENCE_CORRECTIONS,
    REDACTED,
    TERMINAL,
    TRANSITIONS,
    Acceptance,
    ActionRecord,
    Delivery,
    Event,
    EventKind,
    Status,
)
from . import columns
from .columns import BOOLEAN, from_row
from .ledger import Damaged, History

_TABLES = columns.TABLES

# Every table that holds history, its columns and its key (the order rows are read in).
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    name: (t.names, t.key) for name, t in _TABLES.items()
}
# The columns that hold JSON text, and flags (0/1 on SQLite, booleans on PostgreSQL).
_JSON = {
    name: tuple(c.name for c in t.columns if c.codec.kind == "json") for name, t in _TABLES.items()
}
_FLAGS = {
    name: tuple(c.name for c in t.columns if c.codec is BOOLEAN) for name, t in _TABLES.items()
}


class RowSource(Protocol):
    location: str

    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]: ...


def canonical(location: str, table: str, row: Sequence[Any]) -> tuple[Any, ...]:
    """One stored row as both backends read it alike: flags as 0/1, JSON text parsed
    and written again with sorted keys. Raises ``Damaged`` naming the row."""
    names, key = TABLES[table]
    values = dict(zip(names, row, strict=True))
    where = ", ".join(f"{k} {values[k]!r}" for k in key)
    for name in _FLAGS.get(table, ()):
        if values[name] is not None:
            values[name] = int(bool(values[name]))
    for name in _JSON.get(table, ()):
        text = values[name]
        if text is None:
            continue
        try:
            values[name] = json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise Damaged(
                f"ledger {location} is damaged: {table} row {where} holds unreadable "
                f"{name} ({type(exc).__name__}: {exc})"
            ) from None
    if table == "actions":
        try:
            from_row(values)
        except (KeyError, TypeError, ValueError) as exc:
            raise Damaged(
                f"ledger {location} is damaged: {table} row {where} cannot be read "
                f"({type(exc).__name__}: {exc})"
            ) from None
    return tuple(values[c] for c in names)


@dataclass
class TableDigest:
    rows: int = 0
    _sha: Any = field(default_factory=hashlib.sha256, repr=False)

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows += 1
        self._sha.update(json.dumps(row, ensure_ascii=False, default=str).encode() + b"\n")

    @property
    def sha256(self) -> str:
        return str(self._sha.hexdigest())


@dataclass
class Digest:
    """What a ledger holds, per table: how many rows and a SHA-256 over them."""

    tables: dict[str, TableDigest] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {name: {"rows": t.rows, "sha256": t.sha256} for name, t in self.tables.items()}

    def differences(self, other: Digest) -> list[str]:
        out = []
        for name in TABLES:
            a, b = self.tables[name], other.tables[name]
            if a.rows != b.rows:
                out.append(f"{name}: {a.rows} rows against {b.rows}")
            elif a.sha256 != b.sha256:
                out.append(f"{name}: same {a.rows} rows, different content")
        return out


def digest(source: RowSource) -> Digest:
    """Every table that holds history, read row by row from ``source`` in key order."""
    d = Digest()
    for table in TABLES:
        t = d.tables[table] = TableDigest()
        for row in source.rows(table):
            t.add(canonical(source.location, table, row))
    return d


def histories(source: RowSource) -> Iterator[History]:
    """Every record with its events, in id order, read from the rows (two cursors
    walked side by side: records by id, events by record and id)."""
    events = source.rows("events", "action_id, id")
    pending: tuple[Any, ...] | None = next(events, None)
    for row in source.rows("actions"):
        canonical(source.location, "actions", row)  # a damaged row is named, not a traceback
        rec = columns.from_values(row)
        log: list[Event] = []
        while pending is not None and pending[1] < rec.action_id:  # an event without its record
            pending = next(events, None)
        while pending is not None and pending[1] == rec.action_id:
            log.append(event_of(source.location, pending))
            pending = next(events, None)
        yield rec, log


def event_of(location: str, row: Sequence[Any]) -> Event:
    """An events row as its event, once ``canonical`` has found it readable."""
    canonical(location, "events", row)
    return columns.event_of(row)


# -- rule 18: history is the truth of state ------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One field of one record that its events disagree with."""

    action_id: str
    field: str
    record: Any  # what the record says
    events: Any  # what its events say
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "field": self.field,
            "record": self.record,
            "events": self.events,
            "why": self.why,
        }

    def line(self) -> str:
        text = (
            f"{self.action_id}: {self.field}: record says {self.record}, events say {self.events}"
        )
        return f"{text} ({self.why})" if self.why else text


def replay(rec: ActionRecord, log: Sequence[Event]) -> list[Finding]:
    """Every disagreement between ``rec`` and its event log: the log starts with the
    recording, each event moves from where the one before left the record and only by
    the transition table; status and attempt are the last event's; delivery,
    acceptance and ``confirmed_by`` are what the status the log reached allows."""
    aid = rec.action_id
    out: list[Finding] = []
    if not log:
        return [Finding(aid, "status", str(rec.status), "nothing", "the record has no events")]
    first = log[0]
    if (first.kind, first.from_status, first.to_status) != ("recorded", None, "PENDING"):
        out.append(
            Finding(
                aid,
                "events",
                "recorded → PENDING first",
                f"{first.kind} {first.from_status} → {first.to_status}",
                f"event {first.id} is not the recording",
            )
        )
    state = first.to_status
    for ev in log[1:]:
        if ev.from_status != state:
            out.append(
                Finding(
                    aid,
                    "events",
                    f"from {state}",
                    f"from {ev.from_status}",
                    f"event {ev.id} ({ev.kind}) starts where the log was not",
                )
            )
        try:
            move = (Status(str(ev.from_status)), Status(ev.to_status))
        except ValueError:
            out.append(
                Finding(
                    aid,
                    "events",
                    "a status",
                    f"{ev.from_status} → {ev.to_status}",
                    f"event {ev.id} names no status",
                )
            )
            state = ev.to_status
            continue
        same = move[0] is move[1]
        allowed = (
            move in TRANSITIONS
            or (ev.kind == EventKind.NOTE and same)
            or (ev.kind == EventKind.CALLBACK and same)
            or (ev.kind == EventKind.RESOLVED and move in CORRECTIONS)
            or (ev.kind == EventKind.RECONCILED and move in EVIDENCE_CORRECTIONS)
            or (ev.kind == EventKind.REDACTED and same and move[0] in TERMINAL)
        )
        if not allowed:
            out.append(
                Finding(
                    aid,
                    "events",
                    "a move of the table",
                    f"{ev.kind} {move[0]} → {move[1]}",
                    f"event {ev.id} is not an allowed move",
                )
            )
        state = ev.to_status
    last = log[-1]
    if str(rec.status) != state:
        out.append(
            Finding(
                aid,
                "status",
                str(rec.status),
                state,
                f"the last event ({last.id}, {last.kind}) leaves it {state}",
            )
        )
    if rec.attempt != last.attempt:
        out.append(
            Finding(
                aid,
                "attempt",
                rec.attempt,
                last.attempt,
                f"the last event ({last.id}) is of attempt {last.attempt}",
            )
        )
    try:
        reached = Status(state)
    except ValueError:
        return out
    out += _axes(rec, reached, last)
    if reached is Status.CONFIRMED and rec.confirmed_by:
        out += _confirmed_by(rec, log)
    return out + _redacted(rec, log)


# -- redactions: what a ``redacted`` event erased stays erased -----------------------------


def pointer(path: str) -> list[str]:
    """A JSON pointer's tokens (``/a/b``; a bare name is a top-level key; ``""`` all)."""
    if not path:
        return []
    if not path.startswith("/"):
        return [path]
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def leaves(value: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every value under ``value`` that is not erased: (its pointer, the value)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{where}/{str(k).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{where}/{i}")
    elif value is not None and value != REDACTED:
        yield where, value


def _redacted(rec: ActionRecord, log: Sequence[Event]) -> list[Finding]:
    """Where the params hold a value again under a pointer a ``redacted`` event erased."""
    out = []
    for ev in log:
        if ev.kind != EventKind.REDACTED:
            continue
        for path in ev.detail.get("fields", ()):
            node: Any = rec.params
            for t in pointer(str(path)):
                if isinstance(node, dict) and t in node:
                    node = node[t]
                elif isinstance(node, list) and t.isdigit() and int(t) < len(node):
                    node = node[int(t)]
                else:
                    node = None  # the shape is not the one erased: no value is there
                    break
            if next(leaves(node, str(path)), None) is not None:
                out.append(
                    Finding(
                        rec.action_id,
                        "params",
                        f"a value at {path or '/'}",
                        REDACTED,
                        f"event {ev.id} redacted it",
                    )
                )
    return out


# Who a confirming event says confirmed the record: the provider's reply, a query, or
# whoever wrote the event (a person's verdict, a provider's callback).
_CONFIRMED_BY = {
    EventKind.OUTCOME: "provider",
    EventKind.LATE_OUTCOME: "provider",
    EventKind.RECONCILED: "reconciliation",
}


def _confirmed_by(rec: ActionRecord, log: Sequence[Event]) -> list[Finding]:
    """``confirmed_by`` is what the event that moved the record to CONFIRMED says."""
    moved = [e for e in log if e.to_status == "CONFIRMED" and e.from_status != "CONFIRMED"]
    if not moved:
        return []
    ev = moved[-1]
    try:
        says = _CONFIRMED_BY.get(EventKind(ev.kind), ev.actor)
    except ValueError:
        says = ev.actor
    if rec.confirmed_by == says:
        return []
    return [
        Finding(
            rec.action_id,
            "confirmed_by",
            rec.confirmed_by,
            says,
            f"event {ev.id} ({ev.kind}) confirmed it",
        )
    ]


# What each status the log may reach allows on the other axes (None: any value).
_AXES: dict[
    Status, tuple[frozenset[Delivery] | None, frozenset[Acceptance] | None, bool | None]
] = {
    Status.PENDING: (frozenset({Delivery.PENDING}), frozenset({Acceptance.UNKNOWN}), False),
    Status.IN_FLIGHT: (frozenset({Delivery.IN_FLIGHT}), frozenset({Acceptance.UNKNOWN}), False),
    Status.AWAITING_VERIFICATION: (None, frozenset({Acceptance.UNKNOWN}), None),
    Status.CONFIRMED: (None, frozenset({Acceptance.APPLIED}), True),
    Status.FAILED: (None, frozenset({Acceptance.NOT_APPLIED}), None),
    Status.DENIED_UNRESOLVED: (None, frozenset({Acceptance.UNKNOWN}), None),
}


def _axes(rec: ActionRecord, reached: Status, last: Event) -> list[Finding]:
    aid, out = rec.action_id, []
    deliveries, acceptances, confirmed = _AXES[reached]
    why = f"the events leave it {reached}"
    if deliveries is not None and rec.delivery not in deliveries:
        out.append(
            Finding(
                aid, "delivery", str(rec.delivery), " or ".join(sorted(map(str, deliveries))), why
            )
        )
    if acceptances is not None and rec.acceptance not in acceptances:
        out.append(
            Finding(
                aid,
                "acceptance",
                str(rec.acceptance),
                " or ".join(sorted(map(str, acceptances))),
                why,
            )
        )
    if confirmed is True and not rec.confirmed_by:
        out.append(Finding(aid, "confirmed_by", rec.confirmed_by, "who confirmed it", why))
    if confirmed is False and rec.confirmed_by is not None:
        out.append(Finding(aid, "confirmed_by", rec.confirmed_by, "nobody yet", why))
    return out


@dataclass(frozen=True)
class CountFinding:
    """One count the writes keep (records of a status, provider and operation) that a
    recount of the records disagrees with."""

    status: str
    provider: str
    operation: str
    kept: int
    recounted: int

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "provider": self.provider,
            "operation": self.operation,
            "kept": self.kept,
            "recounted": self.recounted,
        }

    def line(self) -> str:
        return (
            f"count of {self.status} {self.provider}/{self.operation}: kept {self.kept},"
            f" records recounted {self.recounted}"
        )


def count_findings(
    kept: Iterable[Sequence[Any]], recounted: Iterable[Sequence[Any]]
) -> list[CountFinding]:
    """Every (status, provider, operation) whose kept count (``Reads.counts`` rows)
    differs from the recount of the records (``Reads.recount`` rows)."""
    a = {(str(r[0]), str(r[1]), str(r[2])): int(r[3]) for r in kept}
    b = {(str(r[0]), str(r[1]), str(r[2])): int(r[3]) for r in recounted}
    return [
        CountFinding(*key, a.get(key, 0), b.get(key, 0))
        for key in sorted(set(a) | set(b))
        if a.get(key, 0) != b.get(key, 0)
    ]


Checkpoint = tuple[int, int, "str | None"]  # (established, seen, snapshot): verify's mark


def _in_progress(snapshot: str) -> tuple[int, int, bool]:
    """A PostgreSQL snapshot's text ("xmin:xmax:xip,…"): xmin, xmax, and whether any
    transaction was in progress."""
    xmin, xmax, xip = snapshot.split(":")
    return int(xmin), int(xmax), bool(xip)


def established(prev: Checkpoint | None, top: int, snapshot: str | None) -> int:
    """The event id up to which every event is final and its record checked, once a run
    that read ``snapshot`` (its newest event ``top``) has checked every record with an
    event after the previous run's ``established`` (``prev``).

    Ids are numbered in order as events are written, but on PostgreSQL transactions
    commit in any order: an event below ``top`` may belong to a transaction still in
    progress, invisible to this run. So the mark moves to ``top`` only when no
    transaction was in progress at the snapshot (SQLite's one writer: never, its
    snapshot is None); else to the previous run's ``seen`` once every transaction in
    progress at the previous run's snapshot had ended before this one's (what they
    wrote is visible here, and was checked, as it is after ``established``); else it
    stays. Time plays no part: a clock may step back, a sequence does not."""
    since = prev[0] if prev else 0
    if snapshot is None or not _in_progress(snapshot)[2]:
        return max(since, top)
    if prev is not None and (
        prev[2] is None or _in_progress(snapshot)[0] >= _in_progress(prev[2])[1]
    ):
        return max(since, prev[1])
    return since


def verify_some(
    location: str,
    ids: Sequence[str],
    rows: Iterable[Sequence[Any]],
    events: Iterable[Sequence[Any]],
    into: Verdict,
    on_record: Callable[[int], None] | None = None,
) -> None:
    """The records ``ids`` (their ``rows``, and all their ``events``) replayed into the
    verdict ``into``; an id with events and no record is a finding."""
    logs: dict[str, list[Event]] = {}
    for e in events:
        logs.setdefault(str(e[1]), []).append(event_of(location, e))
    found: set[str] = set()
    for row in rows:
        canonical(location, "actions", row)
        rec = columns.from_values(row)
        log = logs.get(rec.action_id, [])
        found.add(rec.action_id)
        into.records += 1
        into.events += len(log)
        into.findings += replay(rec, log)
        if on_record is not None:
            on_record(into.records)
    for aid in ids:
        if aid in found:
            continue
        for orphan in logs.get(aid, []):
            into.events += 1
            into.findings.append(
                Finding(aid, "record", "missing", f"event {orphan.id}", _NO_RECORD)
            )


_NO_RECORD = "an event whose record is not in the ledger"


@dataclass
class Verdict:
    """What ``verify`` found: how much it read, every disagreement, and every kept
    count a recount disagrees with."""

    records: int = 0
    events: int = 0
    findings: list[Finding] = field(default_factory=list)
    counts: list[CountFinding] = field(default_factory=list)
    # "full": every record; "incremental": those with an event after ``since`` (an
    # event id), each checked once after its last event
    mode: str = "full"
    since: int | None = None
    checkpoint: int | None = None  # the event id stored for the next run (None: not stored)

    @property
    def ok(self) -> bool:
        return not self.findings and not self.counts

    def lines(self) -> list[str]:
        """One line per finding: the records', then the counts'."""
        return [f.line() for f in self.findings] + [c.line() for c in self.counts]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "since_event": self.since,
            "checkpoint_event": self.checkpoint,
            "records": self.records,
            "events": self.events,
            "ok": self.ok,
            "findings": [f.to_json() for f in self.findings],
            "counts": {"ok": not self.counts, "wrong": [c.to_json() for c in self.counts]},
        }

    def summary(self) -> str:
        changed = f" (those with an event after {self.since})" if self.mode == "incremental" else ""
        head = f"checked {self.records} records{changed} and {self.events} events"
        n = len(self.findings)
        text = (
            f"{head}: {n} disagreement{'s' if n != 1 else ''}" if n else f"{head}: no disagreement"
        )
        if self.counts:
            k = len(self.counts)
            text += f"; {k} count{'s' if k != 1 else ''} wrong"
        return text


def verify(source: RowSource, on_record: Callable[[int], None] | None = None) -> Verdict:
    """Replay every record of ``source`` against its events, and find every event whose
    record is missing. Reads rows directly; a damaged row raises ``Damaged``."""
    v = Verdict()
    known: set[str] = set()
    for rec, log in histories(source):
        v.records += 1
        v.events += len(log)
        known.add(rec.action_id)
        v.findings += replay(rec, log)
        if on_record is not None:
            on_record(v.records)
    for row in source.rows("events", "action_id, id"):
        if row[1] not in known:
            v.events += 1
            v.findings.append(
                Finding(
                    str(row[1]),
                    "record",
                    "missing",
                    f"event {row[0]}",
                    _NO_RECORD,
                )
            )
    return v


def orphans(source: RowSource, known: Iterable[str] | None = None) -> list[tuple[Any, Any]]:
    """Events whose record is not in ``source``: (event id, action id)."""
    ids = set(known) if known is not None else {r[0] for r in source.rows("actions")}
    return [(r[0], r[1]) for r in source.rows("events") if r[1] not in ids]


__all__ = [
    "TABLES",
    "Checkpoint",
    "CountFinding",
    "Damaged",
    "Digest",
    "Finding",
    "RowSource",
    "TableDigest",
    "Verdict",
    "canonical",
    "count_findings",
    "digest",
    "established",
    "histories",
    "leaves",
    "orphans",
    "pointer",
    "replay",
    "verify",
    "verify_some",
]
