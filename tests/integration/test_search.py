"""One search for what a person knows of an action: part of its id, any value of its
params (an order number, a recipient) or words of its reason, in any case, through the
ledger's search index, on both backends: as real `settled queue --search` processes,
through the API's ``?q=``, after any later write of the record (a redaction of params
by a plain UPDATE), and on a ledger made before the index existed."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import rawdb
from ledger_rows import add
from support import run_cli
from test_migrate_checks import UNDO_PG, UNDO_SQLITE

from settled import Ledger
from settled.model import Status
from settled.storage import postgres_schema, sqlite_schema
from settled.storage.ledger import Selection


def found(*args: str) -> list[str]:
    out = run_cli("queue", *args, "-o", "name")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.fixture
def day(db_path: Any) -> Any:
    """A support person's day: orders mailed to customers, in every state."""
    with Ledger.open(db_path) as led:
        add(
            led,
            "mail-7f3a9c",
            provider="mail",
            operation="send",
            params={"to": "Ana.Silva@example.com", "order": 10927, "lines": [{"sku": "TEA-42"}]},
            reason="outcome unknown (HTTP 503): the relay was busy",
            age=3600,
        )
        add(
            led,
            "mail-0b11e2",
            provider="mail",
            operation="send",
            params={"to": "bob@example.org", "order": 10928, "note": "50% off_today"},
            status=Status.PENDING,
            age=1800,
        )
        add(
            led,
            "sms-55aa01",
            provider="sms",
            operation="send",
            params={"to": "+4915112345678", "text": 'say "hi" to order 10927'},
            reason="blind operation: a person must verify it",
            age=60,
        )
    return db_path


def test_a_search_finds_an_id_part_a_params_value_or_a_reason_word_in_any_case(day: Any) -> None:
    assert found("--search", "mail-7f") == ["mail-7f3a9c"]  # the id's start
    assert found("--search", "0b11") == ["mail-0b11e2"]  # and anywhere in it
    assert found("--search", "10928") == ["mail-0b11e2"]  # an order number (a JSON number)
    assert found("--search", "ana.silva@EXAMPLE.COM") == ["mail-7f3a9c"]  # a recipient
    assert found("--search", "example") == ["mail-7f3a9c", "mail-0b11e2"]
    assert found("--search", "tea-42") == ["mail-7f3a9c"]  # nested in a list
    assert found("--search", "http 503") == ["mail-7f3a9c"]  # the reason's words
    assert found("--search", "4915112") == ["sms-55aa01"]
    # every word must be found (in any field), oldest first
    assert found("--search", "10927") == ["mail-7f3a9c", "sms-55aa01"]
    assert found("--search", "10927 blind") == ["sms-55aa01"]
    assert found("--search", "10927 nowhere") == []


def test_a_search_reads_no_character_as_syntax_and_no_key_as_a_value(day: Any) -> None:
    assert found("--search", "50%") == ["mail-0b11e2"]
    assert found("--search", "off_today") == ["mail-0b11e2"]
    assert found("--search", "o%y") == [] and found("--search", "o_f") == []
    assert found("--search", '"hi"') == ["sms-55aa01"]  # quotes are text, not FTS5 phrases
    assert found("--search", "say AND order") == []  # AND is a word to find, not FTS5's
    assert found("--search", "NEAR(say") == [] and found("--search", "say*") == []
    assert found("--search", "say") == ["sms-55aa01"]
    assert found("--search", "sku") == []  # a key of params is not a value
    assert found("--search", "x'); DROP TABLE actions;", "--status", "all") == []


def test_a_search_looks_at_every_status_unless_one_is_asked(day: Any) -> None:
    assert found("--search", "10928") == ["mail-0b11e2"]  # PENDING: not in the default queue
    assert found("--search", "10928", "--status", "DENIED_UNRESOLVED") == []
    assert found("--search", "example", "--provider", "mail", "--status", "PENDING") == [
        "mail-0b11e2"
    ]
    out = run_cli("queue", "--search", "10927", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["action_id"] for r in rows] == ["mail-7f3a9c", "sms-55aa01"]
    assert rows[0]["params"]["order"] == 10927


@pytest.mark.parametrize(
    ("words", "says"),
    [
        ("ab", "each word of a search needs at least 3 characters ('ab' has 2)"),
        ("10927 to", "each word of a search needs at least 3 characters ('to' has 2)"),
        ("   ", "a search needs some text to look for"),
        ("x" * 1001, "a search is longer than 1000 characters"),
        (" ".join(f"w{n:02}" for n in range(17)), "a search takes at most 16 words"),
    ],
)
def test_a_search_that_cannot_be_answered_is_one_line_and_exit_1(
    day: Any, words: str, says: str
) -> None:
    before = rawdb.dump(day)
    out = run_cli("queue", "--search", words)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"settled: error: {says}"]
    assert rawdb.dump(day) == before


def test_the_index_follows_any_later_write_of_params_and_reason(day: Any) -> None:
    """A redaction rewrites params with a plain UPDATE, outside settled's own write path:
    the index forgets the old values and finds the new ones, on both backends."""
    rawdb.execute(
        day,
        "UPDATE actions SET params = ?, reason = ? WHERE action_id = ?",
        ('{"order": "[redacted]", "to": "[redacted]"}', "erased on request", "mail-7f3a9c"),
    )
    assert found("--search", "ana.silva") == []
    assert found("--search", "10927") == ["sms-55aa01"]
    assert found("--search", "http 503") == []
    assert found("--search", "redacted") == ["mail-7f3a9c"]
    assert found("--search", "erased") == ["mail-7f3a9c"]
    if not rawdb.is_pg(day):  # FTS5 checks its index against the records it reads
        rawdb.execute(day, "INSERT INTO actions_search(actions_search) VALUES ('integrity-check')")
    with Ledger.open(day, create=False) as led:
        assert led.integrity_check() == "ok"


def test_params_that_are_not_json_leave_the_index_but_not_the_write(db_path: Any) -> None:
    """A damaged row (``settled verify`` names it) is still written, and still found by
    its id and reason: the index never turns bad data into a refused write."""
    with Ledger.open(db_path) as led:
        add(led, "odd-1", params={"to": "carol@example.net"}, reason="plain words here")
    rawdb.execute(db_path, "UPDATE actions SET params = ? WHERE action_id = ?", ("{not", "odd-1"))
    with Ledger.open(db_path, create=False) as led:
        assert led.count(Selection(search="carol")) == 0
        assert led.count(Selection(search="plain words")) == 1
        assert led.count(Selection(search="odd-1")) == 1


def test_a_ledger_made_before_the_index_is_searchable_once_migrated(day: Any) -> None:
    pg = rawdb.is_pg(day)
    steps = (postgres_schema if pg else sqlite_schema).MIGRATIONS
    number = next(n for n, (step, _) in enumerate(steps, 1) if step.endswith("_search"))
    name = steps[number - 1][0]
    undo = UNDO_PG if pg else UNDO_SQLITE  # the search step and those after it, undone
    last = (
        "DROP FUNCTION settled_search_text(text, text, text)"
        if pg
        else "DROP VIEW actions_search_text"
    )
    for statement in undo[: undo.index(last) + 1]:
        rawdb.execute(day, statement)
    for later, _ in steps[number - 1 :]:
        rawdb.execute(day, "DELETE FROM _migrations WHERE name = ?", (later,))
    if pg:
        rawdb.execute(day, "UPDATE settled_ledger SET version = ?", (number - 1,))
    else:
        rawdb.execute(day, f"PRAGMA user_version = {number - 1}")
    out = run_cli("queue", "--search", "10927")
    assert out.returncode != 0 and "settled migrate" in out.stderr
    done = run_cli("migrate")
    assert done.returncode == 0, done.stderr
    assert name in done.stderr + done.stdout
    assert found("--search", "10927") == ["mail-7f3a9c", "sms-55aa01"]
    assert found("--search", "bob@example") == ["mail-0b11e2"]
    with Ledger.open(day) as led:  # and later records are kept in it by the write path
        add(led, "late-1", params={"order": 20001})
        assert [r.action_id for r in led.records(Selection(search="20001"))] == ["late-1"]


def test_the_api_searches_with_q(day: Any, tmp_path: Any, sim: Any, monkeypatch: Any) -> None:
    from serving import auth, in_process, token_env, write_serve_config

    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim)
    assert os.environ["SETTLED_DB"]
    with in_process() as (client, _lines):
        r = client.get("/api/v1/actions", params={"q": "10927"}, headers=auth("reader"))
        assert r.status_code == 200, r.text
        body = r.json()
        assert [a["action_id"] for a in body["actions"]] == ["mail-7f3a9c", "sms-55aa01"]
        assert body["total"] == 2
        r = client.get(
            "/api/v1/actions",
            params={"q": "example", "status": "PENDING"},
            headers=auth("reader"),
        )
        assert [a["action_id"] for a in r.json()["actions"]] == ["mail-0b11e2"]
        r = client.get("/api/v1/actions", params={"q": "ab"}, headers=auth("reader"))
        assert r.status_code == 422
        assert r.json()["detail"] == (
            "q: each word of a search needs at least 3 characters ('ab' has 2)"
        )


@pytest.mark.postgres_only
def test_a_search_in_a_parallel_plan_reads_the_index_text_without_failing(day: Any) -> None:
    """The index's expression may run in a parallel query the planner chooses on a large
    ledger: it must not be one PostgreSQL refuses there (a subtransaction is)."""
    import psycopg

    with psycopg.connect(str(day), autocommit=True) as conn:
        for setting in (
            "force_parallel_mode = on",
            "parallel_setup_cost = 0",
            "parallel_tuple_cost = 0",
            "min_parallel_table_scan_size = 0",
            "enable_bitmapscan = off",
        ):
            conn.execute(f"SET {setting}")
        rows = conn.execute(
            "SELECT action_id FROM actions"
            " WHERE settled_search_text(action_id, params, reason) ILIKE %s ORDER BY action_id",
            ("%10927%",),
        ).fetchall()
    assert [r[0] for r in rows] == ["mail-7f3a9c", "sms-55aa01"]
