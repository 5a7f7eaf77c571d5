"""Migrations are explicit (rule 18): no command migrates a ledger as it opens it.

A read-only command reads an older ledger as it is when its tables hold every column
settled reads, else refuses it with "run `settled migrate`"; either way the ledger is
left byte for byte as it was. A writing command refuses it. ``settled migrate`` lists
its steps, backs a SQLite ledger up first when asked, and announces each step; a
daemon (and ``serve --reconcile``) whose ledger's schema moves under it stops with one
line. Real processes, real files, a real PostgreSQL schema."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import stat
import subprocess
import sys
import threading
import time
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import new_record
from support import ROOT, popen_cli, run_cli
from test_migrate_checks import UNDO_ORDER, before_the_step, the_step

from settled import Ledger, errors
from settled.model import Tier
from settled.storage import postgres_schema, sqlite_schema

pytestmark = pytest.mark.slow

READ_ONLY = [
    ("show", "old"),
    ("show", "old", "--json"),
    ("queue",),
    ("queue", "--json"),
    ("stats",),
    ("stats", "--json"),
    ("providers", "audit"),
    ("providers", "audit", "--json"),
]
WRITING = [
    ("reconcile", "--due"),
    ("reconcile", "old"),
    ("resolve", "old", "--applied", "--reason", "seen in the provider's console"),
    ("retry", "old", "--no-recheck"),
    ("daemon", "--once"),
    ("confirm", "old"),
    ("serve", "--listen", "127.0.0.1:0"),
]


def steps_of(location: Any) -> list[tuple[str, Any]]:
    return (postgres_schema if rawdb.is_pg(location) else sqlite_schema).MIGRATIONS


def latest(location: Any) -> int:
    return len(steps_of(location))


def stored_version(location: Any) -> int:
    if rawdb.is_pg(location):
        return int(rawdb.execute(location, "SELECT version FROM settled_ledger")[0][0])
    return int(rawdb.execute(location, "PRAGMA user_version")[0][0])


def snapshot(location: Any) -> Any:
    """What must not change: the file's bytes and mtime, and no WAL or shm left beside
    it (SQLite); every row and the schema (PostgreSQL)."""
    if rawdb.is_pg(location):
        return rawdb.dump(location)
    path = Path(location)
    debris = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "-"))
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, debris


def old_ledger(location: Any) -> None:
    """A ledger one step behind, with a record: as an earlier settled left it."""
    with Ledger.open(location) as led:
        led.record(new_record("old", tier=Tier.RECONCILABLE), actor="t")
    before_the_step(location)
    assert stored_version(location) == old_version(location)


def behind_by_an_index(location: Any) -> None:
    """A ledger one step behind whose missing step adds no column (the queue's order
    indexes): every column settled reads is there, the version is one behind."""
    number = latest(location)
    name = steps_of(location)[-1][0]
    assert name.endswith("_queue_order"), "the latest step is expected to add no column"
    with Ledger.open(location) as led:
        led.record(new_record("old", tier=Tier.RECONCILABLE), actor="t")
    for statement in UNDO_ORDER:
        rawdb.execute(location, statement)
    rawdb.execute(location, "DELETE FROM _migrations WHERE name = ?", (name,))
    if rawdb.is_pg(location):
        rawdb.execute(location, "UPDATE settled_ledger SET version = ?", (number - 1,))
    else:
        rawdb.execute(location, f"PRAGMA user_version = {number - 1}")


def old_version(location: Any) -> int:
    """The schema version of the ledger ``old_ledger`` makes: before the checks step."""
    return the_step(location)[0] - 1


def pending(location: Any) -> list[tuple[str, int, int]]:
    """The steps such a ledger lacks: (name, from, to), oldest first."""
    old, steps = old_version(location), steps_of(location)
    return [(steps[i][0], i, i + 1) for i in range(old, len(steps))]


def refusal(location: Any) -> str:
    n = latest(location)
    return (
        f"has ledger schema {old_version(location)}, this settled needs {n}: run `settled migrate`"
    )


# -- commands that only read --------------------------------------------------------------


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_refuses_an_old_ledger_and_leaves_it_as_it_was(
    location: Any, args: tuple[str, ...]
) -> None:
    old_ledger(location)
    before = snapshot(location)
    out = run_cli(*args)
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("\n") == 1 and refusal(location) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert snapshot(location) == before
    assert stored_version(location) == old_version(location)


def test_a_read_only_command_reads_an_old_ledger_that_holds_every_column(
    location: Any,
) -> None:
    behind_by_an_index(location)
    before = snapshot(location)
    shown = run_cli("show", "old", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["action_id"] == "old"
    listed = run_cli("queue", "--status", "PENDING", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["action_id"] for r in json.loads(listed.stdout)] == ["old"]
    stats = run_cli("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["by_status"]["PENDING"] == 1
    assert snapshot(location) == before
    verified = run_cli("verify", "--json")  # it changes no record, and stores its checkpoint
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert stored_version(location) == latest(location) - 1


def test_the_library_still_migrates_by_default_and_refuses_when_asked(location: Any) -> None:
    old_ledger(location)
    with pytest.raises(errors.LedgerOutdated, match="run `settled migrate`"):
        Ledger.open(location, migrate=False)
    with pytest.raises(errors.LedgerOutdated, match="run `settled migrate`"):
        Ledger.open(location, read_only=True)
    assert stored_version(location) == old_version(location)
    with Ledger.open(location) as led:  # the default, as before: migrated as it opens
        assert led.schema == led.schema_version() == latest(location)
        assert led.get("old").counted_checks == 0


# -- commands that write ------------------------------------------------------------------


@pytest.mark.parametrize("args", WRITING, ids=" ".join)
def test_a_writing_command_refuses_an_old_ledger(location: Any, args: tuple[str, ...]) -> None:
    old_ledger(location)
    before = snapshot(location)
    out = run_cli(*args)
    assert out.returncode == 1, out.stderr
    assert refusal(location) in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert snapshot(location) == before


def test_a_writing_command_still_creates_a_missing_ledger_at_the_latest_schema(
    location: Any,
) -> None:
    out = run_cli("daemon", "--once")
    assert out.returncode == 0, out.stderr
    assert stored_version(location) == latest(location)


# -- settled migrate ----------------------------------------------------------------------


def test_migrate_dry_run_lists_the_steps_and_changes_nothing(location: Any) -> None:
    old_ledger(location)
    n, old, steps = latest(location), old_version(location), pending(location)
    before = snapshot(location)
    out = run_cli("migrate", "--dry-run")
    assert out.returncode == 0, out.stderr
    for name, a, b in steps:
        assert re.search(rf"^  {name} +schema {a} → {b}$", out.stdout, re.M), out.stdout
    assert "dry run: nothing was changed" in out.stdout and "applied" not in out.stdout
    as_json = run_cli("migrate", "--dry-run", "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["from"], report["to"], report["dry_run"]) == (old, n, True)
    assert report["steps"] == [
        {"step": name, "from": a, "to": b, "applied": False} for name, a, b in steps
    ]
    assert snapshot(location) == before


def test_migrate_announces_each_step_and_then_says_the_ledger_is_up_to_date(
    location: Any,
) -> None:
    old_ledger(location)
    n, steps = latest(location), pending(location)
    out = run_cli("migrate")
    assert out.returncode == 0, out.stderr
    for name, a, b in steps:
        assert f"applied {name}: schema {a} → {b}\n" in out.stdout
        assert out.stdout.index(f"  {name} ") < out.stdout.index(f"applied {steps[0][0]}")
    assert stored_version(location) == n
    shown = run_cli("show", "old", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["counted_checks"] == 0
    again = run_cli("migrate")
    assert again.returncode == 0, again.stderr
    assert f"is up to date (schema {n})" in again.stdout and "applied" not in again.stdout
    report = json.loads(run_cli("migrate", "--json").stdout)
    assert (report["from"], report["to"], report["steps"]) == (n, n, [])


def test_migrate_json_reports_the_steps_it_applied(location: Any) -> None:
    old_ledger(location)
    n, old, steps = latest(location), old_version(location), pending(location)
    out = run_cli("migrate", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["steps"] == [
        {"step": name, "from": a, "to": b, "applied": True} for name, a, b in steps
    ]
    assert (report["from"], report["to"], report["backup"]) == (old, n, None)
    assert stored_version(location) == n


def test_migrate_on_a_missing_ledger_exits_1_with_its_path(location: Any) -> None:
    out = run_cli("migrate")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    if rawdb.is_pg(location):
        assert "no ledger at postgresql://" in out.stderr
    else:
        assert f"no ledger at {location}" in out.stderr and not Path(location).exists()


@pytest.mark.sqlite_only
def test_migrate_backup_leaves_a_copy_that_opens_at_the_old_version(
    location: Path, tmp_path: Path
) -> None:
    old_ledger(location)
    n, old = latest(location), old_version(location)
    copy = tmp_path / "before.db"
    out = run_cli("migrate", "--backup", str(copy))
    assert out.returncode == 0, out.stderr
    assert f"backed up to {copy} (schema {old})" in out.stdout
    assert out.stdout.index("backed up") < out.stdout.index("applied")
    assert stored_version(location) == n
    assert stored_version(copy) == old
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # it holds every action's params
    with Ledger.open_for_migration(copy) as led:
        assert led.schema == old
        assert [s for s, _ in led.pending_steps()] == list(range(old + 1, n + 1))
    assert rawdb.execute(copy, "SELECT action_id FROM actions") == [("old",)]
    assert rawdb.execute(copy, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.sqlite_only
def test_migrate_refuses_a_backup_path_that_exists_and_changes_nothing(
    location: Path, tmp_path: Path
) -> None:
    old_ledger(location)
    taken = tmp_path / "taken.db"
    taken.write_text("keep me")
    before = snapshot(location)
    out = run_cli("migrate", "--backup", str(taken))
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "already there" in out.stderr
    assert out.stdout == "" and taken.read_text() == "keep me"
    assert snapshot(location) == before


@pytest.mark.postgres_only
def test_migrate_backup_on_postgres_is_refused_pointing_at_pg_dump(location: str) -> None:
    old_ledger(location)
    before = snapshot(location)
    out = run_cli("migrate", "--backup", "copy.db")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "pg_dump" in out.stderr
    assert snapshot(location) == before
    assert not (ROOT / "copy.db").exists()


# -- a running daemon whose ledger's schema moves ------------------------------------------


# `settled migrate` of a newer settled: this one with one more schema step (a table).
NEWER_SETTLED = """
import sys
from settled.storage import postgres_schema, sqlite, sqlite_schema
from settled.storage.postgres import PostgresLedger

sqlite_schema.MIGRATIONS.append(("999_newer", lambda db: db.execute("CREATE TABLE newer (x)")))
sqlite.SCHEMA_VERSION = sqlite_schema.LATEST = len(sqlite_schema.MIGRATIONS)
sqlite.SqliteLedger.latest_schema = sqlite.SCHEMA_VERSION
postgres_schema.MIGRATIONS.append(("999_newer", lambda cur: cur.execute("CREATE TABLE newer (x int)")))
postgres_schema.LATEST = len(postgres_schema.MIGRATIONS)
PostgresLedger.latest_schema = postgres_schema.LATEST
from settled.cli import main
main(sys.argv[1:])
"""


def newer_step(location: Any) -> int:
    """Run a newer settled's `settled migrate` on the ledger, as a real process; the
    schema version it leaves."""
    n = latest(location) + 1
    out = subprocess.run(
        [sys.executable, "-c", NEWER_SETTLED, "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert f"applied 999_newer: schema {n - 1} → {n}" in out.stdout, out.stdout
    assert stored_version(location) == n
    return n


class Lines:
    """A process's stderr, line by line, read while it runs (bounded waits only)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.proc, self.seen, self._q = proc, [], queue.Queue[str | None]()
        stream = proc.stderr

        def read() -> None:
            with stream:
                for line in stream:
                    self._q.put(line)
            self._q.put(None)

        threading.Thread(target=read, daemon=True).start()

    def wait_for(self, event: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if line.startswith("{") and json.loads(line).get("event") == event:
                return dict(json.loads(line))
        raise AssertionError(f"no {event!r} line; the process said: {''.join(self.seen)}")

    def rest(self, timeout: float = 60) -> list[dict[str, Any]]:
        self.proc.wait(timeout)
        while (line := self._q.get(timeout=timeout)) is not None:
            self.seen.append(line)
        return [json.loads(x) for x in self.seen if x.startswith("{")]


def test_a_running_daemon_stops_with_one_line_when_its_ledger_is_migrated(
    location: Any,
) -> None:
    with Ledger.open(location) as led:
        led.record(new_record("a", tier=Tier.RECONCILABLE), actor="t")
    n = latest(location)
    proc = popen_cli("daemon", "--interval", "0.2", "--heartbeat", "1")
    try:
        out = Lines(proc)
        out.wait_for("started")
        out.wait_for("heartbeat")  # up and running passes on schema n
        moved_to = newer_step(location)
        changed = out.wait_for("ledger_changed")
        log = out.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 1, "".join(out.seen)
    assert (changed["schema_was"], changed["schema_now"], changed["level"]) == (
        n,
        moved_to,
        "error",
    )
    assert changed["message"] == (
        f"stopping: the ledger's schema moved from {n} to {moved_to} (a newer settled "
        "migrated it); start this version's daemon"
    )
    events = [e["event"] for e in log]
    assert events.count("ledger_changed") == 1 and events[-1] == "stopped"
    assert "pass_failed" not in events and events.index("ledger_changed") < events.index("stopped")
    assert len(out.seen) == len(log)  # every line the daemon wrote is a JSON line
    # and this settled now refuses the ledger it does not know, with one line
    refused = run_cli("show", "a")
    assert refused.returncode == 1 and "written by a newer settled" in refused.stderr


@pytest.mark.sqlite_only
def test_serve_reconcile_stops_with_one_line_when_its_ledger_is_migrated(
    location: Path,
) -> None:
    pytest.importorskip("uvicorn")
    with Ledger.open(location) as led:
        led.record(new_record("a", tier=Tier.RECONCILABLE), actor="t")
    n = latest(location)
    proc = popen_cli("serve", "--listen", "127.0.0.1:0", "--reconcile")
    try:
        out = Lines(proc)
        out.wait_for("listening")
        moved_to = newer_step(location)
        changed = out.wait_for("ledger_changed")
        log = out.rest()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 1, "".join(out.seen)
    assert (changed["schema_was"], changed["schema_now"]) == (n, moved_to)
    events = [(e["event"], e.get("reason")) for e in log]
    assert [e for e, _ in events].count("ledger_changed") == 1, "".join(out.seen)
    assert events[-2:] == [("stopping", "ledger_changed"), ("stopped", None)], events


# -- the version ---------------------------------------------------------------------------


@pytest.mark.ledger_incidental
def test_version_names_the_package_and_the_ledger_schema_versions() -> None:
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"settled {version('settled')} (ledger schema {sqlite_schema.LATEST}; "
        f"PostgreSQL ledger schema {postgres_schema.LATEST})\n"
    )


@pytest.mark.ledger_incidental
def test_the_version_has_one_source_and_a_changelog_entry() -> None:
    import settled

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert declared == version("settled") == settled.__version__
    assert "__version__ =" not in (ROOT / "settled" / "__init__.py").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(declared)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    assert "settled migrate" in changelog


def test_no_debris_is_left_by_a_refused_open(location: Any) -> None:
    """The refusal happens before anything is written: a read-only open of an old
    SQLite ledger leaves no -wal or -shm file beside it."""
    old_ledger(location)
    with pytest.raises(errors.LedgerOutdated):
        Ledger.open(location, read_only=True)
    if not rawdb.is_pg(location):
        assert not os.path.exists(f"{location}-wal") and not os.path.exists(f"{location}-shm")
