"""The PostgreSQL ledger's schema: the current one, which a new ledger is made with, and
the migrations that bring an older ledger to it. Never edit a step that has shipped;
add a new one, and change ``FRESH`` (or the record's field) to match: the suite checks
that a ledger made new and one migrated from an empty one have the same schema.

A ledger lives in one schema (the first of the connection's ``search_path``, so
``?options=-csearch_path%3Dsettled`` picks it). The table ``settled_ledger`` marks the
schema as a settled ledger and holds the number of steps applied. A new ledger is made
by ``FRESH``, one script of the current schema (the actions table's ``CREATE``
generated from ``columns``) that also creates the mark, sent as one statement in one
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
    """
    CREATE FUNCTION settled_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'settled: %', TG_ARGV[0];
    END
    $$
    """,
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
    """
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
    """,
    "CREATE CONSTRAINT TRIGGER actions_status_has_event AFTER UPDATE OF status ON actions"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
    " WHEN (NEW.status IS DISTINCT FROM OLD.status)"
    " EXECUTE FUNCTION settled_status_has_event()",
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
    "CREATE TABLE ledger_moved (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
    " moved_to text NOT NULL, moved_at timestamptz NOT NULL)",
    """
    CREATE FUNCTION settled_moved(OUT moved_to text, OUT moved_at text)
    RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$
        SELECT moved_to, to_char(moved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
        FROM ledger_moved
    $$
    """,
    # The marker is read through ``settled_moved()`` (the owner's function), so the
    # application role needs no grant on it (docs/postgres.md).
    """
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
    """,
    *(
        f"CREATE TRIGGER {table}_not_moved BEFORE INSERT OR UPDATE ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION settled_not_moved()"
        for table in ("actions", "events", "callbacks")
    ),
]


def _m005_moved(cur: Cursor) -> None:
    for statement in _M005:
        cur.execute(statement)


MIGRATIONS: list[tuple[str, Step]] = [
    ("001_initial", _m001_initial),
    ("002_callbacks", _m002_callbacks),
    ("003_checks", _m003_checks),
    ("004_status_has_event", _m004_status_has_event),
    ("005_moved", _m005_moved),
]

LATEST = len(MIGRATIONS)

# PostgreSQL's types: ``timestamptz`` for times, ``boolean`` for flags, names in byte
# order, and the enums the schema holds to their values checked.
TYPES = columns.Types(
    {"integer": "integer", "boolean": "boolean", "time": "timestamptz"},
    "text",
    by_bytes=' COLLATE "C"',
    checks=True,
)

# The current schema, statement by statement (sent as one script: one round trip). Why
# each part is there is told by the step that added it, above.
FRESH: tuple[str, ...] = (
    f"CREATE TABLE {MARK} (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
    " application text NOT NULL, version integer NOT NULL)",
    "CREATE TABLE _migrations (name text PRIMARY KEY,"
    " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    columns.create_table(TYPES),
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
    "CREATE TABLE ledger_moved (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),"
    " moved_to text NOT NULL, moved_at timestamptz NOT NULL)",
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
    "CREATE INDEX callbacks_due ON callbacks (next_check_at) WHERE state = 'pending'",
    "CREATE INDEX callbacks_named ON callbacks (provider, key) WHERE state = 'pending'",
    "CREATE INDEX callbacks_bound ON callbacks (action_id) WHERE state = 'pending'",
    # the functions the triggers run
    """
        CREATE FUNCTION settled_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'settled: %', TG_ARGV[0];
        END
        $$
        """,
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
    """
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
        """,
    """
        CREATE FUNCTION settled_moved(OUT moved_to text, OUT moved_at text)
        RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
        AS $$
            SELECT moved_to, to_char(moved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            FROM ledger_moved
        $$
        """,
    """
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
        """,
    # the triggers (TRIGGERS), fired in the order of their names
    *(
        f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} FOR EACH"
        f" {'STATEMENT' if verb == 'TRUNCATE' else 'ROW'}"
        f" EXECUTE FUNCTION settled_refuse('{why}')"
        for table, verb, why in (
            ("events", "UPDATE", "events are append-only"),
            ("events", "DELETE", "events are append-only"),
            ("events", "TRUNCATE", "events are append-only"),
            ("actions", "DELETE", "actions are never deleted"),
            ("actions", "TRUNCATE", "actions are never deleted"),
            ("callbacks", "DELETE", "callbacks are never deleted"),
            ("callbacks", "TRUNCATE", "callbacks are never deleted"),
        )
    ),
    "CREATE TRIGGER callbacks_as_received BEFORE UPDATE ON callbacks"
    " FOR EACH ROW EXECUTE FUNCTION settled_callback_as_received()",
    "CREATE CONSTRAINT TRIGGER actions_status_has_event AFTER UPDATE OF status ON actions"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
    " WHEN (NEW.status IS DISTINCT FROM OLD.status)"
    " EXECUTE FUNCTION settled_status_has_event()",
    *(
        f"CREATE TRIGGER {table}_not_moved BEFORE INSERT OR UPDATE ON {table}"
        " FOR EACH STATEMENT EXECUTE FUNCTION settled_not_moved()"
        for table in ("actions", "events", "callbacks")
    ),
)


def inspect(cur: Cursor) -> tuple[int | None, list[str]]:
    """Steps applied to the current schema (None when it is not marked as a ledger),
    and, when it is not, up to five names of what it holds (empty: a schema we may
    make a ledger in). Mark and contents are read by one statement, from one snapshot:
    two reads could straddle another process's first step and see its tables unmarked.

    The catalog is scanned rather than asked through ``to_regclass``, which may answer
    from this session's cache of it: right after another process's first step commits,
    that cache can still say the mark does not exist. Raises ``LedgerError`` when the
    connection has no schema to work in."""
    cur.execute(
        """
        WITH here AS (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
        SELECT current_schema(),
               EXISTS (SELECT 1 FROM pg_class WHERE relname = %s
                       AND relnamespace = (SELECT oid FROM here)),
               ARRAY(SELECT relname::text FROM pg_class
                     WHERE relnamespace = (SELECT oid FROM here)
                     UNION ALL
                     SELECT proname::text FROM pg_proc
                     WHERE pronamespace = (SELECT oid FROM here)
                     LIMIT 5)
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
