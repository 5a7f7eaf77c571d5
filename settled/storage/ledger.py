"""The ledger's interface: every operation the core needs from storage, and the
values that cross it. Code above this line speaks in operations (record, claim,
move, lease a due batch), never in statements: the storage package owns the SQL (every
operation written once in ``sql``, run through each backend's primitives), and each
backend maps its driver's errors to ``settled.errors.LedgerError`` at this boundary.

A ``Move`` (defined in ``settled.model``, the domain's vocabulary) is the one way a
record changes: a guarded status change (checked against the transition table) plus
the fields that go with it and the event that records it, applied only while the
record is still where the mover last saw it. Every backend applies it here.

This module knows no backend: ``Ledger.open`` asks the opener that the package
(``settled.storage``, which does know them) sets, so the interface and its backends
import each other in one direction only.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum, StrEnum
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from ..clock import Clock, from_text, plus, to_text
from ..crashpoints import Probe, no_probe
from ..errors import Conflict, InvalidInput, LedgerError, LedgerOutdated, NotFound
from ..model import ActionRecord, Callback, Event, Move, PendingCallback, Status
from .columns import CALLBACK_COLUMNS, COLUMNS, TABLES, WRITABLE, from_row, to_row
from .event_log import LogFilter
from .query import SORT_FIELDS

# The record's columns are generated from ``ActionRecord`` in ``columns``, with
# ``to_row`` and ``from_row``; those a move may set (``WRITABLE``) are the model's.


# Statuses a due scan may take: a lost dispatcher, or a record waiting for evidence.
DUE_STATUSES = (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)
# the same, as the SQL list a due scan filters on (the enum's values: never user input)
DUE_SQL = "(" + ", ".join(f"'{s.value}'" for s in DUE_STATUSES) + ")"


@dataclass(frozen=True)
class Selection:
    """Which records a listing wants, in which order; every value is a bound parameter
    (the SQL is ``storage.query``'s, the same on both backends).

    ``match``: a case-insensitive substring of the reason, the contradiction, the
    last event's detail (the provider's own words) or the cause (``http 503``), searched for as text, never as a
    pattern. ``search``: words (``query.search_terms``), each found, in any case,
    somewhere in the record's id, its params' values or its reason, through the
    ledger's search index. ``sort``: one of ``query.SORT_FIELDS`` (``age``: youngest first); ties go
    by creation time, then id; ``reverse`` flips the whole order (``newest_first`` is
    the older name for ``reverse`` of the default). ``limit``: at most that many rows,
    None for all of them; a negative limit is refused (``ValueError``), on every
    backend, rather than read as "all" by one and "none" by another. ``after`` /
    ``before``: the key values of a cursor (``query.read_cursor``): only the rows after
    (or before) it in this order, still in this order; ``count`` ignores them."""

    statuses: Sequence[str] | None = None
    provider: str | None = None
    operation: str | None = None
    created_before: str | None = None
    created_after: str | None = None  # created at or after this time
    ids: Sequence[str] | None = None
    contradicted: bool = False  # only records whose terminal status later evidence contradicts
    also_contradicted: bool = False  # ``statuses``, and every contradicted record as well
    # ``statuses``, and every open record whose last check could not be made as well
    # (``check_error``: its provider asked for a pause, or could not be reached)
    also_failing: bool = False
    delivery: Sequence[str] | None = None
    match: str | None = None
    search: str | None = None
    causes: Sequence[str] | None = None  # ``settled.cause`` codes; "contradicted" included
    sort: str = "created_at"
    reverse: bool = False
    limit: int | None = None
    newest_first: bool = False
    after: Sequence[Any] | None = None
    before: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 0):
            raise ValueError(
                f"limit must be a whole number >= 0, or None for all; got {self.limit!r}"
            )
        if self.after is not None and self.before is not None:
            raise ValueError("a page is read after one cursor or before one, not both")
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


# The statuses a record may be pruned in: settled, nothing more can happen to it.
SETTLED_STATUSES = (Status.CONFIRMED, Status.FAILED)


@dataclass(frozen=True)
class Prunable:
    """Which records a prune takes: settled (``statuses``, a subset of
    ``SETTLED_STATUSES``), last changed before ``before`` (their ``updated_at``: no
    event for that long), of ``provider``/``operation`` when given; never a
    contradicted one, one still scheduled for a check, or one a pending callback is
    bound to. Every value is a bound parameter."""

    before: str
    statuses: tuple[str, ...] = tuple(str(s) for s in SETTLED_STATUSES)
    provider: str | None = None
    operation: str | None = None

    def __post_init__(self) -> None:
        bad = set(self.statuses) - {str(s) for s in SETTLED_STATUSES}
        if bad or not self.statuses:
            raise ValueError(
                f"only settled records are pruned (CONFIRMED, FAILED); not {sorted(bad)}"
            )


@dataclass
class PruneBatch:
    """What one batch of a prune did in its one transaction: the records it took (in
    id order, each with its whole event log), the audit row that allowed it (its id
    in ``ledger_events``) and the last id, where the next batch starts."""

    histories: list[History] = field(default_factory=list)
    run: int | None = None

    @property
    def last(self) -> str | None:
        return self.histories[-1][0].action_id if self.histories else None

    @property
    def events(self) -> int:
        return sum(len(log) for _, log in self.histories)


@dataclass(frozen=True)
class LedgerEvent:
    """An event of the ledger itself (``ledger_events``): a run that concerned many
    records, such as one batch of a prune. Append-only, like every event."""

    id: int
    at: str
    actor: str
    kind: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Erasure:
    """What a redaction writes, in one transaction (``Ledger.redact``): the
    ``redacted`` event (by ``actor`` at ``at``, with ``detail``), the record's new
    ``params`` (canonical JSON text), ``reason`` and ``snapshot`` (JSON text), and
    the new detail of each earlier event that repeated an erased value."""

    at: str
    actor: str
    detail: Mapping[str, Any]
    params: str
    reason: str | None
    snapshot: str | None
    details: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)


# Given a settled record and its events, the erasure to write (None: nothing to erase).
Erase = Callable[[ActionRecord, list[Event]], "Erasure | None"]
# Given one batch of records with their logs, inside its transaction: write them to the
# archive, durably, and say what the batch's audit row records (``Ledger.prune_batch``).
Keep = Callable[[list["History"]], Mapping[str, Any]]


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
        return asdict(self)


@dataclass(frozen=True)
class PostgresSettings:
    """How a PostgreSQL ledger holds its connections (``[postgres]`` in settled.toml;
    docs/postgres.md, "Connections"). ``pool_min``: connections kept open, the one
    made when the ledger opens included; ``pool_max``: the most one ledger object holds
    at once (threads beyond it wait up to ``busy_timeout`` for one, then
    ``LedgerBusy``). ``pgbouncer``: the connections go through PgBouncer in
    transaction mode, so no session state may outlive a transaction: no session
    ``SET``, no server-side prepared statements. SQLite ignores all three."""

    pool_min: int = 1
    pool_max: int = 2
    pgbouncer: bool = False


class SchemaMode(Enum):
    """What opening does with a ledger whose schema is older than this settled's."""

    MIGRATE = "migrate"  # apply the missing steps (the library's default)
    REFUSE = "refuse"  # LedgerOutdated ("run `settled migrate`")
    READ = "read"  # read it as it is when it holds every column settled reads; never write
    AS_IS = "as_is"  # open it as it is (``settled migrate`` itself)


def version_after(steps: Sequence[tuple[str, Any]], suffix: str) -> int:
    """The schema version a ledger has once the step named ``NNN_<suffix>`` is applied:
    its place in ``steps``, so a feature that needs a step asks by name, and the numbers
    may move when steps are added beside it."""
    for number, (name, _step) in enumerate(steps, 1):
        if name.split("_", 1)[1] == suffix:
            return number
    raise LookupError(f"no schema step named *_{suffix}")


def check_schema(
    where: str, found: int, latest: int, mode: SchemaMode, unreadable: Callable[[], list[str]]
) -> bool:
    """What opening does with a ledger of schema ``found`` (this settled writes
    ``latest``): whether to migrate it now; a newer one, and an older one ``mode``
    refuses, raise. ``unreadable``: the columns settled reads that it lacks."""
    if found > latest:
        try:
            ours = version("settled")
        except PackageNotFoundError:  # a source tree that was never installed
            ours = "0+unknown"
        raise LedgerError(
            f"{where} was written by a newer settled (schema {found}; settled {ours} "
            f"writes schema {latest}): upgrade settled (`settled --version` on the newer one "
            "names its schema)"
        )
    if found == latest or mode is SchemaMode.AS_IS:
        return False
    if mode is SchemaMode.MIGRATE:
        return True
    if mode is SchemaMode.REFUSE or unreadable():
        raise LedgerOutdated(where, found, latest)
    return False  # READ: an older ledger that holds every column settled reads


# How a location becomes a ledger (``Ledger.open``): the package sets it, as it knows
# the backends; (location, busy_timeout, create, mode, probe).
Opener = Callable[
    [str, "float | None", bool, SchemaMode, Probe, "PostgresSettings | None"], "Ledger"
]


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
    opener: ClassVar[Opener]  # set by ``settled.storage`` (its ``open_location``)

    @staticmethod
    def open(
        location: str | Any,
        *,
        busy_timeout: float | None = None,
        create: bool = True,
        migrate: bool = True,
        read_only: bool = False,
        probe: Probe = no_probe,
        postgres: PostgresSettings | None = None,
    ) -> Ledger:
        """Open the ledger at ``location``: a file path (SQLite), or a
        ``postgresql://`` URL. ``create=False`` refuses to create a missing one.
        ``postgres``: how a PostgreSQL ledger holds its connections
        (``PostgresSettings``; its defaults when not given).

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
        return Ledger.opener(
            os.fspath(location), busy_timeout, create and not read_only, mode, probe, postgres
        )

    @staticmethod
    def open_for_migration(
        location: str | Any,
        *,
        busy_timeout: float | None = None,
        postgres: PostgresSettings | None = None,
    ) -> Ledger:
        """Open an existing ledger as it is, whatever its schema (a newer one aside),
        for ``pending_steps``, ``backup`` and ``migrate``: what ``settled migrate``
        does. A missing ledger is a ``LedgerError`` naming its path."""
        return Ledger.opener(
            os.fspath(location), busy_timeout, False, SchemaMode.AS_IS, no_probe, postgres
        )

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
    def activity(self, now: str) -> tuple[int, str | None]:
        """Whether a writer may still be at work, as ``settled migrate`` asks: the live
        dispatch leases at ``now``, and when history was last written by any settled
        of any version (the newest event's time or record's update; None: never)."""

    @abstractmethod
    def log(self, f: LogFilter | None = None) -> list[Event]:
        """The audit: events as ``f`` selects them (by default, people's: verdicts,
        refused verdicts, confirmations, retries and the checks they asked for), newest
        first, at most ``f.limit`` (``event_log``)."""

    @abstractmethod
    def records(self, selection: Selection | None = None) -> list[ActionRecord]:
        """Records matching ``selection``, oldest first (newest first when asked)."""

    @abstractmethod
    def count(self, selection: Selection | None = None) -> int:
        """How many records match ``selection`` (its limit ignored)."""

    @abstractmethod
    def causes(self, selection: Selection | None = None) -> list[tuple[bool, str, int]]:
        """Why the records of ``selection`` are where they are, grouped as ``stats``
        groups reasons: (contradicted, grouped reason or contradiction, count), most
        first. Every selected record is in exactly one group (no reason: ""), so the
        counts add up to ``count(selection)``."""

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

    @abstractmethod
    def ids(self, prefix: str = "", limit: int = 200) -> list[str]:
        """Action ids that start with ``prefix`` (case-sensitive), in id order: shell
        completion (a range on the key)."""

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
        """Records by (status, provider), for metrics: from the kept counts."""

    @abstractmethod
    def counts(self) -> dict[tuple[str, str, str], int]:
        """Records by (status, provider, operation), as the writes keep them in the
        transaction of each write: read without a scan of the records."""

    @abstractmethod
    def fold_counts(self) -> None:
        """Fold the counts of writers that have ended into one row per count (where
        each writer keeps its own), so a read of the counts stays small. Changes no
        figure."""

    @abstractmethod
    def check_failures(self) -> dict[str, int]:
        """Open records whose last check could not be made (``check_error``), by
        provider: the verifiers that are broken now (metrics, ``/healthz``)."""

    @abstractmethod
    def paused_checks(self) -> dict[str, int]:
        """Those of ``check_failures`` whose provider asked for a pause (429/503), by
        provider: an outage rather than a broken verifier (``settled stats``)."""

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
    def move(self, move: Move, *, record: ActionRecord | None = None) -> ActionRecord | None:
        """Apply one move in its own transaction: the new record, or None when its
        guard did not hold (the record had moved on).

        ``record``: the record as the mover holds it (the one it wrote, or read). The
        move then applies only while no other move has changed the row since (its
        ``updated_at`` is still the record's), and the new record is ``record`` with
        the move applied: nothing is read back but the schedule (``lease_owner``,
        ``next_check_at``, which a due scan may set without a move) where the move
        does not set it."""

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

    @abstractmethod
    def renew_leases(self, held: Sequence[tuple[str, str]], *, until: str) -> dict[str, int]:
        """Move to ``until`` the check lease of every record still leased to an owner of
        ``held`` (owner, the time its lease runs to now), not yet checked and written
        nor handed back: the holder's heartbeat, one transaction. How many records each
        owner still holds."""

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
        ledger_events: Sequence[LedgerEvent] = (),
    ) -> int:
        """Write records and their events exactly as they were (ids, times, details),
        the kept callbacks' rows (``truth.CALLBACK_TABLE_COLUMNS``) and the events of
        the ledger itself (in their order, numbered anew; read back and compared before
        the commit), all in ONE transaction: the copy lands whole or not at all. Only for an empty ledger; an id
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

    @abstractmethod
    def verify(self, on_record: Callable[[int], None] | None = None, *, full: bool = True) -> Any:
        """Every record replayed against its events, every event without its record
        and every kept count against a recount (``truth.verify``), from one snapshot:
        a ``truth.Verdict``. ``full=False``: only the records with an event after the
        checkpoint the last run that found nothing stored, each with its whole log
        (``truth.established``). A run that finds nothing stores its checkpoint."""

    # -- retention and erasure -------------------------------------------------------------

    @abstractmethod
    def prunable(self, which: Prunable) -> dict[tuple[str, str, str], int]:
        """How many records a prune of ``which`` would take now, by (status, provider,
        operation): the preview. Reads only."""

    @abstractmethod
    def prune_batch(
        self, which: Prunable, *, after: str, size: int, at: str, actor: str, keep: Keep
    ) -> PruneBatch:
        """One bounded batch of a prune, in ONE transaction: take up to ``size``
        records of ``which`` with an id after ``after`` (id order, their rows locked
        where rows are), hand them with their events to ``keep`` (which archives them
        and returns the audit's detail), write that audit as a ``pruned`` ledger event,
        and delete the records and their events through the allowance it names. A
        crash anywhere before the commit leaves the ledger as it was; nothing is
        deleted that ``keep`` did not return from."""

    @abstractmethod
    def ledger_events(self, kind: str | None = None) -> list[LedgerEvent]:
        """The events of the ledger itself, oldest first (of ``kind`` when given)."""

    @abstractmethod
    def redact(self, action_id: str, erase: Erase) -> ActionRecord | None:
        """Erase values from one settled record in ONE transaction: its row locked
        where rows are and read with its events, ``erase`` says what to write; the
        ``redacted`` event first, then the record's params, reason and snapshot, then
        the events that repeated a value, through the allowance that event names.
        The record as it then is, or None when ``erase`` found nothing to erase.
        ``NotFound`` when there is no such record; ``Conflict`` when it is not
        settled (open, scheduled or contradicted): nothing is written."""


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
READ_COLUMNS: dict[str, tuple[str, ...]] = {name: t.names for name, t in TABLES.items()}


class Damaged(LedgerError):
    """A row that cannot be read as what it must be: the ledger is damaged there."""


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


__all__ = [
    "CALLBACK_COLUMNS",
    "COLUMNS",
    "DUE_STATUSES",
    "READ_COLUMNS",
    "SETTLED_STATUSES",
    "WRITABLE",
    "Ages",
    "CallbackFigures",
    "Damaged",
    "Decide",
    "DueBatch",
    "Erase",
    "Erasure",
    "Expire",
    "Figures",
    "History",
    "Keep",
    "Ledger",
    "LedgerEvent",
    "Move",
    "Opener",
    "PostgresSettings",
    "Prunable",
    "PruneBatch",
    "SchemaMode",
    "Selection",
    "Stats",
    "StatsCell",
    "Still",
    "Sweep",
    "Taken",
    "check_schema",
    "fold_stats",
    "from_row",
    "missing_for_reads",
    "moved_message",
    "retry_pending_at",
    "same_action",
    "sort_due",
    "to_row",
]
