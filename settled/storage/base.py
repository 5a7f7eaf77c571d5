"""The ledger's interface: every operation the core needs from storage, and the
values that cross it. Code above this line speaks in operations (record, claim,
move, lease a due batch), never in statements: the storage package owns the SQL (every
operation written once in ``sql``, run through each backend's primitives), and each
backend maps its driver's errors to ``settled.errors.LedgerError`` at this boundary.

A ``Move`` (defined in ``settled.model``, the domain's vocabulary) is the one way a
record changes: a guarded status change (checked against the transition table) plus
the fields that go with it and the event that records it, applied only while the
record is still where the mover last saw it. Every backend applies it here.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum, StrEnum
from typing import Any

from ..clock import Clock, from_text
from ..crashpoints import Probe, no_probe
from ..errors import Conflict, NotFound
from ..model import (
    ActionRecord,
    Callback,
    Event,
    Move,
    PendingCallback,
    Reported,
    Status,
)
from .columns import COLUMNS, WRITABLE, from_row, to_row
from .query import SORT_FIELDS

# The record's columns are generated from ``ActionRecord`` in ``columns``, with
# ``to_row`` and ``from_row``; those a move may set (``WRITABLE``) are the model's.


# Statuses a due scan may take: a lost dispatcher, or a record waiting for evidence.
DUE_STATUSES = (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)


@dataclass(frozen=True)
class Selection:
    """Which records a listing wants, in which order; every value is a bound parameter
    (the SQL is ``storage.query``'s, the same on both backends).

    ``match``: a case-insensitive substring of the reason, the contradiction or the
    last event's detail (the provider's own words), searched for as text, never as a
    pattern. ``sort``: one of ``query.SORT_FIELDS`` (``age``: youngest first); ties go
    by creation time, then id; ``reverse`` flips the whole order (``newest_first`` is
    the older name for ``reverse`` of the default). ``limit``: at most that many rows,
    None for all of them; a negative limit is refused (``ValueError``), on every
    backend, rather than read as "all" by one and "none" by another."""

    statuses: Sequence[str] | None = None
    provider: str | None = None
    operation: str | None = None
    created_before: str | None = None
    created_after: str | None = None  # created at or after this time
    ids: Sequence[str] | None = None
    contradicted: bool = False  # only records whose terminal status later evidence contradicts
    also_contradicted: bool = False  # ``statuses``, and every contradicted record as well
    delivery: Sequence[str] | None = None
    match: str | None = None
    sort: str = "created_at"
    reverse: bool = False
    limit: int | None = None
    newest_first: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 0):
            raise ValueError(
                f"limit must be a whole number >= 0, or None for all; got {self.limit!r}"
            )
        if self.sort not in SORT_FIELDS:
            raise ValueError(f"cannot sort by {self.sort!r}; use one of {', '.join(SORT_FIELDS)}")


@dataclass
class DueBatch:
    """What ``lease_due`` did in its one transaction."""

    selected: int = 0  # rows the due scan returned
    leased: list[ActionRecord] = field(default_factory=list)  # next_check_at: the due time
    expired: list[tuple[ActionRecord, Move]] = field(default_factory=list)  # lost dispatchers
    committed: list[bool] = field(default_factory=list)  # the pending moves' guards


def sort_due(
    rows: Sequence[ActionRecord], now: datetime, owner: str
) -> tuple[list[ActionRecord], list[ActionRecord], list[ActionRecord]]:
    """A due batch's rows by what ``lease_due`` does with each, the same on every
    backend: an ``IN_FLIGHT`` row whose dispatch lease still runs is not lost, so only
    its schedule moves to the lease's end (``running``); one whose lease ran out is
    expired (``lapsed``); every other row is leased to ``owner`` (``leased``, its
    ``next_check_at`` still the due time, for ``hand_back``)."""
    running: list[ActionRecord] = []
    lapsed: list[ActionRecord] = []
    leased: list[ActionRecord] = []
    for rec in rows:
        if rec.status is Status.IN_FLIGHT:
            expires = from_text(rec.lease_expires_at)
            (running if expires is not None and expires > now else lapsed).append(rec)
        else:
            rec.lease_owner = owner
            leased.append(rec)
    return running, lapsed, leased


@dataclass
class Figures:
    """Facts about one operation's records, for ``providers audit``."""

    total: int = 0
    confirmed: int = 0
    failed: int = 0
    unresolved: int = 0
    pending: int = 0
    confirmed_by_provider: int = 0
    confirmed_by_reconciliation: int = 0
    confirmed_by_person: int = 0
    checked: int = 0  # records the query ran for at least once
    reconciled_absent: int = 0  # reconciliation proved the effect absent
    proven_replies: int = 0
    unproven_replies: int = 0
    ambiguous_sends: int = 0
    accepted_then_absent: int = 0
    budget_spent: int = 0
    found_by_person: int = 0
    contradictions: int = 0  # terminal records that later evidence contradicts
    confirmed_by_callback: int = 0  # a provider's signed callback reported the effect
    failed_by_callback: int = 0  # callback events that moved a record to FAILED
    callbacks: int = 0  # callback events recorded on this operation's records
    first_seen_n: int = 0
    first_seen_p50: float | None = None
    first_seen_p95: float | None = None
    late: int = 0

    @property
    def unresolved_rate(self) -> float | None:
        return self.unresolved / self.total if self.total else None

    @property
    def observed(self) -> int:
        return self.confirmed_by_reconciliation + self.reconciled_absent

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = asdict(self)
        out["unresolved_rate"] = self.unresolved_rate
        return out


@dataclass(frozen=True)
class Ages:
    """How long open records have waited since they were created, in seconds."""

    n: int = 0
    p50: float | None = None  # nearest rank
    p95: float | None = None
    oldest: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "p50": self.p50, "p95": self.p95, "oldest": self.oldest}


@dataclass(frozen=True)
class StatsCell:
    """How many selected records share a status, provider, operation and grouped
    reason (``query.reason_group``); the oldest one's creation time and one of their
    reasons as written."""

    status: str
    provider: str
    operation: str
    reason_group: str | None
    count: int
    oldest_created_at: str
    example_reason: str | None


@dataclass
class Stats:
    """What ``Ledger.stats`` counted, in one snapshot: the first screen of an incident."""

    total: int = 0
    checks_failing_now: int = 0  # see query.CHECKS_FAILING_NOW
    cells: list[StatsCell] = field(default_factory=list)
    ages: Ages = field(default_factory=Ages)  # every open record selected
    ages_by: dict[str, Ages] = field(default_factory=dict)  # per group of ``by``


def fold_stats(
    totals: Sequence[Any],
    cells: Iterable[Sequence[Any]],
    ages: Iterable[Sequence[Any]],
    ages_by: Iterable[Sequence[Any]] | None,
) -> Stats:
    """The aggregate statements' rows (``query.stats_statements``), the same on both
    backends, as ``Stats``."""

    def age(row: Sequence[Any]) -> Ages:
        _key, n, p50, p95, oldest = row
        return Ages(
            int(n), *(None if v is None else round(float(v), 3) for v in (p50, p95, oldest))
        )

    out = Stats(total=int(totals[0]), checks_failing_now=int(totals[1] or 0))
    out.cells = sorted(
        (
            StatsCell(str(st), str(p), str(o), g, int(n), str(first), ex)
            for st, p, o, g, n, first, ex in cells
        ),
        key=lambda c: (-c.count, c.status, c.provider, c.operation, c.reason_group or ""),
    )
    for row in ages:
        out.ages = age(row)
    for row in ages_by or ():
        out.ages_by[str(row[0])] = age(row)
    return out


Expire = Callable[[ActionRecord], Move]
History = tuple[ActionRecord, list[Event]]  # a record and its event log, oldest first
# How a callback applies to the record it names (``policy.callback``): given the kept
# callback (with the attempt it is bound to, if any) and the record as it is now, the
# move that records it, or None to keep it pending (the record's outcome is not written).
Decide = Callable[[PendingCallback, ActionRecord, datetime], "Move | None"]


class Taken(StrEnum):
    """What became of one callback event at the ledger (its ``reason`` code)."""

    MATCHED = "matched"  # recorded on its record, with any move, in one transaction
    PENDING = "pending"  # kept until its record can take it
    DUPLICATE = "duplicate"  # its event id was recorded before: nothing changed
    AMBIGUOUS = "ambiguous"  # kept pending: several records hold the value it names


RETRY_PENDING = (5.0, 600.0)  # s: a pass retries a pending callback after 5 s, doubling to 10 min


def retry_pending_at(now: datetime, tries: int) -> str:
    """When a pass next tries to match a pending callback that failed ``tries`` times."""
    from ..clock import plus, to_text

    first, most = RETRY_PENDING
    return str(to_text(plus(now, min(first * 2 ** min(tries, 20), most))))


@dataclass
class Sweep:
    """What one pass over the pending callbacks did."""

    examined: int = 0
    matched: list[tuple[PendingCallback, Move]] = field(default_factory=list)
    expired: int = 0


@dataclass
class CallbackFigures:
    """Callbacks of one provider, for ``providers audit``: kept, by state, and the
    records callbacks settled."""

    matched: int = 0
    pending: int = 0
    expired: int = 0
    oldest_pending: str | None = None

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


class SchemaMode(Enum):
    """What opening does with a ledger whose schema is older than this settled's."""

    MIGRATE = "migrate"  # apply the missing steps (the library's default)
    REFUSE = "refuse"  # LedgerOutdated ("run `settled migrate`")
    READ = "read"  # read it as it is when it holds every column settled reads; never write
    AS_IS = "as_is"  # open it as it is (``settled migrate`` itself)


def _open(
    location: str | Any, busy_timeout: float | None, create: bool, mode: SchemaMode, probe: Probe
) -> Ledger:
    import os

    text = os.fspath(location)
    if text.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresLedger

        pg: Ledger = PostgresLedger.connect(
            text, create=create, probe=probe, busy_timeout=busy_timeout, mode=mode
        )
        return pg
    from .sqlite import SqliteLedger

    return SqliteLedger.open_file(
        text, busy_timeout=busy_timeout, create=create, probe=probe, mode=mode
    )


class Ledger(ABC):
    """The store behind everything. Usable without the CLI::

        with Ledger.open("settled.db") as ledger:       # or "postgresql://..."
            record = ledger.get("a-1")

    Every method is one transaction; none returns while one is open. Errors of the
    driver surface as ``settled.errors.LedgerError`` (or a subclass)."""

    location: str  # where it is, fit to show (a URL's password is masked)
    backend: str = ""  # "sqlite" or "postgresql"
    thread_safe = False  # whether several threads may use one ledger object at once
    probe: Probe = no_probe  # crash points, armed by tests through the process entry

    @staticmethod
    def open(
        location: str | Any,
        *,
        busy_timeout: float | None = None,
        create: bool = True,
        migrate: bool = True,
        read_only: bool = False,
        probe: Probe = no_probe,
    ) -> Ledger:
        """Open the ledger at ``location``: a file path (SQLite), or a
        ``postgresql://`` URL. ``create=False`` refuses to create a missing one.

        ``migrate`` (the library's default) applies, as it opens, the schema steps an
        older ledger lacks. ``migrate=False`` refuses an older ledger with
        ``LedgerOutdated`` ("run `settled migrate`"); a missing or empty one is still
        created at the latest schema. ``read_only`` is for code that only reads: it
        never creates, migrates or writes (the file stays byte for byte as it was); an
        older ledger is read when its tables already hold every column settled reads,
        else ``LedgerOutdated``. The CLI opens every ledger with ``migrate=False``."""
        mode = (
            SchemaMode.READ if read_only else SchemaMode.MIGRATE if migrate else SchemaMode.REFUSE
        )
        return _open(location, busy_timeout, create and not read_only, mode, probe)

    @staticmethod
    def open_for_migration(location: str | Any, *, busy_timeout: float | None = None) -> Ledger:
        """Open an existing ledger as it is, whatever its schema (a newer one aside),
        for ``pending_steps``, ``backup`` and ``migrate``: what ``settled migrate``
        does. A missing ledger is a ``LedgerError`` naming its path."""
        return _open(location, busy_timeout, False, SchemaMode.AS_IS, no_probe)

    # -- the schema (rule 18: migrations are explicit and announced) ---------------------

    schema: int = 0  # the schema version when opened (after any migration then)
    latest_schema: int = 0  # the version this settled writes (its backend's last step)

    @abstractmethod
    def schema_version(self) -> int:
        """The schema version now, read again (one cheap read): a running daemon asks
        before each pass, so a newer settled migrating its ledger stops it."""

    @abstractmethod
    def pending_steps(self) -> list[tuple[int, str]]:
        """The schema steps this settled has and the ledger lacks: (number, name), in
        the order ``migrate`` applies them; step N takes the schema from N-1 to N."""

    @abstractmethod
    def migrate(self, announce: Callable[[int, str], None] | None = None) -> list[tuple[int, str]]:
        """Apply every pending step, each in its own transaction, calling ``announce``
        with each step's number and name once it is committed. Returns the steps
        applied here (another process may have applied some first)."""

    def backup(self, target: str) -> None:
        """Write a consistent copy of the ledger to the new file ``target`` (SQLite)."""
        from ..errors import InvalidInput

        raise InvalidInput(
            f"{self.location}: --backup copies SQLite ledgers only; back up a PostgreSQL "
            "ledger with pg_dump (e.g. pg_dump --schema=NAME --format=custom) first"
        )

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...

    # -- reads ---------------------------------------------------------------------------

    @abstractmethod
    def find(self, action_id: str) -> ActionRecord | None: ...

    def get(self, action_id: str) -> ActionRecord:
        rec = self.find(action_id)
        if rec is None:
            raise NotFound(f"no action {action_id!r} in {self.location}")
        return rec

    @abstractmethod
    def events(self, action_id: str) -> list[Event]: ...

    @abstractmethod
    def records(self, selection: Selection | None = None) -> list[ActionRecord]:
        """Records matching ``selection``, oldest first (newest first when asked)."""

    @abstractmethod
    def count(self, selection: Selection | None = None) -> int:
        """How many records match ``selection`` (its limit ignored)."""

    def query(
        self,
        *,
        statuses: Sequence[str] | None = None,
        provider: str | None = None,
        operation: str | None = None,
        created_before: str | None = None,
        limit: int | None = None,
    ) -> list[ActionRecord]:
        """``records`` with keyword filters."""
        return self.records(
            Selection(
                statuses=statuses,
                provider=provider,
                operation=operation,
                created_before=created_before,
                limit=limit,
            )
        )

    def ids(self, prefix: str = "", limit: int = 200) -> list[str]:
        """Action ids that start with ``prefix`` (case-sensitive), in id order: shell
        completion. Backends answer it with a range on the key."""
        found = sorted(r.action_id for r in self.records() if r.action_id.startswith(prefix))
        return found[:limit]

    @abstractmethod
    def stats(
        self, selection: Selection | None = None, *, now: str, by: str | None = None
    ) -> Stats:
        """Counts of the selected records by status, provider, operation and grouped
        reason, and the ages (as of ``now``) of the open ones, overall and per group of
        ``by`` (one of ``query.GROUPS``): aggregates in SQL, one snapshot, no write.
        The selection's order and limit play no part."""

    @abstractmethod
    def names(self) -> list[tuple[str, str]]:
        """Every (provider, operation) the ledger holds records of."""

    @abstractmethod
    def status_counts(self) -> dict[tuple[str, str], int]:
        """Records by (status, provider), for metrics."""

    @abstractmethod
    def check_failures(self) -> dict[str, int]:
        """Open records whose last check could not be made (``check_error``), by
        provider: the verifiers that are broken now (metrics, ``/healthz``)."""

    @abstractmethod
    def rivals(self, rec: ActionRecord, limit: int = 5) -> list[str]:
        """Other actions that asked for the same change (same provider, operation and
        params) and may have made it after ``rec``'s snapshot: sent, not proven never
        sent, and not already observed before ``rec`` was dispatched."""

    @abstractmethod
    def figures(self) -> dict[tuple[str, str], Figures]:
        """Per (provider, operation): the facts ``providers audit`` judges by."""

    @abstractmethod
    def integrity_check(self) -> str: ...

    @abstractmethod
    def clock(self, *, anchor: bool = True) -> Clock:
        """The clock decisions about this ledger's records are made by. ``anchor``
        false: never write to take one (a command that only reads); the wall clock
        stands in until a writer has taken this boot's anchor."""

    # -- writes --------------------------------------------------------------------------

    @abstractmethod
    def record(self, rec: ActionRecord, *, actor: str) -> tuple[ActionRecord, bool]:
        """Insert a new PENDING action with its ``recorded`` event, or find the one
        already under its id: ``(record, created)``. Another action under the same id
        (other params, provider or operation) is a ``Conflict``."""

    @abstractmethod
    def record_and_claim(
        self, rec: ActionRecord, *, actor: str, claim: Move
    ) -> tuple[ActionRecord, bool]:
        """``record`` and, when it created the record, ``claim`` in the same durable
        transaction: ``(claimed record, True)``, or ``(existing record, False)``."""

    @abstractmethod
    def record_and_claim_many(
        self, pairs: Sequence[tuple[ActionRecord, Move]], *, actor: str
    ) -> list[tuple[ActionRecord, bool]]:
        """``record_and_claim`` for a group, in ONE durable transaction (bulk dispatch:
        every claim of the group is committed before any of its requests leaves). One
        result per pair, in order; a ``Conflict`` on one pair rolls back nothing else:
        its result is the existing record with ``False`` — callers compare params."""

    @abstractmethod
    def move(self, move: Move) -> ActionRecord | None:
        """Apply one move in its own transaction: the new record, or None when its
        guard did not hold (the record had moved on)."""

    @abstractmethod
    def commit(self, moves: Sequence[Move]) -> list[bool]:
        """Apply several moves in one transaction (group commit); whether each guard held."""

    @abstractmethod
    def claim_retries(self, pairs: Sequence[tuple[Move, Move]]) -> list[ActionRecord | None]:
        """Bulk retry: for each ``(reopen, claim)`` pair, in ONE durable transaction,
        the reopen (``FAILED → PENDING``, attempt N+1) and, only when its guard held,
        the claim of the new attempt. One result per pair: the claimed record as
        stored, or None when the reopen found the record moved on (nothing written)."""

    @abstractmethod
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
        """In one transaction: apply ``pending`` moves, then take up to ``size``
        records due at ``cutoff`` (``next_check_at <= cutoff``, oldest due first) that
        no one else holds. A dispatch lease that has not lapsed gets its due time put
        right; a lapsed one is moved on by ``expire(record)``; every other row is
        leased to ``owner`` until ``until``, which hides it from other due scans."""

    @abstractmethod
    def lease_one(self, rec: ActionRecord, *, owner: str, until: str, now: str) -> bool:
        """Lease one record for a check now, unless another checker holds it."""

    @abstractmethod
    def hand_back(self, leased: Sequence[ActionRecord], *, owner: str) -> None:
        """Release records leased to ``owner`` unchecked: due again at once."""

    # -- copying a whole ledger (``settled migrate-ledger``) ------------------------------

    @abstractmethod
    def export(self, *, after: str | None = None, limit: int = 500) -> list[History]:
        """Up to ``limit`` records with an id after ``after`` (in byte order of their
        ids), each with its whole event log: a page of the ledger, to copy it."""

    # -- callbacks (rule 16) -------------------------------------------------------------

    @abstractmethod
    def take_callback(
        self, cb: Callback, decide: Decide, *, now: datetime
    ) -> tuple[Taken, Move | None]:
        """Record one verified callback event ONCE (its ``(provider, event_id)`` is a
        unique key shared by every process on the ledger) and, in the same transaction,
        apply it to the record it names when there is exactly one and ``decide`` gives
        a move: the move, its event and the callback's row commit together. Otherwise
        it is kept pending (bound to the record when it is in flight). A redelivery of a
        recorded event id changes nothing (``DUPLICATE``)."""

    @abstractmethod
    def match_callbacks(self, rec: ActionRecord, decide: Decide, *, now: datetime) -> list[Move]:
        """Apply the pending callbacks that name ``rec`` (by the attempt they are bound
        to, or by the value they name), oldest first, each with its move and event in
        one transaction with its row; those that must still wait stay pending. Called
        after an outcome is written: it serialises with ``take_callback`` on the values
        named, so a callback kept while the outcome was being written is found here."""

    @abstractmethod
    def sweep_callbacks(self, decide: Decide, *, now: datetime, size: int) -> Sweep:
        """A reconciler pass's share: up to ``size`` pending callbacks due for another
        try (oldest due first) are matched where they now can be; those past their
        ``expires_at`` become ``expired`` (kept, visible, never applied)."""

    @abstractmethod
    def callback_figures(self) -> dict[str, CallbackFigures]:
        """Per provider: callbacks matched, pending and expired."""

    @abstractmethod
    def pending_callbacks(self, rec: ActionRecord) -> int:
        """How many pending callbacks name ``rec`` (bound to it, or naming one of its
        values): shown by ``show``."""

    @abstractmethod
    def restore(
        self,
        history: Iterable[History],
        *,
        callbacks: Iterable[Sequence[Any]] = (),
        check: Callable[[Any], None] | None = None,
    ) -> int:
        """Write records and their events exactly as they were (ids, times, details),
        and the kept callbacks' rows (``truth.CALLBACK_TABLE_COLUMNS``), all in ONE
        transaction: the copy lands whole or not at all. Only for an empty ledger; an id
        already present is an error. ``check`` is called, before the commit, with a
        view of this ledger's rows inside that transaction (``truth.RowSource``): an
        error it raises leaves the ledger as it was. Returns how many records."""

    # -- history as the truth (rules 17 and 18) ------------------------------------------

    @abstractmethod
    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]:
        """Every row of one table that holds history (``truth.TABLES``), its columns in
        that order, read directly from the table (in key order, or ``order``)."""

    @abstractmethod
    def still(self) -> AbstractContextManager[Still]:
        """Hold the whole ledger still: one transaction in which no other writer can
        change it (SQLite: the write lock; PostgreSQL: the tables locked EXCLUSIVE), for
        a copy to be read, verified and the ledger marked as moved. Committed when the
        block ends, rolled back on an error."""

    @abstractmethod
    def moved(self) -> tuple[str, str] | None:
        """Where this ledger was moved to and when (``migrate-ledger``), or None."""

    def verify(self, on_record: Callable[[int], None] | None = None) -> Any:
        """Every record replayed against its events, and every event without its
        record (``truth.verify``): a ``truth.Verdict``. Reads only."""
        from . import truth

        return truth.verify(self, on_record)

    def _replay_summary(self) -> str:
        """``integrity_check``'s share of rule 18: "ok", or what disagrees."""
        verdict = self.verify()
        if not verdict.findings:
            return "ok"
        n, first = len(verdict.findings), verdict.findings[0].line()
        return f"{n} disagreement{'s' if n != 1 else ''} between records and events; {first}"


class Still(ABC):
    """A ledger held still (``Ledger.still``): read its rows, count its live leases,
    mark it as moved, all in the one transaction that holds it."""

    location: str

    @abstractmethod
    def rows(self, table: str, order: str = "") -> Iterator[tuple[Any, ...]]: ...

    @abstractmethod
    def live_leases(self, now: str) -> int:
        """``IN_FLIGHT`` records whose dispatch lease has not run out at ``now``."""

    @abstractmethod
    def mark_moved(self, to: str, at: str) -> None:
        """Record that the ledger moved to ``to`` at ``at``: from the commit on, the
        database refuses every write of history."""


def moved_message(location: str, to: str, at: str) -> str:
    """The one line a writer of a moved ledger is refused with."""
    return (
        f"ledger {location} was moved to {to} at {at} (migrate-ledger); nothing was "
        f"written here: use --db {to}"
    )


def pending_from_row(row: Mapping[str, Any]) -> PendingCallback:
    """A callbacks row (``CALLBACK_COLUMNS``) as the kept callback it is."""
    cb = Callback(
        provider=row["provider"],
        event_id=row["event_id"],
        scheme=row["scheme"],
        names=row["names"],
        key=row["key"],
        status=row["status"],
        reported=Reported(row["reported"]),
        digest=row["digest"],
        received_at=row["received_at"],
        expires_at=row["expires_at"],
        item=row["item"],
    )
    return PendingCallback(cb, row["action_id"], row["attempt"], int(row["tries"] or 0))


CALLBACK_COLUMNS = (
    "provider",
    "event_id",
    "scheme",
    "names",
    "key",
    "status",
    "reported",
    "digest",
    "received_at",
    "expires_at",
    "item",
    "action_id",
    "attempt",
    "tries",
)


def callback_row(cb: Callback) -> dict[str, Any]:
    """A new callback's row, pending until matched."""
    return {
        "provider": cb.provider,
        "event_id": cb.event_id,
        "scheme": cb.scheme,
        "names": cb.names,
        "key": cb.key,
        "status": cb.status,
        "reported": str(cb.reported),
        "digest": cb.digest,
        "item": cb.item,
        "received_at": cb.received_at,
        "expires_at": cb.expires_at,
        "state": "pending",
    }


def same_action(existing: ActionRecord, new: ActionRecord) -> None:
    """``new`` may only reuse ``existing``'s id when it is the same action."""
    if (
        existing.params_hash != new.params_hash
        or existing.provider != new.provider
        or existing.operation != new.operation
    ):
        what = "params" if existing.params_hash != new.params_hash else "provider/operation"
        raise Conflict(
            f"action {new.action_id} already exists with different {what}; use another --action-id"
        )


# -- rows ----------------------------------------------------------------------------------

# What the reads of settled (``show``, ``queue``, ``stats``, ``providers audit``) select,
# by table: an older ledger whose tables hold all of these is read as it is by a
# read-only open; one that lacks any is refused with "run `settled migrate`".
READ_COLUMNS: dict[str, tuple[str, ...]] = {
    "actions": COLUMNS,
    "events": (
        "id",
        "action_id",
        "at",
        "actor",
        "kind",
        "from_status",
        "to_status",
        "attempt",
        "detail",
    ),
    "callbacks": (*CALLBACK_COLUMNS, "state", "matched_at", "next_check_at"),
}


def missing_for_reads(
    found: Mapping[str, set[str]], needed: Mapping[str, tuple[str, ...]] = READ_COLUMNS
) -> list[str]:
    """The ``table.column`` names settled reads that ``found`` (columns by table) lacks."""
    return [
        f"{table}.{column}"
        for table, columns in needed.items()
        for column in columns
        if column not in found.get(table, set())
    ]


def event_detail_text(detail: Mapping[str, Any]) -> str:
    return json.dumps(detail, default=str)


def recorded_detail(rec: ActionRecord) -> dict[str, Any]:
    """The ``recorded`` event's evidence: the strategy fixed before anything leaves."""
    return {
        "tier": str(rec.tier),
        "reconciliation_key": rec.reconciliation_key,
        "eligible_at": rec.eligible_at,
        "requires_manual_verification": rec.requires_manual_verification,
    }


__all__ = [
    "CALLBACK_COLUMNS",
    "COLUMNS",
    "DUE_STATUSES",
    "WRITABLE",
    "Ages",
    "CallbackFigures",
    "Decide",
    "DueBatch",
    "Expire",
    "Figures",
    "History",
    "Ledger",
    "Move",
    "Selection",
    "Stats",
    "StatsCell",
    "Still",
    "Sweep",
    "Taken",
    "callback_row",
    "fold_stats",
    "from_row",
    "moved_message",
    "pending_from_row",
    "retry_pending_at",
    "same_action",
    "sort_due",
    "to_row",
]
