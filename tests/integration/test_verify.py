"""History is the truth of state (rule 18): the database refuses a status changed with
no event, on both backends (the application's own role on PostgreSQL), and ``settled
verify`` finds every record whose fields its events disagree with (exit 4, naming the
record and the field); a healthy ledger verifies with exit 0 and one summary line."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pg_schemas as pg
import pytest
import rawdb
from records import move, new_record
from support import run_cli

from settled import Ledger
from settled.model import EventKind, Status
from settled.providers.sim_server import SimServer


def _populate(where: Any, sim: SimServer) -> None:
    """Records in many states, written by real commands."""
    env = {"SETTLED_DB": str(where)}
    sim.plan("lost", "lost_after_accept")
    sim.plan("bounced", "bounce")
    sim.plan("rejected", "reject")
    for aid, op in [
        ("booked", "book"),
        ("sent", "send"),
        ("lost", "send"),
        ("bounced", "send"),
        ("rejected", "book"),
        ("blind", "notify"),
        ("partial", "deliver"),
    ]:
        done = run_cli("dispatch", "sim", op, "--action-id", aid, env=env)
        assert done.returncode in (0, 3, 4, 5), done.stderr
    assert run_cli("reconcile", "--due", env=env).returncode == 0
    resolved = run_cli("resolve", "blind", "--applied", "--reason", "seen", "--by", "al", env=env)
    assert resolved.returncode == 0, resolved.stderr
    retried = run_cli("retry", "rejected", "--no-recheck", "--yes", env=env)
    assert retried.returncode in (0, 3, 4, 5), retried.stderr


@contextmanager
def _app_role(db_path: str) -> Iterator[str]:
    """The application role docs/postgres.md sets up: not the tables' owner."""
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
        ):
            admin.execute(grant)
        yield f"postgresql://{role}@/test?{db_path.split('?', 1)[1]}"
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


def test_a_healthy_ledger_verifies(db_path: Any, sim_config: Path, sim: SimServer) -> None:
    _populate(db_path, sim)
    before = rawdb.history(db_path)
    done = run_cli("verify")
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert "\n" not in line and line.startswith("checked 7 records (those with an event")
    assert line.endswith(" events: no disagreement") and not done.stderr
    as_json = json.loads(run_cli("verify", "--full", "--json").stdout)
    assert as_json["ok"] and as_json["records"] == 7 and as_json["findings"] == []
    assert as_json["mode"] == "full" and as_json["since_event"] is None
    assert rawdb.history(db_path) == before
    with Ledger.open(db_path) as led:
        assert led.integrity_check() == "ok"


def test_verify_never_makes_a_ledger(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    done = run_cli("--db", str(missing), "verify")
    assert done.returncode == 1 and "no ledger at" in done.stderr and not missing.exists()


def test_a_status_changed_behind_settleds_back_is_refused_by_the_database(db_path: Any) -> None:
    with Ledger.open(db_path) as led:
        led.record(new_record("a-1"), actor="t")
        led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT, lease_owner="d"))
        led.move(
            move(
                "a-1",
                Status.IN_FLIGHT,
                Status.CONFIRMED,
                EventKind.OUTCOME,
                acceptance="ACCEPTED",
                delivery="DELIVERED",
                confirmed_by="provider",
            )
        )
    before = rawdb.history(db_path)
    if rawdb.is_pg(db_path):
        with _app_role(db_path) as app:  # the role settled runs as: refused at its commit
            with pytest.raises(rawdb.psycopg.Error, match="changes only with the event"):
                rawdb.execute(app, "UPDATE actions SET status = 'FAILED'")
            # and within a transaction that writes no event for the change
            import psycopg

            with psycopg.connect(app) as conn, pytest.raises(psycopg.Error, match="the event"):
                conn.execute("UPDATE actions SET status = 'FAILED' WHERE action_id = 'a-1'")
                conn.execute(
                    "INSERT INTO events (action_id, at, actor, kind, from_status, to_status,"
                    " attempt, detail) VALUES ('a-1', now(), 'x', 'note', 'CONFIRMED',"
                    " 'CONFIRMED', 1, '{}')"
                )
                conn.commit()
    else:
        with pytest.raises(sqlite3.Error, match="changes only with the event"):
            rawdb.execute(db_path, "UPDATE actions SET status = 'FAILED'")
    assert rawdb.history(db_path) == before
    assert run_cli("verify").returncode == 0


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("acceptance", "REJECTED", "ACCEPTED"),
        ("confirmed_by", None, "who confirmed it"),
        ("attempt", 2, "1"),
        ("confirmed_by", "mallory", "provider"),
        ("delivery", "PENDING", None),
    ],
)
def test_what_the_database_cannot_refuse_verify_finds(
    db_path: Any, column: str, value: Any, says: str | None
) -> None:
    with Ledger.open(db_path) as led:
        led.record(new_record("fine"), actor="t")
        led.record(new_record("a-1"), actor="t")
        led.move(
            move("a-1", Status.PENDING, Status.IN_FLIGHT, lease_owner="d", delivery="IN_FLIGHT")
        )
        led.move(
            move(
                "a-1",
                Status.IN_FLIGHT,
                Status.CONFIRMED,
                EventKind.OUTCOME,
                acceptance="ACCEPTED",
                delivery="DELIVERED",
                confirmed_by="provider",
            )
        )
    if column == "delivery":  # a claimed record that says it was never sent
        with Ledger.open(db_path) as led:
            led.record(new_record("a-2"), actor="t")
            led.move(
                move("a-2", Status.PENDING, Status.IN_FLIGHT, lease_owner="d", delivery="IN_FLIGHT")
            )
        target, says = "a-2", "IN_FLIGHT"
    else:
        target = "a-1"

    def tamper(where: str) -> None:
        rawdb.execute(
            where, f"UPDATE actions SET {column} = ? WHERE action_id = ?", (value, target)
        )

    if rawdb.is_pg(db_path):
        with _app_role(db_path) as app:
            tamper(app)
    else:
        tamper(db_path)
    before = rawdb.history(db_path)
    done = run_cli("verify")
    assert done.returncode == 4, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[-1].endswith(": 1 disagreement"), lines
    assert lines[0].startswith(f"{target}: {column}: record says {value}, events say {says}"), lines
    found = json.loads(run_cli("verify", "--json").stdout)
    assert not found["ok"] and [(f["action_id"], f["field"]) for f in found["findings"]] == [
        (target, column)
    ]
    assert rawdb.history(db_path) == before  # verify only reads
    with Ledger.open(db_path) as led:
        assert led.integrity_check().startswith("1 disagreement between records and events; ")


def test_a_damaged_row_stops_every_command_that_reads_it_with_one_line(db_path: Any) -> None:
    """A column edited by hand: every command that reads the row says the ledger is
    damaged there and what `verify` does (exit 1, one line, no decoder's traceback or
    'internal error'), and changes nothing."""
    with Ledger.open(db_path) as led:
        led.record(new_record("a-1"), actor="t")
        led.record(new_record("a-2"), actor="t")
    rawdb.execute(db_path, "UPDATE actions SET params = '{cut' WHERE action_id = 'a-1'")
    before = rawdb.history(db_path)
    for argv in (
        ["show", "a-1"],
        ["show", "a-1", "--json"],
        ["queue", "--status", "all"],
        ["queue", "--status", "PENDING", "--json"],
        ["resolve", "a-1", "--not-applied", "--reason", "checked"],
    ):
        done = run_cli(*argv)
        line = done.stderr.strip()
        assert done.returncode == 1, (argv, done.returncode, done.stderr)
        assert "\n" not in line and "Traceback" not in line and "internal error" not in line
        assert "is damaged" in line and "'a-1'" in line and "settled verify" in line, line
    assert run_cli("show", "a-2").returncode == 0  # the rows around it still read
    assert rawdb.history(db_path) == before


@pytest.mark.sqlite_only
def test_an_event_without_its_record_and_a_damaged_row(db_path: Any) -> None:
    with Ledger.open(db_path) as led:
        led.record(new_record("a-1"), actor="t")
    conn = sqlite3.connect(db_path, isolation_level=None)  # foreign keys off on this one
    conn.execute(
        "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
        " detail) VALUES ('gone', '2026-01-01T00:00:00.000000Z', 't', 'recorded', NULL,"
        " 'PENDING', 1, '{}')"
    )
    conn.close()
    done = run_cli("verify")
    assert done.returncode == 4
    assert "gone: record: record says missing" in done.stdout, done.stdout
    rawdb.execute(db_path, "UPDATE actions SET params = '{cut' WHERE action_id = 'a-1'")
    broken = run_cli("verify")
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    line = broken.stderr.strip()
    assert "\n" not in line and "is damaged" in line and "'a-1'" in line and "params" in line
