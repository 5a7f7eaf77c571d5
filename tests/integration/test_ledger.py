"""The ledger: created 0600, never writes to what is not a ledger, append-only
events, migrations, bounded waits on a locked ledger. (The PostgreSQL schema's own
checks are in test_postgres.py.)"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import T0, move, new_record

from settled import policy
from settled.errors import Conflict, LedgerBusy, LedgerError, TransitionNotAllowed
from settled.model import EventKind, Status
from settled.storage import Ledger
from settled.storage import sqlite_schema as migrations
from settled.storage.sqlite import APPLICATION_ID, SCHEMA_VERSION


@pytest.mark.sqlite_only
def test_new_ledger_is_0600_even_with_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "new.db"
        with Ledger.open(path) as led:
            led.record(new_record(), actor="t")
            # SQLite gives its -wal and -shm files the main file's mode
            for suffix in ("-wal", "-shm"):
                side = Path(str(path) + suffix)
                assert stat.S_IMODE(side.stat().st_mode) == 0o600, suffix
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.sqlite_only
def test_pragmas_and_identity(ledger: Ledger) -> None:
    c = ledger.conn
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert c.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.sqlite_only
def test_schema_version_matches_migrations() -> None:
    assert SCHEMA_VERSION == migrations.LATEST


@pytest.mark.sqlite_only
def test_migrating_an_empty_database_gives_the_schema(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "a.db") as led:
        tables = {
            r[0] for r in led.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        triggers = {
            r[0] for r in led.conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        }
        indexes = {
            r[0] for r in led.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        applied = [r[0] for r in led.conn.execute("SELECT name FROM _migrations")]
        cols = [r[1] for r in led.conn.execute("PRAGMA table_info(actions)")]
    assert {"actions", "events", "_migrations"} <= tables
    assert triggers == {
        "events_no_update",
        "events_no_delete",
        "actions_no_delete",
        "events_no_replace",
        "actions_no_replace",
        "callbacks_as_received",
        "callbacks_no_delete",
        "callbacks_no_replace",
        "actions_status_has_event",
        "actions_not_moved_insert",
        "actions_not_moved_update",
        "events_not_moved_insert",
        "callbacks_not_moved_insert",
        "callbacks_not_moved_update",
        "ledger_events_no_update",
        "ledger_events_no_delete",
        "ledger_events_not_moved_insert",
        "erasing_settled_only",
        "erasing_audited",
        "erasing_not_moved_insert",
        "actions_search_insert",
        "actions_search_update",
        "actions_search_delete",
    }
    assert {
        "clock_anchors",
        "callbacks",
        "ledger_moved",
        "ledger_events",
        "erasing",
        "actions_search",
    } <= tables
    assert {"actions_due", "actions_status", "events_action", "actions_same_change"} <= indexes
    assert applied == [name for name, _ in migrations.MIGRATIONS]
    for field in (
        "action_id",
        "params_hash",
        "eligible_at",
        "idempotency_key",
        "next_check_at",
        "lands_by",
        "contradiction",
        "declared",
    ):
        assert field in cols
    # reopening applies nothing twice
    with Ledger.open(tmp_path / "a.db") as led:
        assert led.conn.execute("SELECT count(*) FROM _migrations").fetchone()[0] == len(applied)


@pytest.mark.sqlite_only
def test_due_scan_uses_the_partial_index(ledger: Ledger) -> None:
    plan = " ".join(
        str(r)
        for r in ledger.conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM actions WHERE next_check_at IS NOT NULL "
            "AND next_check_at <= ? ORDER BY next_check_at LIMIT 10",
            ("z",),
        )
    )
    assert "actions_due" in plan


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    "content",
    [b"this is my shopping list\n", b"\x00" * 4096, b"SQLite format 3\x00" + b"\xff" * 5000],
    ids=["text", "zeros", "corrupt-sqlite"],
)
def test_not_a_ledger_is_never_written(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(LedgerError):
        Ledger.open(path)
    assert path.read_bytes() == content


@pytest.mark.sqlite_only
def test_other_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (x)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="not a settled ledger"):
        Ledger.open(path)
    assert path.read_bytes() == before


@pytest.mark.sqlite_only
def test_truncated_ledger_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with Ledger.open(path) as led:
        led.record(new_record(), actor="t")
        led.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    cut = data[: len(data) // 2 + 7]
    path.write_bytes(cut)
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    with pytest.raises(LedgerError), Ledger.open(path) as led:
        led.get("a-1")
    assert path.read_bytes() == cut


def test_events_are_append_only_in_the_database(ledger: Ledger, db_path: Path) -> None:
    ledger.record(new_record(), actor="t")
    for sql in ("UPDATE events SET actor = 'x'", "DELETE FROM events", "DELETE FROM actions"):
        with pytest.raises(rawdb.RAW_ERRORS, match="settled: "):
            rawdb.execute(db_path, sql)
    assert ledger.events("a-1")[0].actor == "t"


def test_record_same_id_other_params_is_a_conflict(ledger: Ledger) -> None:
    rec, created = ledger.record(new_record(), actor="t")
    assert created
    again, created2 = ledger.record(new_record(), actor="t")
    assert not created2 and again.action_id == rec.action_id
    with pytest.raises(Conflict):
        ledger.record(new_record(params={"a": 1}), actor="t")
    assert len(ledger.events("a-1")) == 1


def test_transition_guard_and_table(ledger: Ledger) -> None:
    ledger.record(new_record(), actor="t")
    with pytest.raises(TransitionNotAllowed):
        move("a-1", Status.PENDING, Status.CONFIRMED, EventKind.OUTCOME)
    won = ledger.move(move("a-1", Status.PENDING, Status.IN_FLIGHT))
    lost = ledger.move(move("a-1", Status.PENDING, Status.IN_FLIGHT))
    assert won is not None and won.status is Status.IN_FLIGHT
    assert lost is None
    assert [e.kind for e in ledger.events("a-1")] == ["recorded", "claimed"]
    with pytest.raises(ValueError):
        move("a-1", Status.IN_FLIGHT, Status.FAILED, EventKind.OUTCOME, action_id="evil")


@pytest.mark.sqlite_only
def test_locked_ledger_waits_a_bounded_time_then_says_so(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path) as led:
        led.record(new_record(), actor="t")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Ledger.open(path, busy_timeout=0.3) as led:
            assert led.get("a-1").status is Status.PENDING  # reads still work under WAL
            with pytest.raises(LedgerBusy, match="locked by another writer"):
                led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Ledger.open(path) as led:
        assert led.get("a-1").status is Status.PENDING
        assert len(led.events("a-1")) == 1


@pytest.mark.slow
def test_processes_creating_one_new_ledger_at_once_all_succeed(
    tmp_path: Path, backend: str, fresh_location: Callable[[str], Any]
) -> None:
    """Real processes open (and so create and migrate) the same new ledger at the same
    moment: none may see a half-made ledger and refuse it."""
    import subprocess
    import sys

    code = (
        "import sys; from settled import Ledger\n"
        "from settled.model import Status\n"
        "with Ledger.open(sys.argv[1]) as led:\n"
        "    assert led.count() >= 0 and led.integrity_check() == 'ok'\n"
    )
    for round_ in range(10 if backend == "sqlite" else 4):
        where = fresh_location(f"new-{round_}.db")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(where)], stderr=subprocess.PIPE, text=True
            )
            for _ in range(6)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        with Ledger.open(where, create=False) as led:
            assert led.integrity_check() == "ok"


@pytest.mark.sqlite_only
def test_a_new_ledger_is_made_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new ledger's whole schema, its steps' names, its version and the mark
    (application_id) land in one transaction: no process can ever see tables in an
    unmarked file, nor a ledger half built that a command that never migrates would
    refuse as older."""
    # the script fails at its last statement, everything before it made
    monkeypatch.setattr(migrations, "FRESH", (*migrations.FRESH, migrations.FRESH[0]))
    path = tmp_path / "half.db"
    with pytest.raises(LedgerError, match="already exists"):
        Ledger.open(path)
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 0
        assert con.execute("PRAGMA application_id").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    finally:
        con.close()
    monkeypatch.undo()
    with Ledger.open(path) as led:  # made whole on the next open
        assert led.schema_version() == migrations.LATEST
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        con.close()


def test_a_group_is_recorded_and_claimed_in_one_transaction(ledger: Ledger) -> None:
    recs = [new_record(f"m{i}") for i in range(3)]
    assert all(r.declared is not None for r in recs)
    pairs = [
        (
            r,
            policy.claim(
                r,
                r.declared,
                T0,
                actor="t",
                grace=1.0,  # type: ignore[arg-type]
                default_backoff=0.05,
            ).move,
        )
        for r in recs
    ]
    out = ledger.record_and_claim_many(pairs, actor="t")
    assert [created for _, created in out] == [True] * 3
    assert all(r.status is Status.IN_FLIGHT for r, _ in out)
    # a repeat and a same-id-other-params are both "not created": the caller compares
    again = ledger.record_and_claim_many(
        [pairs[0], (new_record("m1", {"x": 1}), pairs[1][1])], actor="t"
    )
    assert [created for _, created in again] == [False, False]
    assert again[1][0].params == {}
    assert [e.kind for e in ledger.events("m0")] == ["recorded", "claimed"]


def test_moves_alike_in_one_group_are_each_guarded(ledger: Ledger) -> None:
    """Moves of one shape committed together (a batch's results, a group's outcomes)
    are written together, each under its own guard: one that no longer holds changes
    nothing and records no event, the others are written; the same record twice in
    one group moves once."""
    for i in range(4):
        ledger.record(new_record(f"g{i}"), actor="t")
    assert ledger.move(move("g1", Status.PENDING, Status.IN_FLIGHT)) is not None
    claims = [move(f"g{i}", Status.PENDING, Status.IN_FLIGHT) for i in range(4)]
    assert ledger.commit(claims) == [True, False, True, True]
    assert [e.kind for e in ledger.events("g1")] == ["recorded", "claimed"]
    assert all(ledger.get(f"g{i}").status is Status.IN_FLIGHT for i in range(4))
    failed = [
        move(a, Status.IN_FLIGHT, Status.FAILED, EventKind.OUTCOME) for a in ("g0", "g0", "g2")
    ]
    assert ledger.commit(failed) == [True, False, True]
    assert [e.kind for e in ledger.events("g0")] == ["recorded", "claimed", "outcome"]
    assert ledger.status_counts() == {("IN_FLIGHT", "p"): 2, ("FAILED", "p"): 2}


def test_threads_opening_and_closing_one_ledger_never_corrupt_it(tmp_path: Path) -> None:
    """Processes whose threads each open, write and close the same ledger. Closing any
    descriptor of the file drops every POSIX lock the process holds on it, including a
    lock another thread's connection holds mid-write; the ledger never does that (it
    reads the header through SQLite), so nothing is lost and the file stays sound."""
    import subprocess
    import sys

    path = tmp_path / "threads.db"
    code = (
        "import sys, threading\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from records import new_record\n"
        "from settled.storage import Ledger\n"
        "def work(t):\n"
        "    for i in range(25):\n"
        "        with Ledger.open(sys.argv[1], busy_timeout=30) as led:\n"
        "            led.record(new_record(f'{sys.argv[2]}-{t}-{i}'), actor='t')\n"
        "threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
    )
    tests = str(Path(__file__).resolve().parents[1] / "helpers")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), f"p{n}", tests],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    with Ledger.open(path) as led:
        assert led.integrity_check() == "ok"
        assert led.count() == 3 * 4 * 25
