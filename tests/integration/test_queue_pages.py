"""Paging through every row of the queue, in the CLI (real processes) and the API (the
real ASGI app), on both backends: each page's cursor leads to the next until every row
was seen once, in the listing's order; a cursor that is not one, or is another order's,
is one clear line (exit 1, 422) and nothing else."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ledger_rows import add
from serving import auth, in_process, token_env, write_serve_config
from support import run_cli

from settled import Ledger
from settled.clock import utcnow
from settled.model import Status
from settled.providers.sim_server import SimServer

NOW = utcnow()


def stage(location: Any, n: int = 23) -> list[str]:
    """``n`` unresolved records and a few of other statuses; the unresolved ids in
    creation order (oldest first)."""
    with Ledger.open(location) as led:
        for i in range(n):
            add(led, f"q{i:02d}", age=1000 - i * 5, now=NOW)
        for i, status in enumerate((Status.PENDING, Status.AWAITING_VERIFICATION)):
            add(led, f"o{i}", age=10, status=status, now=NOW)
    return [f"q{i:02d}" for i in range(n)]


def test_queue_after_pages_through_every_row_with_its_json_cursors(db_path: Any) -> None:
    expected = stage(db_path)
    seen: list[str] = []
    after: list[str] = []
    for _ in range(10):  # 23 rows in pages of 5: five pages
        out = run_cli("queue", "--limit", "5", "--json", *after)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        seen += [r["action_id"] for r in rows]
        if len(rows) < 5 or "--after" not in out.stderr:
            break
        assert rows[-1]["cursor"] in out.stderr  # the note names the next page
        after = ["--after", rows[-1]["cursor"]]
    assert seen == expected
    # triage order pages the same way: the held action after every verdict awaited
    tri = run_cli("queue", "--status", "all", "--sort", "triage", "--limit", "24", "--json")
    rows = json.loads(tri.stdout)
    assert [r["action_id"] for r in rows] == [*expected, "o0"]
    last = run_cli(
        "queue", "--status", "all", "--sort", "triage", "--after", rows[-1]["cursor"], "-o", "name"
    )
    assert last.stdout.split() == ["o1"] and last.returncode == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--after", "garbage"), "--after: the cursor is not one a listing gave"),
        (("--sort", "age", "--after", "CURSOR"), "--after: the cursor belongs to another order"),
    ],
)
def test_a_bad_cursor_is_one_line_and_exit_1(
    db_path: Any, args: tuple[str, ...], needle: str
) -> None:
    stage(db_path, 3)
    first = json.loads(run_cli("queue", "--json").stdout)
    args = tuple(first[0]["cursor"] if a == "CURSOR" else a for a in args)
    out = run_cli("queue", *args)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and needle in out.stderr, out.stderr


@pytest.fixture
def client(tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim, max_body=4096)
    with in_process() as (c, _lines):
        yield c


def test_the_api_pages_by_next_cursor_through_every_row(client: Any) -> None:
    expected = stage(os.environ["SETTLED_DB"])
    seen: list[str] = []
    url = "/api/v1/actions?limit=4&sort=triage"
    for _ in range(10):  # 23 rows in pages of 4: six pages
        body = client.get(url, headers=auth("reader")).json()
        assert body["total"] == 23 and body["count"] == len(body["actions"])
        seen += [a["action_id"] for a in body["actions"]]
        if body["next_cursor"] is None:
            break
        url = f"/api/v1/actions?limit=4&sort=triage&after={body['next_cursor']}"
    assert seen == expected
    everything = client.get("/api/v1/actions?limit=23", headers=auth("reader")).json()
    assert everything["next_cursor"] is None and everything["count"] == 23
    cur = client.get("/api/v1/actions?limit=2", headers=auth("reader")).json()["next_cursor"]
    for query, word in (
        (f"sort=triage&after={cur}", "after: the cursor belongs to another order"),
        ("after=x", "after: the cursor is not one a listing gave"),
        ("sort=params", "sort: use one of created_at"),
        ("reverse=maybe", "reverse: true or false"),
    ):
        r = client.get(f"/api/v1/actions?{query}", headers=auth("reader"))
        assert r.status_code == 422 and word in r.json()["detail"], r.text
