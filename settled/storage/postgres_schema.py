"""The PostgreSQL ledger's schema: the current one, which a new ledger is made with, and
the migrations that bring an older ledger to it. Never edit a step that has shipped;
add a new one, and change ``FRESH`` (or the record's field) to match: the suite checks
that a ledger made new and one migrated from an empty one have the same schema.

A ledger lives in one schema (the first of the connection's ``search_path``, so
``?options=-csearch_path%3Dsettled`` picks it). The table ``settled_ledger`` marks the
schema as a settled ledger and holds the number of steps applied. A new ledger is made
by ``FRESH``, one script of the current schema (the tables' ``CREATE`` generated
from ``columns``) that also creates the mark, sent as one statement in one
transaction that records every step as applied, so no process can ever see settled's
tables in a schema that is not marked, nor a new ledger half built. An existing
ledger gets the steps it lacks, each in its own transaction. A schema that holds
anything else and no mark is refused.

Several processes may open a new ledger at once: each transaction takes a
transaction-scoped advisory lock on the schema's name and re-reads the version under
it, so the ledger is made once and every step runs exactly once.

Types are PostgreSQL's own: ``timestamptz`` for times (the ledger converts them to and
from the contract's text, ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, at its boundary), ``boolean``
for flags, ``text COLLATE "C"`` for names (byte order, as SQLite sorts them). Params,
snapshots, declarations and event details stay JSON *text*: byte for byte what the
ledger wrote, so a copied ledger's event checksum is the same on both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import LedgerError
from . import columns
from .ledger import SchemaMode, check_schema, missing_for_reads
from .query import ORDER_INDEXES

Cursor = Any  # a psycopg cursor; psycopg is imported by the ledger module only
Step = Callable[[Cursor], None]

MARK = "settled_ledger"

_STATUSES = (
    "'PENDING', 'IN_FLIGHT', 'AWAITING_VERIFICATION', 'CONFIRMED', 'FAILED', 'DENIED_UNRESOLVED'"
)

# The rows a due scan may take (``base.DUE_STATUSES``), as the due index's predicate.
DUE_PREDICATE = (
    "next_check_at IS NOT NULL"
    " AND status IN ('IN_FLIGHT', 'AWAITING_VERIFICATION', 'DENIED_UNRESOLVED')"
)

# Statements a step made that the current schema (``FRESH``) holds as they are: written
# once, here. A change to one is a new step (and a new statement), never an edit.
_REFUSE = """
CREATE FUNCTION settled_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'settled: %', TG_ARGV[0];
END
$$
"""
_STATUS_HAS_EVENT = """
CREATE FUNCTION settled_status_has_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_status text;
    newest text;
BEGIN
    SELECT status INTO now_status FROM actions WHERE action_id = NEW.action_id;
    SELECT to_status INTO newest FROM events WHERE action_id = NEW.action_id
        ORDER BY id DESC LIMIT 1;
    IF now_status IS DISTINCT FROM newest THEN
        RAISE EXCEPTION 'settled: a status changes only with the event that records it'
            ' (action %: status %, newest event to %)', NEW.action_id, now_status,
            coalesce(newest, 'none');
    END IF;
    RETURN NULL;
END
$$
"""
_STATUS_HAS_EVENT_TRIGGER = (
    "CREATE CONSTRAINT TRIGGER actions_status_has_event AFTER UPDATE OF status ON actions"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
    " WHEN (NEW.status IS DISTINCT FROM OLD.status)"
    " EXECUTE FUNCTION settled_status_has_event()"
)
_MOVED_TABLE = (
    "CREATE TABLE ledger_moved (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
    " moved_to text NOT NULL, moved_at timestamptz NOT NULL)"
)
_MOVED = """
CREATE FUNCTION settled_moved(OUT moved_to text, OUT moved_at text)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
    SELECT moved_to, to_char(moved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
    FROM ledger_moved
$$
"""
_NOT_MOVED = """
CREATE FUNCTION settled_not_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    m record;
BEGIN
    SELECT * INTO m FROM settled_moved();
    IF FOUND THEN
        RAISE EXCEPTION 'settled: this ledger moved to % at %', m.moved_to, m.moved_at;
    END IF;
    RETURN NULL;
END
$$
"""
_NOT_MOVED_TRIGGERS = tuple(
    f"CREATE TRIGGER {table}_not_moved BEFORE INSERT OR UPDATE ON {table}"
    " FOR EACH STATEMENT EXECUTE FUNCTION settled_not_moved()"
    for table in ("actions", "events", "callbacks")
)

_M001 = [
    f"""
    CREATE TABLE actions (
        action_id text COLLATE "C" PRIMARY KEY,
        provider text COLLATE "C" NOT NULL,
        operation text COLLATE "C" NOT NULL,
        params text NOT NULL,
        params_hash text COLLATE "C" NOT NULL,
        tier text NOT NULL,
        reconciliation_key text,
        eligible_at timestamptz,
        requires_manual_verification boolean NOT NULL,
        attempt integer NOT NULL DEFAULT 1,
        idempotency_key text NOT NULL,
        dispatch_id text,
        provider_object_id text,
        status text NOT NULL CHECK (status IN ({_STATUSES})),
        delivery text NOT NULL,
        acceptance text NOT NULL,
        dispatched_at timestamptz,
        confirmed_at timestamptz,
        confirmed_by text,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        lease_owner text,
        lease_expires_at timestamptz,
        next_check_at timestamptz,
        verify_started_at timestamptz,
        verify_deadline_at timestamptz,
        checks integer NOT NULL DEFAULT 0,
        reason text,
        snapshot text,
        lands_by timestamptz,
        contradiction text,
        declared text
    )
    """,
    # "Due for reconciliation" is a range scan over rows that still have a check time;
    # terminal rows drop out of the index entirely. The due scan repeats this predicate
    # word for word, so the planner walks this index in order and stops at the batch's
    # size, whatever the statistics say about the status index.
    f"CREATE INDEX actions_due ON actions (next_check_at) WHERE {DUE_PREDICATE}",
    "CREATE INDEX actions_status ON actions (status, created_at)",
    "CREATE INDEX actions_same_change ON actions (provider, operation, params_hash)",
    """
    CREATE TABLE events (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        action_id text COLLATE "C" NOT NULL REFERENCES actions (action_id),
        at timestamptz NOT NULL,
        actor text NOT NULL,
        kind text NOT NULL,
        from_status text,
        to_status text NOT NULL,
        attempt integer NOT NULL,
        detail text NOT NULL
    )
    """,
    "CREATE INDEX events_action ON events (action_id, id)",
    # The event log is append-only in the database itself: UPDATE, DELETE and TRUNCATE
    # of events, and DELETE and TRUNCATE of actions, are refused by triggers (a role
    # that is not the tables' owner cannot even disable them; see docs/postgres.md).
    _REFUSE,
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events"
    " FOR EACH ROW EXECUTE FUNCTION settled_refuse('events are append-only')",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
    " FOR EACH ROW EXECUTE FUNCTION settled_refuse('events are append-only')",
    "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events"
    " FOR EACH STATEMENT EXECUTE FUNCTION settled_refuse('events are append-only')",
    "CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions"
    " FOR EACH ROW EXECUTE FUNCTION settled_refuse('actions are never deleted')",
    "CREATE TRIGGER actions_no_truncate BEFORE TRUNCATE ON actions"
    " FOR EACH STATEMENT EXECUTE FUNCTION settled_refuse('actions are never deleted')",
]

_COUNTS = """
    CREATE TABLE action_counts (
        status text COLLATE "C" NOT NULL,
        provider text COLLATE "C" NOT NULL,
        operation text COLLATE "C" NOT NULL,
        slot integer NOT NULL,
        n bigint NOT NULL,
        PRIMARY KEY (status, provider, operation, slot)
    )
    """

_CHECKPOINT = """
    CREATE TABLE verify_checkpoint (
        only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
        established bigint NOT NULL,
        seen bigint NOT NULL,
        snapshot text,
        records bigint NOT NULL,
        at timestamptz NOT NULL
    )
    """


def _grant_to_writers(table: str, privileges: str) -> str:
    """``privileges`` on ``table`` granted to every role that may insert records (a
    step's new table, so an application role goes on after the upgrade)."""
    return f"""
    DO $$
    DECLARE r text;
    BEGIN
        FOR r IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
                 WHERE table_schema = current_schema() AND table_name = 'actions'
                   AND privilege_type = 'INSERT' AND grantee <> current_user
        LOOP
            EXECUTE format('GRANT {privileges} ON {table} TO %I', r);
        END LOOP;
    END
    $$
    """


# The triggers ``integrity_check`` expects, present and enabled.
TRIGGERS = (
    "events_no_update",
    "events_no_delete",
    "events_no_truncate",
    "actions_no_delete",
    "actions_no_truncate",
    "callbacks_no_delete",
    "callbacks_no_truncate",
    "callbacks_as_received",
    "actions_status_has_event",
    "actions_not_moved",
    "events_not_moved",
    "callbacks_not_moved",
    "ledger_events_no_update",
    "ledger_events_no_delete",
    "ledger_events_no_truncate",
    "erasing_allowed",
    "erasing_ends",
    "ledger_events_not_moved",
    "erasing_not_moved",
)


def _m001_initial(cur: Cursor) -> None:
    for statement in _M001:
        cur.execute(statement)


_M002 = [
    # Signed provider callbacks (rule 16). One row per (provider, event id): the primary
    # key is the dedupe that every serve process on every host shares, so a redelivery
    # finds its row and changes nothing. A row is ``pending`` until it is applied to its
    # record (``matched``) or outlives ``expires_at`` (``expired``). Neither the body nor
    # the secret is kept, only the body's sha256. Rows are never deleted.
    """
    CREATE TABLE callbacks (
        provider text COLLATE "C" NOT NULL,
        event_id text COLLATE "C" NOT NULL,
        scheme text NOT NULL,
        names text NOT NULL,
        key text COLLATE "C" NOT NULL,
        status text NOT NULL,
        reported text NOT NULL,
        digest text NOT NULL,
        item integer,
        received_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL,
        state text NOT NULL CHECK (state IN ('pending', 'matched', 'expired')),
        action_id text COLLATE "C",
        attempt integer,
        matched_at timestamptz,
        next_check_at timestamptz,
        tries integer NOT NULL DEFAULT 0,
        PRIMARY KEY (provider, event_id)
    )
    """,
    "CREATE INDEX callbacks_due ON callbacks (next_check_at) WHERE state = 'pending'",
    "CREATE INDEX callbacks_named ON callbacks (provider, key) WHERE state = 'pending'",
    "CREATE INDEX callbacks_bound ON callbacks (action_id) WHERE state = 'pending'",
    # A callback names its record by its object id or its reconciliation key.
    "CREATE INDEX actions_object ON actions (provider, provider_object_id)"
    " WHERE provider_object_id IS NOT NULL",
    "CREATE INDEX actions_key ON actions (provider, reconciliation_key)"
    " WHERE reconciliation_key IS NOT NULL",
    "CREATE TRIGGER callbacks_no_delete BEFORE DELETE ON callbacks"
    " FOR EACH ROW EXECUTE FUNCTION settled_refuse('callbacks are never deleted')",
    "CREATE TRIGGER callbacks_no_truncate BEFORE TRUNCATE ON callbacks"
    " FOR EACH STATEMENT EXECUTE FUNCTION settled_refuse('callbacks are never deleted')",
    # What a callback said is kept as it came; only its state moves, and only on.
    """
    CREATE FUNCTION settled_callback_as_received() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF (NEW.provider, NEW.event_id, NEW.scheme, NEW.names, NEW.key, NEW.status,
            NEW.reported, NEW.digest, NEW.received_at)
           IS DISTINCT FROM (OLD.provider, OLD.event_id, OLD.scheme, OLD.names, OLD.key,
            OLD.status, OLD.reported, OLD.digest, OLD.received_at)
           OR OLD.state <> 'pending' THEN
            RAISE EXCEPTION 'settled: a callback is kept as it was received';
        END IF;
        RETURN NEW;
    END
    $$
    """,
    "CREATE TRIGGER callbacks_as_received BEFORE UPDATE ON callbacks"
    " FOR EACH ROW EXECUTE FUNCTION settled_callback_as_received()",
]


def _m002_callbacks(cur: Cursor) -> None:
    for statement in _M002:
        cur.execute(statement)


def _m003_checks(cur: Cursor) -> None:
    # Only attempts spend a verification budget (rule 15): counted_checks are the checks
    # that spent it (each at least verify.interval after the one before; the checks
    # already made were the schedule's, so they count), check_error why the last
    # attempt could not check anything (NULL once a check gets an answer).
    cur.execute(
        "ALTER TABLE actions ADD COLUMN counted_checks integer NOT NULL DEFAULT 0,"
        " ADD COLUMN check_error text"
    )
    cur.execute("UPDATE actions SET counted_checks = checks")
    # The daemon counts the records whose last check failed after every pass: few rows,
    # read through an index of only those, never a scan of the ledger.
    cur.execute(
        "CREATE INDEX actions_check_error ON actions (provider) WHERE check_error IS NOT NULL"
    )


_M004 = [
    # History is the truth of state (rule 18): at commit, a record whose status changed
    # in the transaction must have as its newest event one that moves it to the status
    # it has. Deferred, so the ledger may write the row and its event in either order
    # (one statement, or several); a raw ``UPDATE actions SET status = ...`` without an
    # event is refused at its commit. A role that is not the tables' owner cannot drop
    # or disable it (see docs/postgres.md).
    _STATUS_HAS_EVENT,
    _STATUS_HAS_EVENT_TRIGGER,
]


def _m004_status_has_event(cur: Cursor) -> None:
    for statement in _M004:
        cur.execute(statement)


_M005 = [
    # A copy is of a still ledger (rule 17): ``migrate-ledger`` writes the one row here,
    # in the transaction that held the source still while it was copied and verified:
    # where the ledger went (never a password) and when. From then on every write of
    # history is refused, naming the new ledger, so a writer that connected before the
    # move (a daemon) cannot add to a ledger nobody reads any more.
    _MOVED_TABLE,
    _MOVED,
    # The marker is read through ``settled_moved()`` (the owner's function), so the
    # application role needs no grant on it (docs/postgres.md).
    _NOT_MOVED,
    *_NOT_MOVED_TRIGGERS,
]


def _m005_moved(cur: Cursor) -> None:
    for statement in _M005:
        cur.execute(statement)


# Retention and erasure (step 006): a settled record may leave the ledger, or lose its
# params' values, only through an allowance (a row of ``erasing``) that names the audit
# of the run that needs it: prune's ``pruned`` row of ``ledger_events``, or the
# record's own ``redacted`` event, written first in the same transaction. The allowance
# is taken for settled, uncontradicted, unscheduled records only, and a deferred check
# refuses the commit of any transaction that leaves one behind; every other DELETE or
# UPDATE of history is refused as it always was (the guards keep their names).
_LEDGER_EVENTS = (
    "CREATE TABLE ledger_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " at timestamptz NOT NULL, actor text NOT NULL, kind text NOT NULL, detail text NOT NULL)"
)
_ERASING = (
    'CREATE TABLE erasing (action_id text COLLATE "C" PRIMARY KEY,'
    " purpose text NOT NULL CHECK (purpose IN ('prune', 'redact')), run bigint NOT NULL)"
)
_ERASING_ALLOWED = """
CREATE FUNCTION settled_erasing_allowed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM actions WHERE action_id = NEW.action_id
                   AND status IN ('CONFIRMED', 'FAILED') AND contradiction IS NULL
                   AND next_check_at IS NULL) THEN
        RAISE EXCEPTION 'settled: only a settled, uncontradicted record may be pruned or redacted';
    END IF;
    IF (NEW.purpose = 'prune' AND NOT EXISTS (
            SELECT 1 FROM ledger_events WHERE id = NEW.run AND kind = 'pruned'
            AND id = (SELECT max(id) FROM ledger_events)))
       OR (NEW.purpose = 'redact' AND NOT EXISTS (
            SELECT 1 FROM events WHERE id = NEW.run AND action_id = NEW.action_id
            AND kind = 'redacted'
            AND id = (SELECT max(id) FROM events WHERE action_id = NEW.action_id))) THEN
        RAISE EXCEPTION 'settled: an erasure is allowed only by the audit of its own run';
    END IF;
    RETURN NEW;
END
$$
"""
_ERASING_ENDS = """
CREATE FUNCTION settled_erasing_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM erasing WHERE action_id = NEW.action_id) THEN
        RAISE EXCEPTION 'settled: an erasure allowance outlived its transaction';
    END IF;
    RETURN NULL;
END
$$
"""
_GUARD_HISTORY = """
CREATE FUNCTION settled_guard_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM erasing WHERE action_id = OLD.action_id
                   AND purpose = 'prune') THEN
            RETURN OLD;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM erasing WHERE action_id = OLD.action_id
                  AND purpose = 'redact')
          AND (NEW.id, NEW.action_id, NEW.at, NEW.actor, NEW.kind, NEW.from_status,
               NEW.to_status, NEW.attempt)
              IS NOT DISTINCT FROM (OLD.id, OLD.action_id, OLD.at, OLD.actor, OLD.kind,
               OLD.from_status, OLD.to_status, OLD.attempt) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'settled: %', TG_ARGV[0];
END
$$
"""
_GUARDED = tuple(
    f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table}"
    f" FOR EACH ROW EXECUTE FUNCTION settled_guard_history('{why}')"
    for table, verb, why in (
        ("events", "UPDATE", "events are append-only"),
        ("events", "DELETE", "events are append-only"),
        ("actions", "DELETE", "actions are never deleted"),
    )
)
_ERASURE_TRIGGERS = (
    *_GUARDED,
    *(
        f"CREATE TRIGGER ledger_events_no_{verb.lower()} BEFORE {verb} ON ledger_events FOR EACH"
        f" {'STATEMENT' if verb == 'TRUNCATE' else 'ROW'}"
        " EXECUTE FUNCTION settled_refuse('events are append-only')"
        for verb in ("UPDATE", "DELETE", "TRUNCATE")
    ),
    "CREATE TRIGGER erasing_allowed BEFORE INSERT ON erasing"
    " FOR EACH ROW EXECUTE FUNCTION settled_erasing_allowed()",
    "CREATE CONSTRAINT TRIGGER erasing_ends AFTER INSERT ON erasing"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION settled_erasing_ends()",
    *(
        f"CREATE TRIGGER {table}_not_moved BEFORE INSERT OR UPDATE ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION settled_not_moved()"
        for table in ("ledger_events", "erasing")
    ),
)
_M006 = [
    _LEDGER_EVENTS,
    _ERASING,
    _ERASING_ALLOWED,
    _ERASING_ENDS,
    _GUARD_HISTORY,
    "DROP TRIGGER events_no_update ON events",
    "DROP TRIGGER events_no_delete ON events",
    "DROP TRIGGER actions_no_delete ON actions",
    *_ERASURE_TRIGGERS,
]


def _m006_erasure(cur: Cursor) -> None:
    for statement in _M006:
        cur.execute(statement)


_M007 = [
    # ``stats``, the API's counts and every scrape of ``/metrics`` read the counts the
    # writes keep in the same statement as the row (``statements``), not an aggregate
    # of the whole ledger (0.2-0.3 s a scrape at 120,000 records, and linear). Each
    # session adds to its own slot (its backend pid), so writers never wait on one
    # another's count. Filled from the rows while no writer can change them (SHARE
    # conflicts with every row change; readers go on).
    _COUNTS,
    "LOCK TABLE actions IN SHARE MODE",
    "INSERT INTO action_counts (status, provider, operation, slot, n)"
    " SELECT status, provider, operation, 0, count(*) FROM actions GROUP BY 1, 2, 3",
    # Every role that may write records keeps their counts (and folds them) from now
    # on: granted here, by the owner, so an application role goes on writing after the
    # upgrade with no new grant to remember.
    _grant_to_writers("action_counts", "SELECT, INSERT, UPDATE, DELETE"),
]


def _m007_counts(cur: Cursor) -> None:
    for statement in _M007:
        cur.execute(statement)


_M008 = [
    # ``settled verify`` checks each record once after its last event: where the last
    # run got to, by event id and the snapshot it read (never by time), so a daily run
    # costs the day's records, not the ledger's.
    _CHECKPOINT,
    _grant_to_writers("verify_checkpoint", "SELECT, INSERT, UPDATE"),
]


def _m008_verified(cur: Cursor) -> None:
    for statement in _M008:
        cur.execute(statement)


# The search index (``queue --search``): a trigram GIN index (pg_trgm) over one text of
# the record, its id, the string and number values of its params (never their keys)
# and its reason, so ``ILIKE '%10927%'`` finds three or more characters anywhere inside
# a word, in any case, through the index, as SQLite's FTS5 trigram table does. An
# index over an expression needs no trigger: every write of the record keeps it true,
# the ledger's or any other (a redaction of params included). pg_trgm is made in
# ``public`` when the database lacks it (one per database; never in a ledger's schema,
# whose drop would take every other ledger's index with it), under a lock, as two
# ledgers may be made at once; a database that has it already is used as it is.
SEARCH_TEXT = """
CREATE FUNCTION settled_search_text(action_id text, params text, reason text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN concat_ws(' ', action_id, (SELECT string_agg(v #>> '{}', ' ')
        FROM jsonb_path_query(params::jsonb,
            'strict $.** ? (@.type() == "string" || @.type() == "number")') AS t(v)), reason);
EXCEPTION WHEN invalid_text_representation THEN
    -- params that are not JSON (never the ledger's own) leave the index, not the write.
    -- The handler is a subtransaction, which a parallel worker may not start: so the
    -- function is not PARALLEL SAFE.
    RETURN concat_ws(' ', action_id, reason);
END
$$
"""
SEARCH_INDEX = """
DO $$
DECLARE
    home text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('settled pg_trgm'));
    SELECT extnamespace::regnamespace::text INTO home FROM pg_extension
        WHERE extname = 'pg_trgm';
    IF home IS NULL THEN
        CREATE EXTENSION pg_trgm SCHEMA public;
        home := 'public';
    END IF;
    EXECUTE format('CREATE INDEX actions_search ON actions USING gin'
        ' (settled_search_text(action_id, params, reason) %s.gin_trgm_ops)', home);
END
$$
"""
SEARCH = [SEARCH_TEXT, SEARCH_INDEX]


def _m009_cause(cur: Cursor) -> None:
    # A cause that survives: why the attempt's outcome is open, set at its first unknown
    # outcome and kept through every later check (records already open keep NULL).
    cur.execute("ALTER TABLE actions ADD COLUMN cause text")


def _m010_search(cur: Cursor) -> None:
    # Find anything a person knows (``queue --search``), answered through an index on a
    # ledger of a million records; built here for the records already kept.
    for statement in SEARCH:
        cur.execute(statement)


# The audit (``settled log``) reads the events newest first within a time window, by
# the person or surface (the actor, in byte order like every name) and by kind.
EVENTS_AUDIT = (
    "CREATE INDEX events_at ON events (at, id)",
    'CREATE INDEX events_actor ON events (actor COLLATE "C", id)',
    "CREATE INDEX events_kind ON events (kind, id)",
)


def _m011_events_audit(cur: Cursor) -> None:
    for statement in EVENTS_AUDIT:
        cur.execute(statement)


def _m012_queue_order(cur: Cursor) -> None:
    # A page of the queue is read from an index in its order, entered at the cursor
    # (keyset paging): the default order and triage order.
    for name, keys in ORDER_INDEXES:
        cur.execute(f"CREATE INDEX {name} ON actions ({keys})")


MIGRATIONS: list[tuple[str, Step]] = [
    ("001_initial", _m001_initial),
    ("002_callbacks", _m002_callbacks),
    ("003_checks", _m003_checks),
    ("004_status_has_event", _m004_status_has_event),
    ("005_moved", _m005_moved),
    ("006_erasure", _m006_erasure),
    ("007_counts", _m007_counts),
    ("008_verified", _m008_verified),
    ("009_cause", _m009_cause),
    ("010_search", _m010_search),
    ("011_events_audit", _m011_events_audit),
    ("012_queue_order", _m012_queue_order),
]

LATEST = len(MIGRATIONS)

# PostgreSQL's types: ``timestamptz`` for times, ``boolean`` for flags, names in byte
# order, and the enums the schema holds to their values checked.
TYPES = columns.Types(
    {"integer": "integer", "boolean": "boolean", "time": "timestamptz"},
    "text",
    by_bytes=' COLLATE "C"',
    checks=True,
    numbered="bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
)

# The current schema, statement by statement (sent as one script: one round trip). Why
# each part is there is told by the step that added it, above.
FRESH: tuple[str, ...] = (
    f"CREATE TABLE {MARK} (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
    " application text NOT NULL, version integer NOT NULL)",
    "CREATE TABLE _migrations (name text PRIMARY KEY,"
    " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    columns.create_table(TYPES),
    columns.create_table(TYPES, columns.EVENTS),
    columns.create_table(TYPES, columns.CALLBACKS),
    _MOVED_TABLE,
    _COUNTS,
    _CHECKPOINT,
    # the indexes
    f"CREATE INDEX actions_due ON actions (next_check_at) WHERE {DUE_PREDICATE}",
    "CREATE INDEX actions_status ON actions (status, created_at)",
    "CREATE INDEX actions_same_change ON actions (provider, operation, params_hash)",
    "CREATE INDEX actions_object ON actions (provider, provider_object_id)"
    " WHERE provider_object_id IS NOT NULL",
    "CREATE INDEX actions_key ON actions (provider, reconciliation_key)"
    " WHERE reconciliation_key IS NOT NULL",
    "CREATE INDEX actions_check_error ON actions (provider) WHERE check_error IS NOT NULL",
    "CREATE INDEX events_action ON events (action_id, id)",
    *EVENTS_AUDIT,
    "CREATE INDEX callbacks_due ON callbacks (next_check_at) WHERE state = 'pending'",
    "CREATE INDEX callbacks_named ON callbacks (provider, key) WHERE state = 'pending'",
    "CREATE INDEX callbacks_bound ON callbacks (action_id) WHERE state = 'pending'",
    *(f"CREATE INDEX {name} ON actions ({keys})" for name, keys in ORDER_INDEXES),
    # the functions the triggers run
    _REFUSE,
    f"""
        CREATE FUNCTION settled_callback_as_received() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF ({", ".join(f"NEW.{c}" for c in columns.KEPT)})
               IS DISTINCT FROM ({", ".join(f"OLD.{c}" for c in columns.KEPT)})
               OR OLD.state <> 'pending' THEN
                RAISE EXCEPTION 'settled: a callback is kept as it was received';
            END IF;
            RETURN NEW;
        END
        $$
        """,
    _STATUS_HAS_EVENT,
    _MOVED,
    _NOT_MOVED,
    # the triggers (TRIGGERS), fired in the order of their names
    *(
        f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} FOR EACH"
        f" {'STATEMENT' if verb == 'TRUNCATE' else 'ROW'}"
        f" EXECUTE FUNCTION settled_refuse('{why}')"
        for table, verb, why in (
            ("events", "TRUNCATE", "events are append-only"),
            ("actions", "TRUNCATE", "actions are never deleted"),
            ("callbacks", "DELETE", "callbacks are never deleted"),
            ("callbacks", "TRUNCATE", "callbacks are never deleted"),
        )
    ),
    "CREATE TRIGGER callbacks_as_received BEFORE UPDATE ON callbacks"
    " FOR EACH ROW EXECUTE FUNCTION settled_callback_as_received()",
    _STATUS_HAS_EVENT_TRIGGER,
    *_NOT_MOVED_TRIGGERS,
    # retention and erasure (step 006)
    _LEDGER_EVENTS,
    _ERASING,
    _ERASING_ALLOWED,
    _ERASING_ENDS,
    _GUARD_HISTORY,
    *_ERASURE_TRIGGERS,
    # the search index
    *SEARCH,
)


def inspect(cur: Cursor) -> tuple[int | None, list[str]]:
    """Steps applied to the current schema (None when it is not marked as a ledger),
    and, when it is not, up to five names of what it holds (empty: a schema we may
    make a ledger in). Mark and contents are read by one statement, from one snapshot:
    two reads could straddle another process's first step and see its tables unmarked.

    The catalog is scanned rather than asked through ``to_regclass``, which may answer
    from this session's cache of it: right after another process's first step commits,
    that cache can still say the mark does not exist. The mark is found through
    ``pg_class``'s (relname, relnamespace) index; what else the schema holds is read
    only when it is not marked, as that scans ``pg_class`` and ``pg_proc``, which have
    no index by schema alone (on a server whose catalogs carry many dead rows the scan
    was most of what opening a ledger cost the server). Raises ``LedgerError`` when
    the connection has no schema to work in."""
    cur.execute(
        """
        WITH here AS (SELECT oid FROM pg_namespace WHERE nspname = current_schema()),
             mark AS (SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = %s
                                     AND relnamespace = (SELECT oid FROM here)) AS marked)
        SELECT current_schema(), marked,
               CASE WHEN marked THEN ARRAY[]::text[]
                    ELSE ARRAY(SELECT relname::text FROM pg_class
                               WHERE relnamespace = (SELECT oid FROM here)
                               UNION ALL
                               SELECT proname::text FROM pg_proc
                               WHERE pronamespace = (SELECT oid FROM here)
                               LIMIT 5) END
        FROM mark
        """,
        (MARK,),
    )
    schema, marked, names = cur.fetchone()
    if schema is None:
        cur.execute("SHOW search_path")
        (path,) = cur.fetchone()
        raise LedgerError(
            f"no schema of search_path {path!r} exists in this database; create it "
            "(CREATE SCHEMA ...) or point search_path at one"
        )
    if not marked:
        return None, list(names)
    cur.execute(f"SELECT version FROM {MARK}")
    row = cur.fetchone()
    return (int(row[0]) if row else 0), []


def settle(conn: Any, where: str, create: bool, mode: SchemaMode) -> int:
    """What opening does with the schema of the ledger at ``where``: a new one made
    (unless ``create`` is false), an older one migrated or refused as ``mode`` says
    (``base.check_schema``); the version it then has."""
    with conn.cursor() as cur:
        found, other = inspect(cur)
    if found is None and other:
        raise LedgerError(
            f"{where} holds other tables ({', '.join(other)}) and is not a settled ledger; "
            "refusing to write to it (use an empty schema)"
        )
    if found is None and not create:
        raise LedgerError(
            f"no ledger at {where}; nothing has been recorded there "
            "(check --db, SETTLED_DB or [ledger] url)"
        )
    if found is None or check_schema(where, found, LATEST, mode, lambda: _unreadable(conn)):
        migrate(conn, where)
        found = version(conn)
    return found


def _unreadable(conn: Any) -> list[str]:
    """The columns settled reads that this (older) ledger's tables lack."""
    found: dict[str, set[str]] = {}
    for table, column in conn.execute(
        "SELECT table_name::text, column_name::text FROM information_schema.columns"
        " WHERE table_schema = current_schema()"
    ).fetchall():
        found.setdefault(table, set()).add(column)
    return missing_for_reads(found)


def version(conn: Any) -> int:
    """The number of steps applied to the ledger (its mark's)."""
    row = conn.execute(f"SELECT version FROM {MARK}").fetchone()
    return int(row[0]) if row else 0


def check(cur: Cursor) -> str:
    """What the database itself must hold and cannot be seen from the rows: every
    trigger of ``TRIGGERS`` enabled, and no event without its record ("ok", or what
    is wrong)."""
    cur.execute(
        "SELECT t.tgname FROM pg_trigger t WHERE t.tgenabled <> 'D'"
        " AND t.tgrelid IN (to_regclass('actions'), to_regclass('events'),"
        " to_regclass('callbacks'), to_regclass('ledger_events'), to_regclass('erasing'))"
    )
    enabled = {r[0] for r in cur.fetchall()}
    missing = [t for t in TRIGGERS if t not in enabled]
    if missing:
        return f"append-only triggers missing or disabled: {', '.join(missing)}"
    cur.execute(
        "SELECT count(*) FROM events e LEFT JOIN actions a USING (action_id)"
        " WHERE a.action_id IS NULL"
    )
    orphans = int(cur.fetchone()[0])
    return "ok" if not orphans else f"{orphans} events without their action"


def migrate(conn: Any, where: str, on_step: Callable[[int, str], None] | None = None) -> int:
    """Make a new ledger in the current schema, or apply every step an existing one
    lacks, under an advisory lock: a new ledger whole in one transaction that also
    marks the schema, an existing one a step a transaction. Returns the number of steps
    applied here (a new ledger: all). ``where`` names the ledger in errors; ``on_step``
    hears each step's number and name once it is committed."""
    applied = 0
    number = 1
    while number <= len(MIGRATIONS):
        done: list[tuple[int, str]] = []
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext('settled ledger ' || current_schema()))"
            )
            found, other = inspect(cur)
            if found is None:
                if other:
                    raise LedgerError(
                        f"{where} holds other tables ({', '.join(other)}) and is not a "
                        "settled ledger; refusing to write to it (use an empty schema)"
                    )
                # A new ledger is made whole in one transaction, so no process ever sees
                # it half built (a command that never migrates would refuse it as older).
                cur.execute(";\n".join(FRESH))
                done = [(n, name) for n, (name, _) in enumerate(MIGRATIONS, 1)]
                cur.execute(
                    "INSERT INTO _migrations (name) SELECT unnest(%s::text[])",
                    ([name for _, name in done],),
                )
                cur.execute(
                    f"INSERT INTO {MARK} (application, version) VALUES ('settled', %s)",
                    (len(done),),
                )
            elif found < number:
                # An existing ledger moves a step a transaction, each announced.
                name, step = MIGRATIONS[number - 1]
                step(cur)
                cur.execute("INSERT INTO _migrations (name) VALUES (%s)", (name,))
                cur.execute(f"UPDATE {MARK} SET version = %s", (number,))
                done = [(number, name)]
        applied += len(done)
        if on_step is not None:
            for n, name in done:
                on_step(n, name)
        number = done[-1][0] + 1 if done else number + 1
    return applied
