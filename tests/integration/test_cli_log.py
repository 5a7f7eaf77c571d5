"""settled log: who did what, from the ledger's events: verdicts, refused verdicts,
confirmations, retries and checks, by person, token, session, command and time, as a
table, TSV, JSON or NDJSON, paged by a cursor. Real `settled` processes on both
backends; the API and console surfaces are staged through the core with their own
``via``, as the service writes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from support import PATIENT, run_cli, sim_conf, write_config

from settled import Ledger, policy
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer
from settled.resolve import resolve


@pytest.fixture
def day(tmp_path: Path, sim: SimServer, db_path: Any) -> Iterator[None]:
    """A day's work: each person through a real command, a refused verdict, and two
    verdicts through the API's token and a console session."""
    conf = sim_conf(sim, timeout=PATIENT, verify_interval=0.1, verify_deadline=30.0)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    reg = Registry({"sim": conf}, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        for aid in ("blind", "by-api", "by-ui"):
            d.submit("sim", "notify", {"to": aid}, action_id=aid)
        sim.plan("rej", "reject")
        d.submit("sim", "send", {"to": "r"}, action_id="rej")
        d.submit("sim", "send", {"to": "h"}, action_id="held", needs_confirmation=True)
        d.submit("sim", "send", {"to": "w"}, action_id="wait")
        sim.plan("lost", "lost_after_accept")
        d.submit("sim", "send", {"to": "l"}, action_id="lost")
        now = led.clock().now()
        led.move(policy.unresolved(led.get("lost"), now, "given up", {}, owner=None, actor="t"))
        resolve(led, "by-api", applied=True, reason="api said", by="ann", now=now, via="api:ops")
        resolve(
            led, "by-ui", applied=True, reason="ui said", by="uma", now=now, via="ui:token:ops:S1"
        )
    reg.close()
    steps = [
        (["resolve", "blind", "--applied", "--reason", "customer replied", "--by", "alice"], 0),
        (["retry", "rej", "--by", "bob"], 3),
        (["confirm", "held", "--by", "carol"], 3),
        (["reconcile", "wait", "--by", "dave"], 0),
    ]
    for args, code in steps:
        res = run_cli(*args)
        assert res.returncode in (0, code), (args, res.stderr)
    unreachable = write_config(
        tmp_path / "down.toml", {"sim": sim_conf(sim, base_url="http://127.0.0.1:9")}
    )
    res = run_cli(
        "--config",
        str(unreachable),
        "resolve",
        "lost",
        "--not-applied",
        "--reason",
        "bounce 7",
        "--by",
        "erin",
    )
    assert res.returncode == 7, res.stderr
    yield


def log(*args: str) -> list[dict[str, Any]]:
    res = run_cli("log", *args, "-o", "json")
    assert res.returncode == 0, res.stderr
    rows: list[dict[str, Any]] = json.loads(res.stdout)
    return rows


@pytest.mark.usefixtures("day")
def test_the_log_names_every_person_and_what_they_did() -> None:
    rows = log()
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    people = {(r["person"], r["kind"], r["action_id"]) for r in rows}
    assert {
        ("alice", "resolved", "blind"),
        ("bob", "retry", "rej"),
        ("carol", "claimed", "held"),
        ("dave", "reconciled", "wait"),
        ("erin", "note", "lost"),
        ("ann", "resolved", "by-api"),
        ("uma", "resolved", "by-ui"),
    } <= people
    assert all(r["person"] or r["via"] for r in rows)
    machines = {r["actor"] for r in log("--all")} - {r["actor"] for r in rows}
    assert "dispatcher" in machines  # the machines only with --all
    refused = next(r for r in rows if r["kind"] == "note")
    assert refused["detail"]["reason"] == "bounce 7" and "refused not_applied" in refused["said"]


@pytest.mark.usefixtures("day")
def test_filters_by_person_token_session_command_kind_and_action() -> None:
    assert {(r["person"], r["kind"]) for r in log("--by", "alice")} == {("alice", "resolved")}
    assert {r["action_id"] for r in log("--by", "bob")} == {"rej"}  # its retry and its claim
    assert [(r["person"], r["via"]) for r in log("--token", "ops")] == [("ann", "api:ops")]
    assert [(r["person"], r["via"]) for r in log("--session", "S1")] == [("uma", "ui:token:ops:S1")]
    assert {r["kind"] for r in log("--command", "retry")} == {"retry"}
    assert {r["person"] for r in log("--command", "resolve")} == {"alice", "erin", "ann", "uma"}
    assert [r["person"] for r in log("--kind", "note")] == ["erin"]
    assert {r["action_id"] for r in log("--action", "held")} == {"held"}
    assert log("--by", "al") == [] and log("--by", "%") == []  # whole names, no patterns


@pytest.mark.usefixtures("day")
def test_time_windows_and_the_cursor_page_through_every_event() -> None:
    everything = log()
    assert log("--since", "1h") == everything
    assert log("--since", "2999-01-01T00:00:00Z") == []
    assert log("--until", "2000-01-01") == []
    first = everything[-1]["at"]
    assert log("--until", first) == [r for r in everything if r["at"] < first]
    seen: list[int] = []
    before: list[str] = []
    for _ in range(len(everything) + 1):  # bounded: one page per event at most
        res = run_cli("log", "--limit", "2", "-o", "json", *before)
        assert res.returncode == 0, res.stderr
        page = json.loads(res.stdout)
        seen += [r["id"] for r in page]
        if "--before" not in res.stderr:
            break
        before = ["--before", str(page[-1]["id"])]
    assert seen == [r["id"] for r in everything]


@pytest.mark.usefixtures("day")
def test_ndjson_tsv_and_table_carry_the_same_events() -> None:
    rows = log()
    nd = run_cli("log", "-o", "ndjson")
    assert [json.loads(line) for line in nd.stdout.splitlines()] == rows
    assert run_cli("log", "--ndjson").stdout == nd.stdout
    assert run_cli("log", "-o", "NDJSON").stdout == nd.stdout  # any case, as every -o
    assert run_cli("log", "--ndjson", "-o", "ndjson").stdout == nd.stdout
    tsv = run_cli("log").stdout.splitlines()  # a pipe: TSV with its header
    assert tsv[0].split("\t")[:4] == ["at", "person", "via", "kind"]
    assert len(tsv) == len(rows) + 1
    table = run_cli("log", "-o", "table").stdout
    assert "alice" in table and "customer replied" in table


@pytest.mark.usefixtures("day")
@pytest.mark.parametrize(
    "args",
    [
        ["--since", "yesterday"],
        ["--until", "12:00 sharp"],
        ["--kind", "verdict"],
        ["--command", "dispatch"],
        ["-o", "yaml"],
        ["--json", "--ndjson"],
    ],
)
def test_bad_input_is_one_line_and_reads_nothing(db_path: Any, args: list[str]) -> None:
    before = dump(db_path)
    res = run_cli("log", *args)
    assert res.returncode == 1 and res.stdout == "", res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert dump(db_path) == before


@pytest.mark.usefixtures("day")
@pytest.mark.parametrize("fmt", ["yaml", "name", "nd"])
def test_a_bad_format_names_the_logs_own_formats(fmt: str) -> None:
    """The log's formats are not the listings' (no ``name``; ``ndjson``)."""
    res = run_cli("log", "-o", fmt)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().endswith("use one of table, wide, tsv, json, ndjson"), res.stderr


def test_o_completes_the_logs_formats() -> None:
    from settled.cli.log_cmd import complete_format

    assert complete_format("") == ["table", "wide", "tsv", "json", "ndjson"]
    assert complete_format("nd") == ["ndjson"]


def test_a_missing_ledger_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    res = run_cli("--db", str(missing), "log")
    assert res.returncode == 1 and str(missing) in res.stderr
    assert not missing.exists()
