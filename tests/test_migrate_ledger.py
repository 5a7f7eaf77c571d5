"""``settled migrate-ledger FROM TO``: a ledger copied between SQLite and PostgreSQL, in
both directions, loses nothing (every record, every event with its id, time and
evidence), verifies itself, refuses a non-empty target, and lands whole or not at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rawdb
from records import new_record
from support import run_cli

from settled import Ledger
from settled.errors import LedgerError
from settled.providers.sim_server import SimServer
from settled.storage.base import History
from settled.storage.transfer import copy_ledger, tally

pytestmark = pytest.mark.postgres_only


def _history(where: Any) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    with Ledger.open(where, create=False) as led:
        return [(rec.to_json(), [e.to_json() | {"id": e.id} for e in led.events(rec.action_id)])
                for rec in led.records()]  # fmt: skip


def _populate(sqlite: Path, sim: SimServer) -> None:
    """Records in every state, written by real commands."""
    env = {"SETTLED_DB": str(sqlite)}
    sim.plan("lost", "lost_after_accept")
    sim.plan("bounced", "bounce")
    sim.plan("rejected", "reject")
    for aid, op, extra in [
        ("booked", "book", []), ("sent", "send", []), ("lost", "send", []),
        ("bounced", "send", []), ("rejected", "book", []), ("blind", "notify", []),
        ("partial", "deliver", []), ("later", "book", ["--needs-confirmation"]),
        ("wide", "book", ["--params", json.dumps({"to": "ü ✓ \u0001", "n": [1, 2.5, None]})]),
    ]:  # fmt: skip
        done = run_cli("dispatch", "sim", op, "--action-id", aid, *extra, env=env)
        assert done.returncode in (0, 3, 4, 5), done.stderr
    assert run_cli("reconcile", "--due", env=env).returncode == 0
    resolved = run_cli("resolve", "blind", "--applied", "--reason", "seen by a person",
                       "--by", "alice", env=env)  # fmt: skip
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
    shown = {str(w): run_cli("--db", str(w), "show", "lost", "--json").stdout
             for w in (source, db_path, back)}  # fmt: skip
    assert len(set(shown.values())) == 1, shown
    # the copy is a working ledger: new events follow the copied ones
    done = run_cli("--db", db_path, "dispatch", "sim", "book", "--action-id", "after")
    assert done.returncode == 0, done.stderr
    with Ledger.open(db_path) as led:
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
    assert rawdb.execute(db_path, "SELECT count(*) FROM information_schema.tables"
                                  " WHERE table_schema = current_schema()") == [(0,)]  # fmt: skip


def test_a_write_during_the_copy_is_found(tmp_path: Path, db_path: str) -> None:
    source = tmp_path / "source.db"
    with Ledger.open(source) as led:
        for n in range(30):
            led.record(new_record(f"a-{n:02}"), actor="t")
    with Ledger.open(source) as src, Ledger.open(db_path) as dst, Ledger.open(source) as writer:

        def meanwhile(n: int) -> None:
            if n == 5:
                writer.record(new_record("zz-late"), actor="someone else")

        report = copy_ledger(src, dst, on_record=meanwhile)
    assert not report.verified
    assert report.source_after.records == 31 != report.copied.records


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
