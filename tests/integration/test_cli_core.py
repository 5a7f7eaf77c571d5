"""The CLI as a real process: JSON fields, exit codes, and bad input that gets one
clear line, the documented code, and loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rawdb
from support import run_cli

from settled.model import RECORD_FIELDS
from settled.providers.sim_server import SimServer

DESIGN_FIELDS = {
    "action_id",
    "provider",
    "operation",
    "params",
    "params_hash",
    "tier",
    "reconciliation_key",
    "eligible_at",
    "requires_manual_verification",
    "attempt",
    "idempotency_key",
    "dispatch_id",
    "provider_object_id",
    "status",
    "delivery",
    "acceptance",
    "dispatched_at",
    "confirmed_at",
    "confirmed_by",
    "created_at",
    "updated_at",
}


def assert_clean_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    assert p.stdout == ""


def dump(db: str) -> list[tuple[object, ...]]:
    if rawdb.is_pg(db):
        if rawdb.execute(db, "SELECT to_regclass('actions')") == [(None,)]:
            return []
    elif not Path(db).exists():
        return []
    return [
        *rawdb.execute(db, "SELECT * FROM actions ORDER BY action_id"),
        *rawdb.execute(db, "SELECT * FROM events ORDER BY id"),
    ]


def test_dispatch_json_has_the_design_fields(sim_config: Path, sim: SimServer) -> None:
    p = run_cli(
        "dispatch", "sim", "book", "--params", '{"slot": "10:00"}', "--action-id", "j1", "--json"
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert DESIGN_FIELDS <= set(data)
    assert set(RECORD_FIELDS) <= set(data)
    assert (data["status"], data["outcome"], data["result"]) == (
        "CONFIRMED",
        "dispatched",
        "succeeded",
    )
    assert data["idempotency_key"] == "j1:1" and data["params"] == {"slot": "10:00"}
    assert data["created_at"].endswith("Z")

    show = run_cli("show", "j1", "--json")
    assert show.returncode == 0
    sdata = json.loads(show.stdout)
    assert [e["kind"] for e in sdata["events"]] == ["recorded", "claimed", "outcome"]
    assert {"id", "at", "actor", "kind", "from_status", "to_status", "attempt", "detail"} <= set(
        sdata["events"][0]
    )


@pytest.mark.parametrize(
    ("op", "fault", "code", "status"),
    [
        ("book", "ok", 0, "CONFIRMED"),
        ("send", "ok", 3, "AWAITING_VERIFICATION"),
        ("send", "timeout_after_apply", 4, "DENIED_UNRESOLVED"),
        ("book", "reject", 5, "FAILED"),
    ],
)
def test_exit_code_follows_status(
    sim_config: Path, sim: SimServer, op: str, fault: str, code: int, status: str
) -> None:
    sim.plan("x", fault)
    p = run_cli("dispatch", "sim", op, "--action-id", "x", "--json")
    assert p.returncode == code, p.stderr
    assert json.loads(p.stdout)["status"] == status
    human = run_cli("show", "x")
    assert human.returncode == 0 and status in human.stdout  # found: 0, whatever the status
    assert run_cli("show", "x", "--exit-status").returncode == code


def test_params_from_file_and_stdin(sim_config: Path, sim: SimServer, tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text('{"to": "file"}')
    assert (
        run_cli("dispatch", "sim", "book", "--params", f"@{f}", "--action-id", "f1").returncode == 0
    )
    p = run_cli(
        "dispatch",
        "sim",
        "book",
        "--params",
        "-",
        "--action-id",
        "s1",
        "--json",
        input='{"to": "stdin"}',
    )
    assert p.returncode == 0 and json.loads(p.stdout)["params"] == {"to": "stdin"}


def test_same_id_same_params_sends_nothing_other_params_conflict(
    sim_config: Path, sim: SimServer
) -> None:
    assert (
        run_cli("dispatch", "sim", "book", "--params", '{"a":1}', "--action-id", "d1").returncode
        == 0
    )
    again = run_cli("dispatch", "sim", "book", "--params", '{"a":1}', "--action-id", "d1", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["outcome"] == "already_completed"
    db = os.environ["SETTLED_DB"]
    before = dump(db)
    p = run_cli("dispatch", "sim", "book", "--params", '{"a":2}', "--action-id", "d1")
    assert_clean_error(p, 7, "different params")
    assert dump(db) == before
    assert len(sim.requests_for("d1")) == 1


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["dispatch", "sim", "book", "--params", "{not json"], 1, "not valid JSON"),
        (["dispatch", "sim", "book", "--params", "[1, 2]"], 1, "must be a JSON object"),
        (["dispatch", "sim", "book", "--params", "@/nonexistent/p.json"], 1, "file not found"),
        (["dispatch", "nope", "book"], 1, "unknown provider 'nope'"),
        (["dispatch", "sim", "nope"], 1, "no operation 'nope'"),
        (["dispatch", "sim", "book", "--action-id", " spaced "], 1, "action id"),
        (["show", "missing"], 6, "no action"),
        (["queue", "--status", "BOGUS"], 1, "unknown status"),
        (["queue", "--older-than", "ten minutes"], 1, "bad duration"),
    ],
)
def test_bad_input_is_one_line_and_loses_nothing(
    sim_config: Path, sim: SimServer, args: list[str], code: int, needle: str
) -> None:
    assert run_cli("dispatch", "sim", "book", "--action-id", "keep").returncode == 0
    db = os.environ["SETTLED_DB"]
    before = dump(db)
    p = run_cli(*args)
    assert_clean_error(p, code, needle)
    assert dump(db) == before
    assert [r["action_id"] for r in sim.truth()["requests"]] == ["keep"]


def test_confirm_missing_is_not_found_json(sim_config: Path) -> None:
    p = run_cli("confirm", "ghost", "--json")
    assert p.returncode == 6
    assert json.loads(p.stdout)["outcome"] == "not_found"


def test_usage_error_is_exit_2(sim_config: Path) -> None:
    p = run_cli("dispatch")
    assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[providers.x]\ntype = "nope"\n', "unknown provider type 'nope'"),
        ("[providers.x\n", "invalid TOML"),
        ("[ledgr]\npath='a'\n", "unknown section"),
        ('[dispatch]\nlease_grace = "long"\n', "dispatch.lease_grace: must be a number"),
        ('[providers.x]\nbase_url = "http://127.0.0.1:1"\n', "providers.x.type: missing"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, toml: str, needle: str) -> None:
    cfg = tmp_path / "settled.toml"
    cfg.write_text(toml)
    p = run_cli("dispatch", "x", "op")
    assert_clean_error(p, 1, needle, "settled.toml")
    assert dump(os.environ["SETTLED_DB"]) == []


@pytest.mark.sqlite_only
def test_corrupt_ledger_is_left_byte_for_byte(tmp_path: Path, sim_config: Path) -> None:
    db = Path(os.environ["SETTLED_DB"])
    db.write_bytes(b"SQLite format 3\x00" + os.urandom(8000))
    before = db.read_bytes()
    for args in (["show", "a"], ["queue"], ["dispatch", "sim", "book"]):
        p = run_cli(*args)
        assert_clean_error(p, 1, "ledger")
    assert db.read_bytes() == before


@pytest.mark.sqlite_only
def test_not_a_ledger_is_refused(tmp_path: Path, sim_config: Path, sim: SimServer) -> None:
    db = Path(os.environ["SETTLED_DB"])
    db.write_text("important notes\n")
    p = run_cli("dispatch", "sim", "book")
    assert_clean_error(p, 1, "not a settled ledger")
    assert db.read_text() == "important notes\n"
    assert sim.truth()["requests"] == []


def test_locked_ledger_gives_a_clear_error_and_sends_nothing(
    sim_config: Path, sim: SimServer
) -> None:
    assert run_cli("dispatch", "sim", "book", "--action-id", "l0").returncode == 0
    db = os.environ["SETTLED_DB"]
    lock = (
        "import psycopg,sys,time; c=psycopg.connect(sys.argv[1]);"  # a writer mid-transaction
        "c.execute('LOCK TABLE actions IN EXCLUSIVE MODE');"
        if rawdb.is_pg(db)
        else "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None);"
        "c.execute('BEGIN IMMEDIATE');"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", lock + "print('locked', flush=True); time.sleep(30)", str(db)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = dump(db)
        p = run_cli(
            "dispatch", "sim", "book", "--action-id", "l1", env={"SETTLED_BUSY_TIMEOUT": "0.5"}
        )
        assert_clean_error(p, 1, "locked by another writer")
        assert dump(db) == before
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert [r["action_id"] for r in sim.truth()["requests"]] == ["l0"]


def test_queue_lists_unresolved_and_fail_if_any(sim_config: Path, sim: SimServer) -> None:
    p = run_cli("queue", "--fail-if-any")  # no ledger yet: a monitor must not pass silently
    assert p.returncode == 1 and "no ledger at" in p.stderr
    assert not Path(os.environ["SETTLED_DB"]).exists()
    run_cli("dispatch", "sim", "book", "--action-id", "q0")
    p = run_cli("queue", "--fail-if-any")
    assert p.returncode == 0 and p.stdout.startswith("action\t") and len(p.stdout.splitlines()) == 1
    sim.plan("q1", "timeout_after_apply")
    run_cli("dispatch", "sim", "send", "--action-id", "q1")
    run_cli("dispatch", "sim", "notify", "--action-id", "q2")
    p = run_cli("queue", "--json")
    rows = json.loads(p.stdout)
    assert [r["action_id"] for r in rows] == ["q1", "q2"]
    assert rows[0]["next"].startswith("auto-check at") and rows[1]["next"].startswith(
        "needs a person"
    )
    assert run_cli("queue", "--fail-if-any").returncode == 4
    human = run_cli("queue")
    assert "q1" in human.stdout and "needs a person" in human.stdout


def test_providers_lists_declarations(sim_config: Path) -> None:
    p = run_cli("providers", "--json")
    rows = {r["operation"]: r for r in json.loads(p.stdout)}
    assert rows["book"]["tier"] == "full" and rows["notify"]["tier"] == "blind"
    assert {"tier", "consistency_window", "attempts", "timeout", "dedupes_keys", "verifies"} <= set(
        rows["send"]
    )


def test_every_command_has_help() -> None:
    for cmd in ("dispatch", "confirm", "show", "queue", "providers", "demo"):
        p = run_cli(cmd, "--help")
        assert p.returncode == 0 and "Usage" in p.stdout, cmd


def test_demo_runs_and_tells_the_truth() -> None:
    p = run_cli("demo", timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for needle in ("CONFIRMED", "FAILED", "DENIED_UNRESOLVED", "needs a person"):
        assert needle in out
