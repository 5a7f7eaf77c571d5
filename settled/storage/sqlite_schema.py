"""The SQLite ledger's schema: the current one, which a new ledger is made with, and the
migrations that bring an older ledger to it.

A new ledger is made by ``FRESH``, one script of the current schema (the tables'
``CREATE`` generated from ``columns``), run in one transaction that also
writes every step's name, the version and the mark. The migrations are named steps,
applied once each, in order, each in its own transaction, to a ledger made by an
earlier settled. Never edit a step that has shipped; add a new one, and change
``FRESH`` (or the record's field) to match: the suite checks that a ledger made new
and one migrated from an empty one have the same schema.

``PRAGMA user_version`` holds the number of steps applied (``LATEST`` here is the one
number a new step changes), so an up-to-date ledger is recognised with one cheap read;
sqlite-utils, which the steps are written with, is only imported when one needs
migrating.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import columns
from .query import ORDER_INDEXES

if TYPE_CHECKING:
    import sqlite_utils

Step = Callable[["sqlite_utils.Database"], None]

# SQLite's types: integers for numbers and flags, text for the rest. Its schema has
# never held an enum to its values (a CHECK cannot be added without rebuilding the
# table), and its text compares byte for byte already.
TYPES = columns.Types({"integer": "INTEGER", "boolean": "INTEGER"}, "TEXT")


def _refuse(name: str, verb: str, table: str, why: str, when: str = "") -> str:
    when = f"WHEN {when} " if when else ""
    return (
        f"CREATE TRIGGER {name} BEFORE {verb} ON {table} {when}"
        f"BEGIN SELECT RAISE(ABORT, 'settled: {why}'); END"
    )


_MOVED = "EXISTS (SELECT 1 FROM ledger_moved)"
# Statements a step made that the current schema (``FRESH``) holds as they are: written
# once, here. A change to one is a new step (and a new statement), never an edit.
_STATUS_HAS_EVENT = (
    "CREATE TRIGGER actions_status_has_event BEFORE UPDATE OF status ON actions "
    "WHEN NEW.status IS NOT OLD.status AND NOT EXISTS (SELECT 1 FROM events"
    " WHERE id = (SELECT max(id) FROM events WHERE action_id = NEW.action_id)"
    " AND to_status = NEW.status AND from_status IS OLD.status) "
    "BEGIN SELECT RAISE(ABORT, 'settled: a status changes only with the event that"
    " records it'); END"
)
_ACTIONS_NO_REPLACE = (
    "CREATE TRIGGER actions_no_replace BEFORE INSERT ON actions "
    "WHEN EXISTS (SELECT 1 FROM actions WHERE action_id = NEW.action_id) "
    "BEGIN SELECT RAISE(IGNORE); END"
)
_COUNTS = (
    "CREATE TABLE action_counts (status TEXT NOT NULL, provider TEXT NOT NULL,"
    " operation TEXT NOT NULL, slot INTEGER NOT NULL, n INTEGER NOT NULL,"
    " PRIMARY KEY (status, provider, operation, slot))"
)
_CHECKPOINT = (
    "CREATE TABLE verify_checkpoint (only_row INTEGER PRIMARY KEY CHECK (only_row = 1),"
    " established INTEGER NOT NULL, seen INTEGER NOT NULL, snapshot TEXT,"
    " records INTEGER NOT NULL, at TEXT NOT NULL)"
)
_CALLBACKS_NO_REPLACE = (
    "CREATE TRIGGER callbacks_no_replace BEFORE INSERT ON callbacks "
    "WHEN EXISTS (SELECT 1 FROM callbacks WHERE provider = NEW.provider"
    " AND event_id = NEW.event_id) BEGIN SELECT RAISE(IGNORE); END"
)

# Retention and erasure (step 009): a settled record may leave the ledger, or lose its
# params' values, only through an allowance (a row of ``erasing``) that names the audit
# of the run that needs it: prune's ``pruned`` row of ``ledger_events``, or the
# record's own ``redacted`` event, written first in the same transaction. The allowance
# is taken for settled, uncontradicted, unscheduled records only, and the transaction
# that takes it removes it before it commits; every other DELETE or UPDATE of history
# is refused as it always was.
_SETTLED_ROW = (
    "SELECT 1 FROM actions WHERE action_id = NEW.action_id"
    " AND status IN ('CONFIRMED', 'FAILED') AND contradiction IS NULL"
    " AND next_check_at IS NULL"
)
_AUDITED = (
    "(NEW.purpose = 'prune' AND NOT EXISTS (SELECT 1 FROM ledger_events WHERE id = NEW.run"
    " AND kind = 'pruned' AND id = (SELECT max(id) FROM ledger_events)))"
    " OR (NEW.purpose = 'redact' AND NOT EXISTS (SELECT 1 FROM events WHERE id = NEW.run"
    " AND action_id = NEW.action_id AND kind = 'redacted'"
    " AND id = (SELECT max(id) FROM events WHERE action_id = NEW.action_id)))"
)


def _allowed(purpose: str, column: str) -> str:
    return (
        f"NOT EXISTS (SELECT 1 FROM erasing WHERE action_id = OLD.{column}"
        f" AND purpose = '{purpose}')"
    )


# An event's detail is the one column a redaction may rewrite.
_EVENT_FIXED = " OR ".join(
    f"NEW.{c} IS NOT OLD.{c}" for c in columns.EVENT_COLUMNS if c != "detail"
)
ERASURE: tuple[str, ...] = (
    "CREATE TABLE ledger_events (id INTEGER PRIMARY KEY, at TEXT NOT NULL,"
    " actor TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL)",
    "CREATE TABLE erasing (action_id TEXT PRIMARY KEY,"
    " purpose TEXT NOT NULL CHECK (purpose IN ('prune', 'redact')), run INTEGER NOT NULL)",
    "DROP TRIGGER actions_no_delete",
    "DROP TRIGGER events_no_update",
    "DROP TRIGGER events_no_delete",
    _refuse(
        "actions_no_delete",
        "DELETE",
        "actions",
        "actions are never deleted",
        _allowed("prune", "action_id"),
    ),
    _refuse(
        "events_no_update",
        "UPDATE",
        "events",
        "events are append-only",
        f"{_allowed('redact', 'action_id')} OR {_EVENT_FIXED}",
    ),
    _refuse(
        "events_no_delete",
        "DELETE",
        "events",
        "events are append-only",
        _allowed("prune", "action_id"),
    ),
    _refuse("ledger_events_no_update", "UPDATE", "ledger_events", "events are append-only"),
    _refuse("ledger_events_no_delete", "DELETE", "ledger_events", "events are append-only"),
    _refuse(
        "ledger_events_not_moved_insert", "INSERT", "ledger_events", "this ledger moved", _MOVED
    ),
    _refuse(
        "erasing_settled_only",
        "INSERT",
        "erasing",
        "only a settled, uncontradicted record may be pruned or redacted",
        f"NOT EXISTS ({_SETTLED_ROW})",
    ),
    _refuse(
        "erasing_audited",
        "INSERT",
        "erasing",
        "an erasure is allowed only by the audit of its own run",
        _AUDITED,
    ),
    _refuse("erasing_not_moved_insert", "INSERT", "erasing", "this ledger moved", _MOVED),
)

# The search index (``queue --search``): FTS5 with the trigram tokenizer, so any three
# or more characters of an id, a params value or the reason are found where they
# stand inside a word ("10927" in "order-10927", "example" in "ana@example.com"), in
# any case, through the index. External content: the text is read from the record
# itself (through the view), never kept twice, and the triggers keep the index true on
# every write of the record, the ledger's or any other (a redaction of params
# included). Only string and number values of params are indexed, never their keys.
_SEARCH_VALUES = (
    "(SELECT group_concat(value, ' ') FROM json_tree(CASE WHEN json_valid({x}) THEN {x}"
    " ELSE '{{}}' END) WHERE type IN ('text', 'integer', 'real'))"
)


def _search_row(row: str) -> str:
    return f"{row}.action_id, {_SEARCH_VALUES.format(x=row + '.params')}, {row}.reason"


SEARCH = (
    "CREATE VIEW actions_search_text AS SELECT rowid AS rid, action_id,"
    f" {_SEARCH_VALUES.format(x='params')} AS params, reason FROM actions",
    "CREATE VIRTUAL TABLE actions_search USING fts5(action_id, params, reason,"
    " content='actions_search_text', content_rowid='rid', tokenize='trigram')",
    "CREATE TRIGGER actions_search_insert AFTER INSERT ON actions BEGIN"
    " INSERT INTO actions_search(rowid, action_id, params, reason)"
    f" VALUES (NEW.rowid, {_search_row('NEW')}); END",
    "CREATE TRIGGER actions_search_update AFTER UPDATE OF action_id, params, reason"
    " ON actions WHEN NEW.action_id IS NOT OLD.action_id OR NEW.params IS NOT OLD.params"
    " OR NEW.reason IS NOT OLD.reason BEGIN"
    " INSERT INTO actions_search(actions_search, rowid, action_id, params, reason)"
    f" VALUES ('delete', OLD.rowid, {_search_row('OLD')});"
    " INSERT INTO actions_search(rowid, action_id, params, reason)"
    f" VALUES (NEW.rowid, {_search_row('NEW')}); END",
    # a pruned record leaves the index with the row (its values with it)
    "CREATE TRIGGER actions_search_delete AFTER DELETE ON actions BEGIN"
    " INSERT INTO actions_search(actions_search, rowid, action_id, params, reason)"
    f" VALUES ('delete', OLD.rowid, {_search_row('OLD')}); END",
)

# The current schema, statement by statement (one script, in one transaction:
# ``executescript`` would commit). Why each part is there is told by the step that
# added it, below. The triggers of a table are created in the order the steps made
# them: SQLite fires a table's triggers by their order of creation.
# The audit (``settled log``) reads the events newest first within a time window, by
# the person or surface (the actor) and by kind: an index for each, so a window of a
# day or one person's verdicts is a range scan, never a read of every event.
EVENTS_AUDIT = (
    "CREATE INDEX events_at ON events(at, id)",
    "CREATE INDEX events_actor ON events(actor, id)",
    "CREATE INDEX events_kind ON events(kind, id)",
)

FRESH: tuple[str, ...] = (
    columns.create_table(TYPES),
    columns.create_table(TYPES, columns.EVENTS),
    columns.create_table(TYPES, columns.CALLBACKS),
    "CREATE TABLE clock_anchors (boot_id TEXT PRIMARY KEY, wall TEXT NOT NULL,"
    " steady REAL NOT NULL)",
    "CREATE TABLE ledger_moved (only_row INTEGER PRIMARY KEY CHECK (only_row = 1),"
    " moved_to TEXT NOT NULL, moved_at TEXT NOT NULL)",
    "CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT)",
    _COUNTS,
    _CHECKPOINT,
    # the indexes
    "CREATE INDEX actions_due ON actions(next_check_at) WHERE next_check_at IS NOT NULL",
    "CREATE INDEX actions_status ON actions(status, created_at)",
    "CREATE INDEX actions_same_change ON actions(provider, operation, params_hash)",
    "CREATE INDEX actions_object ON actions(provider, provider_object_id)"
    " WHERE provider_object_id IS NOT NULL",
    "CREATE INDEX actions_key ON actions(provider, reconciliation_key)"
    " WHERE reconciliation_key IS NOT NULL",
    "CREATE INDEX actions_check_error ON actions(provider) WHERE check_error IS NOT NULL",
    "CREATE INDEX events_action ON events(action_id, id)",
    *EVENTS_AUDIT,
    "CREATE INDEX callbacks_due ON callbacks(next_check_at) WHERE state = 'pending'",
    "CREATE INDEX callbacks_named ON callbacks(provider, key) WHERE state = 'pending'",
    "CREATE INDEX callbacks_bound ON callbacks(action_id) WHERE state = 'pending'",
    *(f"CREATE INDEX {name} ON actions({keys})" for name, keys in ORDER_INDEXES),
    # actions: never deleted, never replaced, a status only with its event, not moved
    _ACTIONS_NO_REPLACE,
    _STATUS_HAS_EVENT,
    _refuse("actions_not_moved_insert", "INSERT", "actions", "this ledger moved", _MOVED),
    _refuse("actions_not_moved_update", "UPDATE", "actions", "this ledger moved", _MOVED),
    # events: append-only, not moved
    _refuse(
        "events_no_replace",
        "INSERT",
        "events",
        "events are append-only",
        "EXISTS (SELECT 1 FROM events WHERE id = NEW.id)",
    ),
    _refuse("events_not_moved_insert", "INSERT", "events", "this ledger moved", _MOVED),
    # callbacks: never deleted, never replaced, kept as received, not moved
    _refuse("callbacks_no_delete", "DELETE", "callbacks", "callbacks are never deleted"),
    _CALLBACKS_NO_REPLACE,
    _refuse(
        "callbacks_as_received",
        "UPDATE",
        "callbacks",
        "a callback is kept as it was received",
        " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in columns.KEPT) + " OR OLD.state <> 'pending'",
    ),
    _refuse("callbacks_not_moved_insert", "INSERT", "callbacks", "this ledger moved", _MOVED),
    _refuse("callbacks_not_moved_update", "UPDATE", "callbacks", "this ledger moved", _MOVED),
    # retention and erasure (step 009): its tables, and the guards it made anew
    *(step for step in ERASURE if not step.startswith("DROP ")),
    # the search index and the triggers that keep it true
    *SEARCH,
)


def _m001_initial(db: sqlite_utils.Database) -> None:
    db.table("actions").create(
        {
            "action_id": str,
            "provider": str,
            "operation": str,
            "params": str,
            "params_hash": str,
            "tier": str,
            "reconciliation_key": str,
            "eligible_at": str,
            "requires_manual_verification": int,
            "attempt": int,
            "idempotency_key": str,
            "dispatch_id": str,
            "provider_object_id": str,
            "status": str,
            "delivery": str,
            "acceptance": str,
            "dispatched_at": str,
            "confirmed_at": str,
            "confirmed_by": str,
            "created_at": str,
            "updated_at": str,
            # the claim's lease (IN_FLIGHT) and the reconcilers' per-row lease
            "lease_owner": str,
            "lease_expires_at": str,
            # verification schedule: NULL on terminal rows and rows only a person settles
            "next_check_at": str,
            "verify_started_at": str,
            "verify_deadline_at": str,
            "checks": int,
            "reason": str,
            "snapshot": str,
        },
        pk="action_id",
        not_null={
            "provider",
            "operation",
            "params",
            "params_hash",
            "tier",
            "requires_manual_verification",
            "attempt",
            "idempotency_key",
            "status",
            "delivery",
            "acceptance",
            "created_at",
            "updated_at",
            "checks",
        },
        defaults={"checks": 0, "attempt": 1},
    )
    # "Due for reconciliation" is a range scan over rows that still have a check time;
    # terminal rows drop out of the index entirely.
    db.execute("CREATE INDEX actions_due ON actions(next_check_at) WHERE next_check_at IS NOT NULL")
    db.execute("CREATE INDEX actions_status ON actions(status, created_at)")
    db.table("events").create(
        {
            "id": int,
            "action_id": str,
            "at": str,
            "actor": str,
            "kind": str,
            "from_status": str,
            "to_status": str,
            "attempt": int,
            "detail": str,
        },
        pk="id",
        not_null={"action_id", "at", "actor", "kind", "to_status", "attempt", "detail"},
        foreign_keys=[("action_id", "actions", "action_id")],
    )
    db.execute("CREATE INDEX events_action ON events(action_id, id)")
    # The event log is append-only in the database itself.
    # (executescript would COMMIT the step's transaction, so one statement at a time.)
    for table, verb in (("events", "UPDATE"), ("events", "DELETE"), ("actions", "DELETE")):
        what = "events are append-only" if table == "events" else "actions are never deleted"
        db.execute(
            f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, 'settled: {what}'); END"
        )


def _m002_no_replace(db: sqlite_utils.Database) -> None:
    # ``INSERT OR REPLACE`` / ``REPLACE INTO`` delete the conflicting row without firing
    # the DELETE triggers (SQLite fires them on REPLACE only with recursive_triggers),
    # so 001's triggers alone let an event be rewritten in place. An insert that would
    # collide with a stored event is refused; one that would collide with an action is
    # ignored (the ledger's own insert is ``ON CONFLICT DO NOTHING`` and stays so).
    db.execute(
        "CREATE TRIGGER events_no_replace BEFORE INSERT ON events "
        "WHEN EXISTS (SELECT 1 FROM events WHERE id = NEW.id) "
        "BEGIN SELECT RAISE(ABORT, 'settled: events are append-only'); END"
    )
    db.execute(_ACTIONS_NO_REPLACE)


def _m003_rivals_index(db: sqlite_utils.Database) -> None:
    # Attribution by snapshot must find other actions asking for the same change
    # (``Ledger.rivals``) without scanning the ledger.
    db.execute("CREATE INDEX actions_same_change ON actions(provider, operation, params_hash)")


def _m004_edges(db: sqlite_utils.Database) -> None:
    # What the rules learned in the field need stored with each action:
    # - lands_by: the last moment the attempt's request could reach the provider; an
    #   absence observed before it proves nothing (a paused or slow dispatcher);
    # - contradiction: why a late reply disagrees with a terminal status (blocks retry);
    # - declared: the operation's declarations when the action was recorded, which
    #   govern it for life (a config change affects new actions only).
    for column in ("lands_by", "contradiction", "declared"):
        db.execute(f"ALTER TABLE actions ADD COLUMN {column} TEXT")
    # One anchor per boot of the host: the ledger clock is the wall time when the
    # anchor was taken plus the time elapsed on a clock no wall-clock step moves, so a
    # step of the system clock neither proves absence nor spends a budget nor stalls
    # the daemon, and every process on the host reads the same time.
    db.execute(
        "CREATE TABLE clock_anchors (boot_id TEXT PRIMARY KEY, wall TEXT NOT NULL,"
        " steady REAL NOT NULL)"
    )


def _m005_callbacks(db: sqlite_utils.Database) -> None:
    # Signed provider callbacks (rule 16). One row per (provider, event id): the primary
    # key is the dedupe, so a redelivery finds its row and changes nothing. A row is
    # ``pending`` until it is applied to its record (``matched``) or outlives its
    # ``expires_at`` (``expired``); neither the body nor the secret is kept, only the
    # body's sha256. Rows are never deleted: the dedupe must outlive every redelivery.
    db.execute(
        "CREATE TABLE callbacks (provider TEXT NOT NULL, event_id TEXT NOT NULL,"
        " scheme TEXT NOT NULL, names TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL,"
        " reported TEXT NOT NULL, digest TEXT NOT NULL, item INTEGER,"
        " received_at TEXT NOT NULL, expires_at TEXT NOT NULL,"
        " state TEXT NOT NULL CHECK (state IN ('pending', 'matched', 'expired')),"
        " action_id TEXT, attempt INTEGER, matched_at TEXT, next_check_at TEXT,"
        " tries INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (provider, event_id))"
    )
    db.execute("CREATE INDEX callbacks_due ON callbacks(next_check_at) WHERE state = 'pending'")
    db.execute("CREATE INDEX callbacks_named ON callbacks(provider, key) WHERE state = 'pending'")
    db.execute("CREATE INDEX callbacks_bound ON callbacks(action_id) WHERE state = 'pending'")
    # A callback names its record by its object id or its reconciliation key.
    db.execute(
        "CREATE INDEX actions_object ON actions(provider, provider_object_id)"
        " WHERE provider_object_id IS NOT NULL"
    )
    db.execute(
        "CREATE INDEX actions_key ON actions(provider, reconciliation_key)"
        " WHERE reconciliation_key IS NOT NULL"
    )
    for verb, why in (("DELETE", "callbacks are never deleted"),):
        db.execute(
            f"CREATE TRIGGER callbacks_no_{verb.lower()} BEFORE {verb} ON callbacks "
            f"BEGIN SELECT RAISE(ABORT, 'settled: {why}'); END"
        )
    # REPLACE would delete the row it collides with without firing the DELETE trigger.
    db.execute(_CALLBACKS_NO_REPLACE)
    # What a callback said is kept as it came; only its state moves, and only on.
    db.execute(
        "CREATE TRIGGER callbacks_as_received BEFORE UPDATE ON callbacks "
        "WHEN NEW.provider IS NOT OLD.provider OR NEW.event_id IS NOT OLD.event_id"
        " OR NEW.scheme IS NOT OLD.scheme OR NEW.names IS NOT OLD.names"
        " OR NEW.key IS NOT OLD.key OR NEW.status IS NOT OLD.status"
        " OR NEW.reported IS NOT OLD.reported OR NEW.digest IS NOT OLD.digest"
        " OR NEW.received_at IS NOT OLD.received_at OR OLD.state <> 'pending' "
        "BEGIN SELECT RAISE(ABORT, 'settled: a callback is kept as it was received'); END"
    )


def _m006_checks(db: sqlite_utils.Database) -> None:
    # Only attempts spend a verification budget (rule 15):
    # - counted_checks: the checks that spent it, each at least verify.interval after
    #   the one before (``checks`` keeps counting every attempt); the checks already
    #   made were the schedule's, so they count;
    # - check_error: why the last attempt could not check anything (the provider
    #   unreachable, or not even buildable); NULL once a check gets an answer.
    db.execute("ALTER TABLE actions ADD COLUMN counted_checks INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE actions ADD COLUMN check_error TEXT")
    db.execute("UPDATE actions SET counted_checks = checks")
    # The daemon counts the records whose last check failed after every pass: few rows,
    # read through an index of only those, never a scan of the ledger.
    db.execute(
        "CREATE INDEX actions_check_error ON actions(provider) WHERE check_error IS NOT NULL"
    )


def _m007_status_has_event(db: sqlite_utils.Database) -> None:
    # History is the truth of state (rule 18): a record's status changes only with the
    # event that records the move, written in the same transaction BEFORE the row (the
    # ledger writes it so; SQLite has no deferred triggers, so the check is made as the
    # row changes). A change of status whose newest event does not record it (from the
    # old status to the new one) is refused: a raw ``UPDATE actions SET status = ...``.
    db.execute(_STATUS_HAS_EVENT)


def _m008_moved(db: sqlite_utils.Database) -> None:
    # A copy is of a still ledger (rule 17): ``migrate-ledger`` writes one row here, in
    # the transaction that held the source still while it was copied and verified: where
    # the ledger went (never a password) and when. From then on the database refuses
    # every write of history, so a writer that opened the ledger before the move (a
    # daemon) cannot add to a ledger nobody reads any more.
    db.execute(
        "CREATE TABLE ledger_moved (only_row INTEGER PRIMARY KEY CHECK (only_row = 1),"
        " moved_to TEXT NOT NULL, moved_at TEXT NOT NULL)"
    )
    for table, verb in (
        ("actions", "INSERT"),
        ("actions", "UPDATE"),
        ("events", "INSERT"),
        ("callbacks", "INSERT"),
        ("callbacks", "UPDATE"),
    ):
        db.execute(
            f"CREATE TRIGGER {table}_not_moved_{verb.lower()} BEFORE {verb} ON {table} "
            "WHEN EXISTS (SELECT 1 FROM ledger_moved) "
            "BEGIN SELECT RAISE(ABORT, 'settled: this ledger moved'); END"
        )


def _m009_erasure(db: sqlite_utils.Database) -> None:
    # A ledger that can forget what it must, and only that (``ERASURE``): ``prune``
    # archives settled records and then deletes them with their events; ``redact``
    # erases a settled record's params values and where its events repeat them. Both
    # through an allowance audited in the same transaction; the guards of 001 are made
    # anew to honour it, and refuse everything else as before.
    for statement in ERASURE:
        db.execute(statement)


def _m010_counts(db: sqlite_utils.Database) -> None:
    # ``stats``, the API's counts and every scrape of ``/metrics`` read the counts the
    # writes keep in the same transaction as the row (``statements``), not an aggregate
    # of the whole ledger: grouping a million records walked the status index with a
    # table read per row (5.3 s). Filled here from the rows, in the step's transaction,
    # which holds the file against every other writer.
    db.execute(_COUNTS)
    db.execute(
        "INSERT INTO action_counts (status, provider, operation, slot, n)"
        " SELECT status, provider, operation, 0, count(*) FROM actions GROUP BY 1, 2, 3"
    )


def _m011_verified(db: sqlite_utils.Database) -> None:
    # ``settled verify`` checks each record once after its last event: where the last
    # run got to, by event id (never by time: a clock may step back), so a daily run
    # costs the day's records, not the ledger's.
    db.execute(_CHECKPOINT)


def _m012_cause(db: sqlite_utils.Database) -> None:
    # A cause that survives: why the attempt's outcome is open (``http_503``,
    # ``reply_lost``, ``blind``...), set at its first unknown outcome and kept through
    # every later check, so a spent budget does not turn "HTTP 503" into "not seen".
    # Records already open keep NULL: their first outcome is not known any more.
    db.execute("ALTER TABLE actions ADD COLUMN cause TEXT")


def _m013_search(db: sqlite_utils.Database) -> None:
    # Find anything a person knows (``queue --search``): an id, an order number or a
    # recipient in params, words of the reason, answered through an index on a ledger
    # of a million records. The index is built here for the records already kept, then
    # kept by the triggers. (Read from the view row by row: FTS5's own ``rebuild``
    # fails on a view whose column calls ``json_tree``, SQLite 3.40.)
    for statement in SEARCH:
        db.execute(statement)
    db.execute(
        "INSERT INTO actions_search(rowid, action_id, params, reason)"
        " SELECT rid, action_id, params, reason FROM actions_search_text"
    )


def _m014_events_audit(db: sqlite_utils.Database) -> None:
    for statement in EVENTS_AUDIT:
        db.execute(statement)


def _m015_queue_order(db: sqlite_utils.Database) -> None:
    # A page of the queue is read from an index in its order, entered at the cursor
    # (keyset paging): the default order and triage order, each a few pages of rows
    # read, never the whole ledger sorted for every page.
    for name, keys in ORDER_INDEXES:
        db.execute(f"CREATE INDEX {name} ON actions({keys})")


MIGRATIONS: list[tuple[str, Step]] = [
    ("001_initial", _m001_initial),
    ("002_no_replace", _m002_no_replace),
    ("003_rivals_index", _m003_rivals_index),
    ("004_edges", _m004_edges),
    ("005_callbacks", _m005_callbacks),
    ("006_checks", _m006_checks),
    ("007_status_has_event", _m007_status_has_event),
    ("008_moved", _m008_moved),
    ("009_erasure", _m009_erasure),
    ("010_counts", _m010_counts),
    ("011_verified", _m011_verified),
    ("012_cause", _m012_cause),
    ("013_search", _m013_search),
    ("014_events_audit", _m014_events_audit),
    ("015_queue_order", _m015_queue_order),
]

LATEST = len(MIGRATIONS)


def migrate(
    conn: sqlite3.Connection,
    begin: Callable[[], None],
    application_id: int,
    on_step: Callable[[int, str], None] | None = None,
) -> int:
    """Make a new ledger, or apply every step an existing one lacks. ``begin`` opens a
    write transaction (the ledger's fair ``BEGIN IMMEDIATE``); ``on_step`` hears each
    step's number and name once it is committed. Safe when several processes open a
    new ledger at once: a new ledger is made whole by ``FRESH`` in one transaction,
    which also marks the file as a ledger (``application_id``) and records every step
    as applied, so no other process sees tables in a file not yet marked as a ledger,
    nor a ledger half built; the version is re-read inside each transaction, so a
    process that lost the race to make it applies nothing."""
    db: sqlite_utils.Database | None = None
    applied = 0
    number = 1
    while number <= len(MIGRATIONS):
        done: list[tuple[int, str]] = []
        begin()
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version == 0:
                # A new ledger is made whole in one transaction, so no process ever sees
                # it half built (a command that never migrates would refuse it as older).
                for statement in FRESH:
                    conn.execute(statement)
                done = [(n, name) for n, (name, _) in enumerate(MIGRATIONS, 1)]
            elif version < number:
                # An existing ledger moves a step a transaction, each announced.
                if db is None:
                    import sqlite_utils

                    db = sqlite_utils.Database(conn)
                name, step = MIGRATIONS[number - 1]
                step(db)
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)"
                )
                done = [(number, name)]
            if done:
                conn.executemany(
                    "INSERT INTO _migrations VALUES (?, strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
                    [(name,) for _, name in done],
                )
                conn.execute(f"PRAGMA user_version = {done[-1][0]}")
                conn.execute(f"PRAGMA application_id = {int(application_id)}")
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        applied += len(done)
        if on_step is not None:
            for n, name in done:
                on_step(n, name)
        number = done[-1][0] + 1 if done else number + 1
    return applied
