"""settled stats as a real process on both backends: counts by status for each
operation (or provider, status, reason), reasons grouped, ages of open records, the
checks failing now; selectors; read-only (a missing ledger is exit 1 and stays
missing; an existing one is unchanged); stored text shown as data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from invariants import dump
from ledger_rows import add
from support import run_cli

from settled import Ledger
from settled.model import Status


@pytest.fixture
def incident(db_path: Any) -> Any:
    with Ledger.open(db_path) as led:
        for i, checks in enumerate((3, 4, 7, 12)):
            add(
                led,
                f"lag-{i}",
                provider="mail",
                operation="send",
                age=600 + 60 * i,
                reason=f"verification budget spent after {checks} check(s); last: not_yet "
                f"(nothing at 2026-01-05T10:0{i}:00Z)",
            )
        for i in range(2):
            add(
                led,
                f"5xx-{i}",
                provider="mail",
                operation="send",
                age=120 + i,
                reason=f"outcome unknown (HTTP 503): retry id r-{i}9f; reconciliation will query",
            )
        add(led, "blind-1", provider="hooks", operation="notify", age=30)
        add(
            led,
            "odd",
            provider="hooks",
            operation="notify",
            age=20,
            reason="[red]boom[/] \x1b[2J\u202eevil",
        )
        add(led, "done-1", provider="mail", operation="send", status=Status.CONFIRMED, age=5)
        add(led, "flying", provider="mail", operation="send", status=Status.IN_FLIGHT, age=10)
    return db_path


def stats(*args: str) -> dict[str, Any]:
    out = run_cli("stats", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_first_screen_counts_groups_and_ages(incident: Any) -> None:
    before = dump(incident)
    data = stats()
    assert dump(incident) == before  # only reads
    assert (data["total"], data["open"], data["checks_failing_now"]) == (10, 9, 0)
    assert data["by_status"] == {
        "PENDING": 0,
        "IN_FLIGHT": 1,
        "AWAITING_VERIFICATION": 0,
        "CONFIRMED": 1,
        "FAILED": 0,
        "DENIED_UNRESOLVED": 8,
    }
    reasons = {r["reason"]: r["count"] for r in data["reasons"]}
    assert (
        reasons["verification budget spent after # check(s); last: not_yet (nothing at <time>)"]
        == 4
    )
    assert reasons["outcome unknown (HTTP 503): retry id #; reconciliation will query"] == 2
    assert data["reasons"][0]["count"] == 4 and "check(s)" in data["reasons"][0]["example"]
    groups = {g["key"]: g for g in data["groups"]}
    assert set(groups) == {"mail/send", "hooks/notify"}
    assert groups["mail/send"]["by_status"]["DENIED_UNRESOLVED"] == 6
    assert (groups["mail/send"]["total"], groups["mail/send"]["open"]) == (8, 7)
    # Nine open records aged 10 .. 780 s; nearest rank p50 is the 5th (121 s), p95 the 9th.
    ages = data["age_seconds"]
    assert ages["n"] == 9 and 100 < ages["p50"] < 200 and 770 < ages["p95"] < 850
    assert ages["oldest"] == ages["p95"]
    assert {"status": "IN_FLIGHT", "provider": "mail", "operation": "send", "count": 1} in data[
        "counts"
    ]


def test_by_and_selectors(incident: Any) -> None:
    by_provider = {g["key"]: g["total"] for g in stats("--by", "provider")["groups"]}
    assert by_provider == {"mail": 8, "hooks": 2}
    by_status = {g["key"]: g["total"] for g in stats("--by", "status")["groups"]}
    assert by_status == {"DENIED_UNRESOLVED": 8, "IN_FLIGHT": 1, "CONFIRMED": 1}
    by_reason = stats("--by", "reason", "--status", "DENIED_UNRESOLVED")["groups"]
    assert by_reason[0]["total"] == 4 and by_reason[0]["age_seconds"]["n"] == 4
    only = stats("--provider", "hooks")
    assert only["total"] == 2 and {g["key"] for g in only["groups"]} == {"hooks/notify"}
    assert stats("--since", "5m")["total"] == 6
    assert stats("--older-than", "5m")["total"] == 4
    assert stats("--status", "CONFIRMED")["open"] == 0


def test_people_see_counts_ages_and_reasons_as_data(incident: Any) -> None:
    out = run_cli("stats", env={"COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "settled stats: 10 action(s) (all statuses)" in text
    assert "open: 9 (1 IN_FLIGHT, 8 DENIED_UNRESOLVED)" in text
    assert "age of open actions: p50 2m, p95 13m, oldest 13m" in text
    assert "checks failing now: 0" in text
    assert "verification budget spent after # check(s)" in text
    assert "[red]boom[/] \\x1b[#" in text and "\\u202eevil" in text  # escaped, never markup
    assert "\x1b" not in text and "\u202e" not in text
    by_reason = run_cli("stats", "--by", "reason", env={"COLUMNS": "200"})
    assert "by reason" in by_reason.stdout and "(no reason)" in by_reason.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--by", "params"), "--by 'params': use one of provider, operation, status, reason"),
        (("--status", "DONE"), "unknown status"),
        (("--provider", "mial"), "known: hooks, mail"),
        (("--since", "soon"), "bad duration"),
    ],
)
def test_bad_input_is_one_line(incident: Any, args: tuple[str, ...], needle: str) -> None:
    out = run_cli("stats", *args)
    assert out.returncode == 1 and needle in out.stderr and out.stderr.count("\n") == 1


def test_a_missing_ledger_is_exit_1_and_stays_missing(db_path: Any) -> None:
    out = run_cli("stats")
    assert out.returncode == 1 and "no ledger at" in out.stderr and out.stderr.count("\n") == 1
    again = run_cli("stats", "--json")
    assert again.returncode == 1 and again.stdout == ""
    assert "no ledger at" in run_cli("stats").stderr  # still not created
