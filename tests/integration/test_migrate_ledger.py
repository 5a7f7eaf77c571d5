"""``settled migrate-ledger FROM TO``: a ledger copied between SQLite and PostgreSQL, in
both directions, loses nothing (every record, every event with its id, time and
evidence), verifies itself, refuses a non-empty target, and lands whole or not at all."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import new_record
from support import popen_cli, run_cli

from settled import Ledger
from settled.errors import LedgerError
from settled.providers.sim_server import SimServer
from settled.storage.ledger import History
from settled.storage.transfer import tally

pytestmark = pytest.mark.postgres_only


def _history(where: Any) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    with Ledger.open(where, create=False) as led:
        return [
            (rec.to_json(), [e.to_json() | {"id": e.id} for e in led.events(rec.action_id)])
            for rec in led.records()
        ]


def _populate(sqlite: Path, sim: SimServer) -> None:
    """Records in every state, written by real commands."""
    env = {"SETTLED_DB": str(sqlite)}
    sim.plan("lost", "lost_after_accept")
    sim.plan("bounced", "bounce")
    sim.plan("rejected", "reject")
    for aid, op, extra in [
        ("booked", "book", []),
        ("sent", "send", []),
        ("lost", "send", []),
        ("bounced", "send", []),
        ("rejected", "book", []),
        ("blind", "notify", []),
        ("partial", "deliver", []),
        ("later", "book", ["--needs-confirmation"]),
        ("wide", "book", ["--params", json.dumps({"to": "ü ✓ \u0001", "n": [1, 2.5, None]})]),
    ]:
        done = run_cli("dispatch", "sim", op, "--action-id", aid, *extra, env=env)
        assert done.returncode in (0, 3, 4, 5), done.stderr
    assert run_cli("reconcile", "--due", env=env).returncode == 0
    resolved = run_cli(
        "resolve", "blind", "--applied", "--reason", "seen by a person", "--by", "alice", env=env
    )
    assert resolved.returncode == 0, resolved.stderr


def test_sqlite_to_postgres_and_back_loses_nothing(
    tmp_path: Path, db_path: str, sim_config: Path, sim: SimServer
) -> None:
    source = tmp_path / "source.db"
    _populate(source, sim)
    original = _history(source)
    assert len(original) == 9 and sum(len(events) for _, events in original) > 20

    there = run_cli("migrate-ledger", str(source), db_path, "--json")
    assert there.returncode == 0, there.stderr
    report = json.loads(there.stdout)
    assert report["verified"] and report["copied"] == report["target"] == report["source"]
    assert report["copied"]["records"] == 9
    assert _history(db_path) == original

    back = tmp_path / "back.db"
    again = run_cli("migrate-ledger", db_path, str(back))
    assert again.returncode == 0, again.stderr
    assert "verified" in again.stderr and report["copied"]["events_sha256"] in again.stdout
    assert _history(back) == original
    # the same record reads the same through the command line on every backend
    shown = {
        str(w): run_cli("--db", str(w), "show", "lost", "--json").stdout
        for w in (source, db_path, back)
    }
    assert len(set(shown.values())) == 1, shown
    # a moved ledger refuses writers with one line naming where it went (rule 17)
    for moved in (source, db_path):
        refused = run_cli("--db", str(moved), "dispatch", "sim", "book", "--action-id", "x")
        assert refused.returncode == 1 and "was moved to" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert str(back) in refused.stderr
    # the copy is a working ledger: new events follow the copied ones
    done = run_cli("--db", str(back), "dispatch", "sim", "book", "--action-id", "after")
    assert done.returncode == 0, done.stderr
    with Ledger.open(back) as led:
        copied_max = max(e["id"] for _, events in original for e in events)
        assert min(e.id for e in led.events("after")) > copied_max


def test_a_non_empty_target_is_refused_and_left_alone(tmp_path: Path, db_path: str) -> None:
    source = tmp_path / "source.db"
    with Ledger.open(source) as led:
        led.record(new_record("a-1"), actor="t")
    with Ledger.open(db_path) as led:
        led.record(new_record("other"), actor="t")
    before = rawdb.dump(db_path)
    done = run_cli("migrate-ledger", str(source), db_path)
    assert done.returncode == 1 and "not empty" in done.stderr, done.stderr
    assert rawdb.dump(db_path) == before
    back = run_cli("migrate-ledger", db_path, str(source))  # and the other way round
    assert back.returncode == 1 and "not empty" in back.stderr


def test_a_missing_source_creates_nothing(tmp_path: Path, db_path: str) -> None:
    done = run_cli("migrate-ledger", str(tmp_path / "nowhere.db"), db_path)
    assert done.returncode == 1 and "no ledger at" in done.stderr
    assert rawdb.execute(
        db_path,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
    ) == [(0,)]


def _wait_for(what: str, ready: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.05)


def _ids(where: Any) -> set[str]:
    try:
        return {str(r[0]) for r in rawdb.execute(where, "SELECT action_id FROM actions")}
    except rawdb.RAW_ERRORS:  # not made yet
        return set()


def test_writers_during_the_copy_wait_and_are_then_refused_by_the_moved_ledger(
    tmp_path: Path, db_path: str, sim_config: Path, sim: SimServer
) -> None:
    """Real processes dispatch to the source one after another while it is copied: the
    copy is the source as it was when writes stopped, every later writer is refused with
    the moved line (exit 1), and nothing the provider received is missing from the copy."""
    source = tmp_path / "source.db"
    codes, errors = tmp_path / "codes.txt", tmp_path / "errors.txt"
    loop = (
        f'for i in $(seq 1 400); do "{sys.executable}" -m settled --db "{source}" dispatch sim'
        f' book --action-id "w-$i" >/dev/null 2>>"{errors}"; echo $? >>"{codes}"; done'
    )
    writer = subprocess.Popen(["bash", "-c", loop], start_new_session=True)
    try:
        _wait_for(
            "three dispatches", lambda: codes.exists() and len(codes.read_text().split()) >= 3
        )
        done = run_cli("migrate-ledger", str(source), db_path, "--wait-for-leases", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (
            report["verified"]
            and report["moved_to"]
            == db_path.split("?", maxsplit=1)[0] + "?" + (db_path.split("?", 1)[1])
        )
        _wait_for(
            "a refused writer", lambda: errors.exists() and "was moved to" in errors.read_text()
        )
    finally:
        os.killpg(writer.pid, signal.SIGTERM)
        writer.wait(timeout=30)
    refused = [line for line in errors.read_text().splitlines() if line.strip()]
    assert refused and all(
        "was moved to" in line and db_path.split("?", maxsplit=1)[0] in line for line in refused
    ), refused
    # the source did not change after the copy, and the copy is all of it
    assert _history(db_path) == _history(source)
    assert report["copied"]["records"] == len(_ids(source)) >= 3
    # every request that reached the provider belongs to an action in the copy
    sent = {r["action_id"] for r in sim.truth()["requests"]}
    assert sent <= _ids(db_path), sorted(sent - _ids(db_path))


def test_a_bulk_dispatch_in_flight_refuses_the_copy_and_the_copy_after_it_is_whole(
    tmp_path: Path, db_path: str, sim_config: Path, sim: SimServer
) -> None:
    source = tmp_path / "source.db"
    lines = tmp_path / "lines.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"action_id": f"b-{n:04}", "params": {"n": n}}) + "\n" for n in range(300)
        )
    )
    for n in range(300):  # each request takes a while: the bulk is still sending when copied
        sim.plan(f"b-{n:04}", "latency:0.05")
    log = tmp_path / "bulk.err"
    with log.open("w") as err_file:
        bulk = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "settled",
                "--db",
                str(source),
                "dispatch",
                "sim",
                "book",
                "--from",
                str(lines),
                "--concurrency",
                "4",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    outcomes = []
    try:
        _wait_for("the first records", lambda: source.exists() and len(_ids(source)) >= 5)
        for _ in range(50):
            done = run_cli("migrate-ledger", str(source), db_path)
            outcomes.append(done.returncode)
            if done.returncode != 7:
                break
            assert "live dispatch lease" in done.stderr and "--wait-for-leases" in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert not _ids(db_path), "a refused copy wrote to the target"
            if bulk.poll() is not None:
                break
        bulk.wait(timeout=120)
        err = log.read_text()
    finally:
        if bulk.poll() is None:
            bulk.kill()
            bulk.wait()
    if outcomes[-1] != 0:  # the bulk finished first: nothing is in flight any more
        done = run_cli("migrate-ledger", str(source), db_path)
        assert done.returncode == 0, done.stderr
    assert "Traceback" not in err and "internal error" not in err, err
    if bulk.returncode != 0:  # it was still sending when the copy was made: then refused
        assert "was moved to" in err, err
    assert _history(db_path) == _history(source)
    sent = {r["action_id"] for r in sim.truth()["requests"]}
    assert sent <= _ids(db_path), sorted(sent - _ids(db_path))


def _in_flight(where: Path, aid: str, seconds: float) -> None:
    """A record claimed by a dispatcher whose lease runs ``seconds`` more."""
    from datetime import UTC, datetime, timedelta

    from records import move

    from settled.clock import to_text
    from settled.model import Status

    until = to_text(datetime.now(UTC) + timedelta(seconds=seconds))
    with Ledger.open(where) as led:
        led.record(new_record(aid), actor="t")
        assert (
            led.move(
                move(
                    aid,
                    Status.PENDING,
                    Status.IN_FLIGHT,
                    lease_owner="d",
                    lease_expires_at=until,
                    delivery="IN_FLIGHT",
                )
            )
            is not None
        )


def test_live_leases_refuse_the_copy_unless_it_waits_for_them(tmp_path: Path, db_path: str) -> None:
    source = tmp_path / "source.db"
    _in_flight(source, "long", 3600)
    before = rawdb.dump(source)
    done = run_cli("migrate-ledger", str(source), db_path)
    assert done.returncode == 7, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "1 live dispatch lease" in line and "--wait-for-leases" in line
    assert rawdb.dump(source) == before and not _ids(db_path)
    # a lease that ends while it waits: the copy goes ahead once it has
    other = tmp_path / "other.db"
    _in_flight(other, "short", 2)
    waited = run_cli("migrate-ledger", str(other), db_path, "--wait-for-leases")
    assert waited.returncode == 0, waited.stderr
    assert _ids(db_path) == {"short"}


@pytest.mark.parametrize("damage", ["orphan", "params", "detail"])
def test_a_damaged_source_is_refused_by_name_and_the_target_stays_empty(
    tmp_path: Path, db_path: str, damage: str
) -> None:
    source = tmp_path / "source.db"
    with Ledger.open(source) as led:
        for n in range(3):
            led.record(new_record(f"a-{n}"), actor="t")
    conn = sqlite3.connect(source, isolation_level=None)
    try:
        if damage == "orphan":  # foreign keys are per connection, off by default
            conn.execute(
                "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt,"
                " detail) VALUES ('gone', '2026-01-01T00:00:00.000000Z', 't', 'recorded', NULL,"
                " 'PENDING', 1, '{}')"
            )
            named = "'gone'"
        elif damage == "params":
            conn.execute("UPDATE actions SET params = '{not json' WHERE action_id = 'a-1'")
            named = "actions row action_id 'a-1'"
        else:
            conn.execute("DROP TRIGGER events_no_update")  # the owner of the file can
            conn.execute("UPDATE events SET detail = '{\"cut' WHERE action_id = 'a-2'")
            named = "events row id"
    finally:
        conn.close()
    before = rawdb.dump(source)
    for target in (db_path, tmp_path / "target.db"):
        done = run_cli("migrate-ledger", str(source), str(target))
        assert done.returncode == 1, done.stderr
        line = done.stderr.strip()
        assert "\n" not in line and "Traceback" not in line and "internal error" not in line
        assert str(source) in line and named in line, line
        assert not _ids(target)
    assert rawdb.dump(source) == before  # not marked as moved either
    assert "moved" not in run_cli("--db", str(source), "queue").stderr


def test_a_moved_ledger_is_read_with_a_notice_and_refuses_every_writer(
    tmp_path: Path, db_path: str
) -> None:
    source = tmp_path / "source.db"
    from records import move

    from settled.model import EventKind, Status

    with Ledger.open(source) as led:
        led.record(new_record("a-1"), actor="t")
        led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT, lease_owner="d"))
        led.move(move("a-1", Status.IN_FLIGHT, Status.DENIED_UNRESOLVED, EventKind.LEASE_EXPIRED))
        daemon_like = Ledger.open(source)  # a writer that opened the ledger before the move
    try:
        done = run_cli("migrate-ledger", str(source), db_path)
        assert done.returncode == 0, done.stderr
        assert "marked as moved" in done.stderr and "secret" not in done.stderr
        before = rawdb.dump(source)
        shown = run_cli("--db", str(source), "show", "a-1", "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["action_id"] == "a-1"
        assert shown.stderr.count("\n") == 1 and "was moved to" in shown.stderr
        for args in (
            ("dispatch", "sim", "book", "--action-id", "n"),
            ("migrate-ledger", str(source), str(tmp_path / "again.db")),
        ):
            refused = run_cli("--db", str(source), *args)
            assert refused.returncode == 1, (args, refused.stderr)
            line = refused.stderr.strip()
            assert "moved to" in line and "\n" not in line, line
        assert not (tmp_path / "again.db").exists()
        # a command that opens it to read first is refused at its first write
        verdict = run_cli(
            "--db",
            str(source),
            "resolve",
            "a-1",
            "--applied",
            "--reason",
            "r",
            "--no-recheck",
            "--yes",
        )
        assert verdict.returncode == 1, verdict.stderr
        last = verdict.stderr.strip().splitlines()[-1]
        assert last.endswith(f"use --db {db_path}"), verdict.stderr
        with pytest.raises(LedgerError, match="was moved to"):
            daemon_like.record(new_record("late"), actor="daemon")
        assert rawdb.dump(source) == before
    finally:
        daemon_like.close()


def test_the_marker_holds_no_password(tmp_path: Path) -> None:
    from settled.storage.transfer import address

    class Where:
        location = "postgresql://app:s3cret@db.example:5432/settled?password=s3cret&sslmode=require"

    assert address(Where()) == "postgresql://app@db.example:5432/settled?sslmode=require"  # type: ignore[arg-type]


def test_the_copy_lands_whole_or_not_at_all(tmp_path: Path, db_path: str) -> None:
    source = tmp_path / "source.db"
    with Ledger.open(source) as led:
        for n in range(1200):  # more than one COPY chunk
            led.record(new_record(f"a-{n:04}"), actor="t")
    for target in (db_path, tmp_path / "target.db"):
        with Ledger.open(source) as src, Ledger.open(target) as dst:

            def broken(src: Ledger = src) -> Iterator[History]:
                from settled.storage.transfer import pages

                for n, item in enumerate(pages(src)):
                    if n == 1100:
                        raise LedgerError("the source went away")
                    yield item

            with pytest.raises(LedgerError, match="went away"):
                dst.restore(broken())
            assert dst.count() == 0 and tally(dst).events == 0


def test_a_daemon_on_the_moved_ledger_stops_with_one_line(
    tmp_path: Path, db_path: str, sim_config: Path, sim: SimServer
) -> None:
    source = tmp_path / "source.db"
    done = run_cli("--db", str(source), "dispatch", "sim", "send", "--action-id", "s-1")
    assert done.returncode == 3, done.stderr
    proc = popen_cli("--db", str(source), "daemon", "--interval", "0.2")
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the started line: it runs on the source
        assert json.loads(first)["event"] == "started", first
        moved = run_cli("migrate-ledger", str(source), db_path, "--wait-for-leases")
        assert moved.returncode == 0, moved.stderr
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    said = [json.loads(line) for line in err.splitlines() if line.strip()]
    gone = [e for e in said if e["event"] == "ledger_moved"]
    assert len(gone) == 1 and "use --db" in gone[0]["message"], said
    assert said[-1]["event"] == "stopped"
    assert _history(db_path) == _history(source)


def test_a_postgres_source_is_locked_for_the_copy_and_its_waiting_writer_refused(
    tmp_path: Path, db_path: str, sim_config: Path, sim: SimServer
) -> None:
    """The writer that comes while the tables are locked waits on the lock (seen in
    pg_stat_activity), then meets the moved ledger: exit 1, one line, nothing sent."""
    from copy import deepcopy

    import pg_schemas as pg

    from settled.storage.transfer import copy_ledger

    done = run_cli("--db", db_path, "dispatch", "sim", "book", "--action-id", "before")
    assert done.returncode == 0, done.stderr
    app = db_path.split("application_name=")[1].split("&", maxsplit=1)[0]
    writer: list[subprocess.Popen[str]] = []

    def start_writer() -> None:
        writer.append(popen_cli("--db", db_path, "dispatch", "sim", "book", "--action-id", "late"))
        admin = pg.admin()

        def waiting() -> bool:
            rows = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock'",
                (app,),
            ).fetchall()
            return int(rows[0][0]) >= 1

        _wait_for("the writer to wait on the lock", waiting, 30)

    target = tmp_path / "copy.db"
    before = deepcopy(_history(db_path))
    with Ledger.open(db_path, create=False) as src, Ledger.open(target) as dst:
        report = copy_ledger(src, dst, on_held=start_writer)
    assert report.verified and report.copied.records == 1
    _, err = writer[0].communicate(timeout=60)
    assert writer[0].returncode == 1, err
    assert err.strip().count("\n") == 0 and f"was moved to {target}" in err, err
    assert _history(db_path) == before == _history(target)
    assert sim.requests_for("late") == []


def test_a_damaged_postgres_source_is_refused_by_name(tmp_path: Path, db_path: str) -> None:
    with Ledger.open(db_path) as led:
        led.record(new_record("a-1"), actor="t")
    rawdb.execute(db_path, "UPDATE actions SET params = '{not json' WHERE action_id = 'a-1'")
    target = tmp_path / "target.db"
    done = run_cli("migrate-ledger", db_path, str(target))
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "is damaged" in line and "action_id 'a-1'" in line, line
    assert not _ids(target)
    assert rawdb.execute(db_path, "SELECT count(*) FROM ledger_moved") == [(0,)]


def test_a_write_during_the_copy_waits_and_then_meets_the_moved_ledger(
    tmp_path: Path, db_path: str
) -> None:
    from settled.errors import LedgerBusy, LedgerMoved
    from settled.storage.transfer import copy_ledger

    source = tmp_path / "source.db"
    with Ledger.open(source) as led:
        for n in range(30):
            led.record(new_record(f"a-{n:02}"), actor="t")
    refused: list[Exception] = []
    with (
        Ledger.open(source) as src,
        Ledger.open(db_path) as dst,
        Ledger.open(source, busy_timeout=0.2) as writer,
    ):

        def meanwhile(n: int) -> None:
            if n == 5:
                try:
                    writer.record(new_record("zz-late"), actor="someone else")
                except LedgerBusy as exc:  # the source is held still: it waited, in vain
                    refused.append(exc)

        report = copy_ledger(src, dst, on_record=meanwhile)
        assert report.verified and report.copied.records == 30
        with pytest.raises(LedgerMoved, match="was moved to"):
            writer.record(new_record("zz-late"), actor="someone else")
    assert len(refused) == 1 and "locked by another writer" in str(refused[0])
    assert "zz-late" not in _ids(source) | _ids(db_path)
