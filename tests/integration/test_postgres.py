"""The PostgreSQL ledger itself: its schema and migrations, the schemas it refuses,
append-only events in the database, bounded waits on a locked row, secrets kept out
of locations and messages, the same records byte for byte as SQLite's, the database's
clock, a least-privileged role, and many threads on one ledger.

Everything the two backends share (claims, moves, leases, the whole CLI) runs on both
through the suite's ``backend`` parametrisation; this module is what only PostgreSQL has.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pg_schemas as pg
import pytest
import rawdb
from records import T0, move, new_record, transition
from support import ROOT, run_cli

from settled import Ledger
from settled.clock import steady, utcnow
from settled.config import from_dict
from settled.errors import ConfigError, LedgerBusy, LedgerError
from settled.model import EventKind, Status
from settled.session import Session
from settled.storage import ledger as interface
from settled.storage import postgres_schema
from settled.storage.postgres import DatabaseClock, PostgresLedger, redact

pytestmark = pytest.mark.postgres_only


def _tables(url: str) -> set[str]:
    return {
        r[0]
        for r in rawdb.execute(
            url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
        )
    }


# ------------------------------------------------------------------ schema and migrations


def test_migrating_an_empty_schema_gives_the_schema(db_path: str) -> None:
    with Ledger.open(db_path):
        pass
    assert _tables(db_path) == {
        "actions",
        "events",
        "callbacks",
        "_migrations",
        "settled_ledger",
        "ledger_moved",
        "ledger_events",
        "erasing",
        "action_counts",
        "verify_checkpoint",
    }
    triggers = {
        r[0]
        for r in rawdb.execute(
            db_path,
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN"
            " ('actions'::regclass, 'events'::regclass, 'callbacks'::regclass,"
            " 'ledger_events'::regclass, 'erasing'::regclass)",
        )
    }
    assert triggers == set(postgres_schema.TRIGGERS)
    indexes = {
        r[0]
        for r in rawdb.execute(
            db_path, "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        )
    }
    assert {"actions_due", "actions_status", "actions_same_change", "events_action"} <= indexes
    cols = [
        r[0]
        for r in rawdb.execute(
            db_path,
            "SELECT column_name FROM information_schema.columns WHERE table_schema ="
            " current_schema() AND table_name = 'actions' ORDER BY ordinal_position",
        )
    ]
    assert cols == list(interface.COLUMNS)
    applied = [r[0] for r in rawdb.execute(db_path, "SELECT name FROM _migrations ORDER BY name")]
    assert applied == [name for name, _ in postgres_schema.MIGRATIONS]
    mark = rawdb.execute(db_path, "SELECT application, version FROM settled_ledger")
    assert mark == [("settled", postgres_schema.LATEST)]
    with Ledger.open(db_path):  # reopening applies nothing twice
        pass
    assert len(rawdb.execute(db_path, "SELECT name FROM _migrations")) == len(applied)


def test_the_due_scan_can_walk_the_partial_index(ledger: Ledger, db_path: str) -> None:
    with rawdb.psycopg.connect(db_path) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = " ".join(
            r[0]
            for r in conn.execute(
                f"EXPLAIN SELECT * FROM actions WHERE {postgres_schema.DUE_PREDICATE} AND"
                " next_check_at <= now() ORDER BY next_check_at LIMIT 10 FOR UPDATE SKIP LOCKED"
            )
        )
    assert "actions_due" in plan


def test_a_schema_holding_other_tables_is_refused_unchanged(db_path: str) -> None:
    rawdb.execute(db_path, "CREATE TABLE notes (x text)")
    rawdb.execute(db_path, "INSERT INTO notes VALUES ('keep me')")
    before = rawdb.dump(db_path)
    for create in (True, False):
        with pytest.raises(LedgerError, match="not a settled ledger"):
            Ledger.open(db_path, create=create)
    assert rawdb.dump(db_path) == before


def test_a_missing_schema_is_an_error_that_names_the_search_path() -> None:
    url = pg.url_for("settled_no_such_schema")
    with pytest.raises(LedgerError, match="search_path"):
        Ledger.open(url)


def test_read_only_opening_never_creates_a_ledger(db_path: str) -> None:
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger.open(db_path, create=False)
    assert _tables(db_path) == set()


def test_a_new_ledger_is_made_whole_or_not_at_all(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new ledger's whole schema lands in one transaction with its mark: a process
    that opens it meanwhile sees no ledger or the whole one, never a half-built schema
    that a command that never migrates would refuse as older."""
    # the script fails at its last statement, everything before it made
    broken = (*postgres_schema.FRESH, "CREATE TABLE actions (x int)")
    monkeypatch.setattr(postgres_schema, "FRESH", broken)
    with pytest.raises(LedgerError, match="already exists"):
        Ledger.open(db_path)
    assert "settled_ledger" not in _tables(db_path) and "actions" not in _tables(db_path)
    monkeypatch.undo()
    with Ledger.open(db_path) as led:  # made whole on the next open
        assert led.schema_version() == postgres_schema.LATEST


def test_a_newer_schema_is_refused(ledger: Ledger, db_path: str) -> None:
    rawdb.execute(db_path, "UPDATE settled_ledger SET version = version + 1")
    with pytest.raises(LedgerError, match="newer settled"):
        Ledger.open(db_path)


# ------------------------------------------------------------------ what the database refuses


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE events SET actor = 'x'",
        "DELETE FROM events",
        "TRUNCATE events",
        "DELETE FROM actions",
        "TRUNCATE actions CASCADE",
        "INSERT INTO events (id, action_id, at, actor, kind, to_status, attempt, detail)"
        " OVERRIDING SYSTEM VALUE SELECT id, action_id, at, 'x', kind, to_status, attempt, detail"
        " FROM events ON CONFLICT (id) DO UPDATE SET actor = 'x'",
    ],
)
def test_the_event_log_cannot_be_altered_through_sql(
    ledger: Ledger, db_path: str, sql: str
) -> None:
    ledger.record(new_record(), actor="t")
    before = rawdb.dump(db_path)
    with pytest.raises(rawdb.psycopg.Error, match="settled: "):
        rawdb.execute(db_path, sql)
    assert rawdb.dump(db_path) == before
    assert ledger.integrity_check() == "ok"


def test_a_disabled_trigger_fails_the_integrity_check(ledger: Ledger, db_path: str) -> None:
    rawdb.execute(db_path, "ALTER TABLE events DISABLE TRIGGER events_no_update")
    assert "events_no_update" in ledger.integrity_check()


def test_a_row_lock_past_the_bound_is_busy_and_changes_nothing(db_path: str) -> None:
    with Ledger.open(db_path) as led:
        led.record(new_record(), actor="t")
    holder = rawdb.psycopg.connect(db_path)
    holder.execute("SELECT 1 FROM actions WHERE action_id = 'a-1' FOR UPDATE")
    try:
        with Ledger.open(db_path, busy_timeout=0.3) as led:
            assert led.get("a-1").status is Status.PENDING  # reads never wait
            with pytest.raises(LedgerBusy, match="did not happen"):
                led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT))
    finally:
        holder.rollback()
        holder.close()
    with Ledger.open(db_path) as led:
        assert led.get("a-1").status is Status.PENDING
        assert len(led.events("a-1")) == 1


# ------------------------------------------------------------------ secrets and extras


def test_redact_masks_every_password() -> None:
    shown, secrets = redact("postgresql://app:p%40ss@db:5432/ledger?password=zz&sslmode=require")
    assert "p%40ss" not in shown and "zz" not in shown and "p@ss" not in shown
    assert shown.startswith("postgresql://app:***@db:5432/ledger?")
    assert set(secrets) >= {"p%40ss", "p@ss", "zz"}
    assert redact("postgresql:///test?options=-csearch_path%3Dx") == (
        "postgresql:///test?options=-csearch_path%3Dx",
        (),
    )


def test_passwords_never_reach_the_location_messages_or_the_cli(db_path: str) -> None:
    secret = "s3cret-canary-pw"
    refused = f"postgresql://settled:{secret}@127.0.0.1:1/ledger?connect_timeout=2"
    with pytest.raises(LedgerError) as info:
        Ledger.open(refused)
    assert secret not in str(info.value) and "***" in str(info.value)
    done = run_cli("--db", refused, "queue", "--json")
    assert done.returncode == 1 and secret not in done.stdout + done.stderr, done.stderr
    # trust authentication takes any password: a working ledger never shows it either
    query = db_path.split("?", 1)[1]
    good = f"postgresql://root:{secret}@/test?{query}"
    with Ledger.open(good) as led:
        assert secret not in led.location
        led.record(new_record(), actor="t")
    done = run_cli("--db", good, "show", "a-1", "--json")
    assert '"action_id": "a-1"' in done.stdout, done.stderr
    assert secret not in done.stdout + done.stderr


def test_without_the_extra_a_postgres_location_names_the_pip_install() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "from settled.cli import main; main(['--db', 'postgresql:///x', 'queue'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "pip install 'settled[postgres]'" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ the same contract


def _exercise(led: Ledger, recs: list[Any]) -> None:
    for rec in recs:
        led.record(rec, actor="t")
    transition(
        led,
        "a-1",
        Status.PENDING,
        Status.IN_FLIGHT,
        kind=EventKind.CLAIMED,
        at="2026-01-01T00:00:00.500000Z",
        lease_owner="o",
        lease_expires_at="2026-01-01T00:01:00.000001Z",
        next_check_at="2026-01-01T00:01:00.000001Z",
    )
    transition(
        led,
        "a-1",
        Status.IN_FLIGHT,
        Status.AWAITING_VERIFICATION,
        kind=EventKind.OUTCOME,
        at="2026-01-01T00:00:01.123456Z",
        owner="o",
        lease_owner=None,
        lease_expires_at=None,
        reason="accepted \x01",
        next_check_at="2999-12-31T23:59:59.999999Z",
    )


def test_records_and_events_read_back_byte_for_byte_as_on_sqlite(
    db_path: str, tmp_path: Path
) -> None:
    with Ledger.open(tmp_path / "same.db") as lite, Ledger.open(db_path) as pgl:
        recs = [
            new_record("a-1", {"to": "ü", "n": [1, 2.5, None]}),
            new_record("a-2", now=T0 + timedelta(microseconds=10)),
        ]
        _exercise(lite, recs)
        _exercise(pgl, recs)
        for aid in ("a-1", "a-2"):
            assert pgl.get(aid).to_json() == lite.get(aid).to_json()
            ours = [
                (e.at, e.actor, e.kind, e.from_status, e.to_status, e.attempt, e.detail)
                for e in pgl.events(aid)
            ]
            theirs = [
                (e.at, e.actor, e.kind, e.from_status, e.to_status, e.attempt, e.detail)
                for e in lite.events(aid)
            ]
            assert ours == theirs
        assert [r.action_id for r in pgl.records()] == [r.action_id for r in lite.records()]
        assert pgl.figures() == lite.figures()


def test_a_nul_byte_from_a_provider_is_kept_as_a_replacement_character(ledger: Ledger) -> None:
    ledger.record(new_record(), actor="t")
    got = transition(
        ledger,
        "a-1",
        Status.PENDING,
        Status.IN_FLIGHT,
        kind=EventKind.CLAIMED,
        reason="body: a\x00b",
    )
    assert got is not None and got.reason == "body: a\ufffdb"


# ------------------------------------------------------------------ one clock for all hosts


def test_the_ledger_clock_is_the_databases(ledger: Ledger, db_path: str) -> None:
    clock = ledger.clock()
    assert isinstance(clock, DatabaseClock)
    (before,) = rawdb.execute(db_path, "SELECT clock_timestamp()")[0]
    ours = clock.now()
    (after,) = rawdb.execute(db_path, "SELECT clock_timestamp()")[0]
    slack = timedelta(milliseconds=250)  # how well one reading can place the database's time
    assert before - slack <= ours <= after + slack


def test_a_skewed_host_clock_changes_nothing_and_a_failed_reading_counts_on() -> None:
    db_wall = utcnow() + timedelta(minutes=5)  # the database is five minutes ahead of us
    at = steady()
    readings: list[Any] = [(db_wall, at)]

    def read() -> Any:
        value = readings[-1]
        if isinstance(value, Exception):
            raise value
        return value

    clock = DatabaseClock(read, refresh=0.0)
    assert clock.now() - utcnow() > timedelta(minutes=4)
    readings.append(LedgerError("the database went away"))
    assert clock.now() - utcnow() > timedelta(minutes=4)  # counting on from the last reading


# ------------------------------------------------------------------ sharing one database


def test_two_schemas_are_two_independent_ledgers(db_path: str, fresh_location: Any) -> None:
    other = fresh_location("other")
    with Ledger.open(db_path) as one, Ledger.open(other) as two:
        one.record(new_record("a-1"), actor="t")
        two.record(new_record("a-1", {"x": 1}), actor="t")
        assert one.get("a-1").params == {} and two.get("a-1").params == {"x": 1}
        assert one.count() == two.count() == 1


def test_threads_sharing_one_ledger_get_their_own_connections(ledger: Ledger) -> None:
    ledger.record(new_record("shared"), actor="t")
    won: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        try:
            start.wait(timeout=30)
            for i in range(10):
                ledger.record(new_record(f"t{n}-{i}"), actor=f"w{n}")
            got = ledger.move(move("shared", Status.PENDING, Status.IN_FLIGHT))
            if got is not None:
                won.append(f"w{n}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(won) == 1
    assert ledger.count() == 81
    assert [e.kind for e in ledger.events("shared")] == ["recorded", "claimed"]


def test_a_dropped_connection_is_replaced(ledger: Ledger, db_path: str) -> None:
    ledger.record(new_record(), actor="t")
    pg.admin().execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (pg.schema_of(db_path),),
    )
    assert ledger.get("a-1").status is Status.PENDING  # the read is tried again, once
    assert ledger.move(move("a-1", Status.PENDING, Status.IN_FLIGHT)) is not None


# ------------------------------------------------------------------ configuration


def test_ledger_url_in_the_config_selects_postgres(
    db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, query = db_path.split("?", 1)
    monkeypatch.setenv("SETTLED_TEST_PGPASS", "pa:ss/word")
    (tmp_path / "settled.toml").write_text(
        f'[ledger]\nurl = "postgresql://root:${{SETTLED_TEST_PGPASS}}@/test?{query}"\n'
    )
    monkeypatch.delenv("SETTLED_DB")
    with Session(config_path=str(tmp_path / "settled.toml")) as s:
        assert "pa%3Ass%2Fword" in s.ledger_location()
        led = s.ledger()
        assert isinstance(led, PostgresLedger) and "pa" not in led.location.split("@")[0][13:]
        led.record(new_record(), actor="t")
    done = run_cli(
        "--config", str(tmp_path / "settled.toml"), "show", "a-1", "--json", env={"SETTLED_DB": ""}
    )
    assert '"action_id": "a-1"' in done.stdout, done.stderr
    assert "pa:ss" not in done.stdout + done.stderr and "pa%3Ass" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("ledger_conf", "message"),
    [
        ({"url": "postgresql:///x", "path": "x.db"}, "not both"),
        ({"url": "sqlite:///x.db"}, "must be a postgresql:// URL"),
        ({"url": "postgresql://u:${NOT_SET_ANYWHERE_42}@h/db"}, "NOT_SET_ANYWHERE_42 is not set"),
        ({"url": "postgresql://u:${bad@h/db"}, "malformed"),
    ],
)
def test_ledger_url_mistakes_are_config_errors(ledger_conf: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict({"ledger": ledger_conf}, source="settled.toml")


# ------------------------------------------------------------------ least privilege


def test_an_application_role_without_ownership_runs_settled_but_cannot_rewrite_history(
    db_path: str,
) -> None:
    """The role setup docs/postgres.md gives: the owner migrates, the application role
    may only read, insert and update actions and read and insert events."""
    with Ledger.open(db_path) as led:  # the owner creates the schema
        led.record(new_record("before"), actor="owner")
    schema = pg.schema_of(db_path)
    role = f"{schema}_app"
    admin = pg.admin()
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        for grant in (
            f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"',
            f'GRANT SELECT ON "{schema}".settled_ledger, "{schema}"._migrations TO "{role}"',
            f'GRANT SELECT, INSERT, UPDATE ON "{schema}".actions TO "{role}"',
            f'GRANT SELECT, INSERT ON "{schema}".events TO "{role}"',
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}".action_counts TO "{role}"',
            f'GRANT SELECT, INSERT, UPDATE ON "{schema}".verify_checkpoint TO "{role}"',
        ):
            admin.execute(grant)
        _, query = db_path.split("?", 1)
        app_url = f"postgresql://{role}@/test?{query}"
        with Ledger.open(app_url) as led:
            led.record(new_record("a-1"), actor="app")
            assert (
                transition(
                    led,
                    "a-1",
                    Status.PENDING,
                    Status.IN_FLIGHT,
                    kind=EventKind.CLAIMED,
                    lease_owner="o",
                    delivery="IN_FLIGHT",
                )
                is not None
            )
            assert led.integrity_check() == "ok" and led.figures()
            led.clock().now()
        for sql in (
            "UPDATE events SET actor = 'x'",
            "DELETE FROM events",
            "ALTER TABLE events DISABLE TRIGGER ALL",
            "DROP TABLE events CASCADE",
        ):
            with pytest.raises(rawdb.psycopg.Error):
                rawdb.execute(app_url, sql)
        with Ledger.open(db_path) as owner:
            assert [e.actor for e in owner.events("a-1")] == ["app", "t"]
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


# ------------------------------------------------------------------ the search extension


def test_a_database_without_pg_trgm_gets_it_from_its_owner_and_a_clear_line_otherwise() -> None:
    """docs/postgres.md: the schema step that makes the search index makes ``pg_trgm`` in
    ``public`` when the database has none, which only a role allowed to create
    extensions may do; any other role is told so in one line and nothing is made. A
    database of its own, as the suite's database has the extension (pg_schemas)."""
    import os

    admin = pg.admin()
    database = f"{pg.PREFIX}{os.getpid()}_ext"
    role = f"{database}_app"
    admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{database}"')
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        owner_url = f"postgresql:///{database}?options=-csearch_path%3Downed"
        app_url = f"postgresql://{role}@/{database}?options=-csearch_path%3D{role}"
        rawdb.execute(owner_url, "CREATE SCHEMA owned")
        rawdb.execute(owner_url, f'CREATE SCHEMA "{role}" AUTHORIZATION "{role}"')

        out = run_cli(
            "--db", app_url, "reconcile", "--due"
        )  # a command that writes makes the ledger
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert 'create extension "pg_trgm"' in out.stderr, out.stderr
        assert (
            rawdb.execute(owner_url, "SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'")
            == []
        )
        assert (
            rawdb.execute(owner_url, f"SELECT tablename FROM pg_tables WHERE schemaname = '{role}'")
            == []
        )  # the step that failed took the whole migration with it

        with Ledger.open(owner_url) as led:  # the database's owner: the step makes it
            led.record(new_record("order-10927", params={"order": 10927}), actor="owner")
        assert rawdb.execute(
            owner_url,
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_trgm'",
        ) == [("public",)]
        found = run_cli("--db", owner_url, "queue", "--search", "10927", "-o", "name")
        assert (found.returncode, found.stdout.split()) == (0, ["order-10927"]), found.stderr

        again = run_cli("--db", app_url, "reconcile", "--due")  # now any role can make its ledger
        assert again.returncode == 0, again.stderr
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')
