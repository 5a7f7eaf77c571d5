"""The counts every write keeps in its own transaction (records per status, provider and
operation), on both backends: what ``stats``, the API's counts and ``/metrics`` read
instead of an aggregate of the ledger. They stay equal to a recount through every write
of history, through a migration from a ledger written before them, through a copy, and
through a writer killed (SIGKILL) in the middle of its transaction; ``verify`` finds a
count that is not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import new_record
from support import HELPERS, run_cli, sim_conf, write_config
from test_migrate_checks import UNDO_PG, UNDO_SQLITE

from settled import Ledger
from settled.model import Tier
from settled.providers.sim_server import SimServer
from settled.storage import postgres_schema, sqlite_schema

RECOUNT = "SELECT status, provider, operation, count(*) FROM actions GROUP BY 1, 2, 3"


def recount(location: Any) -> dict[tuple[str, str, str], int]:
    return {(r[0], r[1], r[2]): int(r[3]) for r in rawdb.execute(location, RECOUNT)}


def kept(location: Any) -> dict[tuple[str, str, str], int]:
    with Ledger.open(location, read_only=True) as led:
        return led.counts()


def test_every_write_of_history_keeps_the_counts_true(location: Any, tmp_path: Path) -> None:
    with SimServer(hang=1.0) as sim:  # the timeout fault: closed unanswered after 1 s
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
        for n in range(4):
            got = run_cli("dispatch", "sim", "send", "--action-id", f"ok-{n}", "--wait", "--json")
            assert got.returncode == 0, got.stderr
        sim.plan("held-1", "timeout_after_apply")
        run_cli("dispatch", "sim", "send", "--action-id", "held-1", "--json")
        sim.plan("no-1", "reject")
        run_cli("dispatch", "sim", "send", "--action-id", "no-1", "--json")
    with Ledger.open(location) as led:
        led.record(new_record("mine-1", provider="mail", operation="send"), actor="t")
        led.record(new_record("mine-1", provider="mail", operation="send"), actor="t")  # taken
    counts = kept(location)
    assert counts == recount(location)
    assert sum(counts.values()) == 7 and counts[("PENDING", "mail", "send")] == 1
    assert len({s for s, _, _ in counts}) >= 2, counts  # the records reached several statuses

    stats = json.loads(run_cli("stats", "--json").stdout)
    assert stats["total"] == 7
    assert stats["counts"] == [
        {"status": s, "provider": p, "operation": o, "count": n}
        for (s, p, o), n in sorted(counts.items())
    ]
    verified = run_cli("verify", "--full", "--json")
    assert verified.returncode == 0, verified.stdout
    assert json.loads(verified.stdout)["counts"] == {"ok": True, "wrong": []}


def test_stats_selected_by_provider_and_status_reads_the_same_figures(location: Any) -> None:
    with Ledger.open(location) as led:
        for n in range(3):
            led.record(new_record(f"a-{n}", provider="mail", operation="send"), actor="t")
        led.record(new_record("b-1", provider="sms", operation="send"), actor="t")
    rawdb.execute(location, "UPDATE action_counts SET n = n")  # nothing but a touch
    got = json.loads(run_cli("stats", "--provider", "mail", "--json").stdout)
    assert (got["total"], got["by_status"]["PENDING"]) == (3, 3)
    got = json.loads(run_cli("stats", "--status", "CONFIRMED,FAILED", "--json").stdout)
    assert got["total"] == 0 and got["counts"] == []


def test_a_count_that_disagrees_with_the_records_is_a_finding(location: Any) -> None:
    with Ledger.open(location) as led:
        led.record(new_record("a-1"), actor="t")
        led.record(new_record("a-2"), actor="t")
    rawdb.execute(location, "UPDATE action_counts SET n = n + 5 WHERE status = 'PENDING'")
    before = rawdb.history(location)
    assert run_cli("verify").returncode == 0  # the records agree; only a recount tells
    got = run_cli("verify", "--full", "--json")
    assert got.returncode == 4, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["ok"] is False and out["findings"] == []
    assert out["counts"]["wrong"] == [
        {"status": "PENDING", "provider": "p", "operation": "o", "kept": 7, "recounted": 2}
    ]
    text = run_cli("verify", "--full")
    assert text.returncode == 4
    assert "count of PENDING p/o: kept 7, records recounted 2" in text.stdout
    assert rawdb.history(location) == before  # verify only reads


def _before_the_counts(location: Any) -> None:
    """The ledger as a settled from before the counts left it (the steps from the
    counts' on undone)."""
    pg = rawdb.is_pg(location)
    steps = (postgres_schema if pg else sqlite_schema).MIGRATIONS
    number = next(n for n, (name, _) in enumerate(steps, 1) if name.endswith("_counts"))
    undo = UNDO_PG if pg else UNDO_SQLITE  # the later steps undone, newest first
    for statement in undo[: undo.index("DROP TABLE action_counts") + 1]:
        rawdb.execute(location, statement)
    for name, _ in steps[number - 1 :]:
        rawdb.execute(location, "DELETE FROM _migrations WHERE name = ?", (name,))
    if pg:
        rawdb.execute(location, "UPDATE settled_ledger SET version = ?", (number - 1,))
    else:
        rawdb.execute(location, f"PRAGMA user_version = {number - 1}")


def test_the_migration_fills_the_counts_from_the_records(location: Any) -> None:
    with Ledger.open(location) as led:
        for n in range(5):
            led.record(new_record(f"a-{n}", provider="mail", operation="send"), actor="t")
        led.record(new_record("b-1", provider="sms", operation="page"), actor="t")
    _before_the_counts(location)
    assert run_cli("migrate").returncode == 0
    assert (
        kept(location)
        == recount(location)
        == {
            ("PENDING", "mail", "send"): 5,
            ("PENDING", "sms", "page"): 1,
        }
    )
    with Ledger.open(location) as led:  # and the writes keep them from there
        led.record(new_record("b-2", provider="sms", operation="page"), actor="t")
        assert led.counts()[("PENDING", "sms", "page")] == 2


def test_a_copied_ledger_has_its_counts(location: Any, tmp_path: Path) -> None:
    with Ledger.open(location) as led:
        for n in range(3):
            led.record(new_record(f"a-{n}", tier=Tier.RECONCILABLE), actor="t")
    target = tmp_path / "copy.db"
    got = run_cli("migrate-ledger", str(location), str(target))
    assert got.returncode == 0, got.stderr
    assert kept(target) == recount(target) == {("PENDING", "p", "o"): 3}


def test_a_dispatch_killed_before_its_outcome_commits_leaves_the_counts_true(
    location: Any, tmp_path: Path
) -> None:
    with SimServer(hang=1.0) as sim:  # the timeout fault: closed unanswered after 1 s
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
        assert run_cli("dispatch", "sim", "send", "--action-id", "first", "--wait").returncode == 0
        got = run_cli(
            "dispatch", "sim", "send", "--action-id", "killed", crash_at="before_commit:outcome"
        )
        assert got.returncode == -signal.SIGKILL, got.stderr
    # the outcome's row, event and counts were written, none committed: the claim stands
    assert rawdb.execute(location, "SELECT status FROM actions WHERE action_id = 'killed'") == [
        ("IN_FLIGHT",)
    ]
    assert kept(location) == recount(location)
    assert run_cli("verify", "--full").returncode == 0


WRITER = """
import sys
from settled import Ledger
from records import new_record

with Ledger.open(sys.argv[1]) as led:
    n = 0
    while True:  # until killed
        led.record(new_record(f"{sys.argv[2]}-{n}", provider="p", operation=f"o{n % 3}"),
                   actor="w")
        n += 1
"""


def _writer(location: Any, prefix: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(HELPERS))
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(location), prefix],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_for_records(location: Any, at_least: int, procs: list[Any]) -> None:
    deadline = time.monotonic() + 60
    while rawdb.execute(location, "SELECT count(*) FROM actions")[0][0] < at_least:
        assert time.monotonic() < deadline, "the writers wrote too little"
        for p in procs:
            assert p.poll() is None, p.communicate()
        time.sleep(0.02)


def test_writers_killed_mid_write_leave_the_counts_true(location: Any) -> None:
    with Ledger.open(location):  # made before the writers race to make it
        pass
    procs = [_writer(location, "w1"), _writer(location, "w2")]
    started = list(procs)
    try:
        for round_ in (1, 2, 3, 4):  # each kill lands wherever its writer happens to be
            _wait_for_records(location, 40 * round_, procs)
            victim = procs[round_ % 2]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
            assert victim.returncode == -signal.SIGKILL
            if round_ < 4:
                procs[round_ % 2] = _writer(location, f"w{round_ % 2 + 1}r{round_}")
                started.append(procs[round_ % 2])
        os.kill(procs[1].pid, signal.SIGKILL)  # the last one too, still writing
        procs[1].wait(timeout=10)
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert kept(location) == recount(location)  # no writer left: one figure each
    assert sum(kept(location).values()) >= 120
    verified = run_cli("verify", "--full", "--json")
    assert verified.returncode == 0, verified.stdout[-2000:]


@pytest.mark.postgres_only
def test_the_slots_of_ended_sessions_fold_into_one_row_per_count(location: Any) -> None:
    for n in range(4):  # four sessions, one after another, each its own slot
        with Ledger.open(location) as led:
            led.record(new_record(f"a-{n}"), actor="t")
    slots = rawdb.execute(location, "SELECT count(*) FROM action_counts")[0][0]
    assert slots >= 2
    deadline = time.monotonic() + 30
    with Ledger.open(location) as led:
        # a session's backend may outlive its client for a moment: fold until it ended
        while rawdb.execute(location, "SELECT slot, n FROM action_counts") != [(0, 4)]:
            assert time.monotonic() < deadline, "ended sessions' slots were never folded"
            led.fold_counts()
            assert led.counts() == {("PENDING", "p", "o"): 4}  # folding changes no figure
            time.sleep(0.05)


@pytest.mark.postgres_only
def test_an_application_role_keeps_writing_after_the_counts_step(location: Any) -> None:
    """The owner migrates; the role that wrote records before is granted the counts."""
    import pg_schemas as pg

    with Ledger.open(location) as led:
        led.record(new_record("before"), actor="owner")
    _before_the_counts(location)
    schema = pg.schema_of(location)
    role = f"{schema}_counts"
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
        with Ledger.open(location) as owner:  # the owner applies the step
            assert owner.counts() == {("PENDING", "p", "o"): 1}
        _, query = str(location).split("?", 1)
        with Ledger.open(f"postgresql://{role}@/test?{query}") as led:
            led.record(new_record("after"), actor="app")
            led.fold_counts()
            assert led.counts() == {("PENDING", "p", "o"): 2}
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.sqlite_only
def test_a_record_removed_with_count_removed_leaves_the_counts_true(location: Any) -> None:
    """What a write that removes records (retention) runs in its transaction: the
    statement that takes the record from its count. Here the delete is made by hand,
    the ledger's own refusal of deletes dropped for it."""
    import sqlite3

    from settled.storage import sqlite as sqlite_backend
    from settled.storage import statements

    with Ledger.open(location) as led:
        for n in range(3):
            led.record(new_record(f"a-{n}"), actor="t")
        gone = led.get("a-1")
    sql, args = statements.count_removed(gone, sqlite_backend.DIALECT)
    conn = sqlite3.connect(location, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER actions_no_delete")
        conn.execute("DROP TRIGGER events_no_delete")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM events WHERE action_id = 'a-1'")
        conn.execute("DELETE FROM actions WHERE action_id = 'a-1'")
        conn.execute(sql, args)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert kept(location) == recount(location) == {("PENDING", "p", "o"): 2}
    assert run_cli("verify", "--full").returncode == 0
