"""settled resolve over many actions: selectors, ids from stdin, a preview, a
question on a terminal or --yes, --dry-run; one event per record with the same
reason and evidence; the ledger compared before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from invariants import dump
from ledger_rows import add
from support import run_cli
from tmux import exit_code, run_in_terminal, tmux_available

from settled import Ledger
from settled.model import Status


@pytest.fixture
def stuck(db_path: Path) -> list[str]:
    """Six unresolved (four mail, two cal, of which three old), one awaiting a
    reconcilable check, one confirmed."""
    with Ledger.open(db_path) as led:
        for i in range(4):
            add(led, f"mail-{i}", provider="mail", operation="send", age=7200 if i < 3 else 0)
        for i in range(2):
            add(led, f"cal-{i}", provider="cal", operation="book")
        add(
            led,
            "checking",
            provider="mail",
            operation="send",
            tier="reconcilable",
            status=Status.AWAITING_VERIFICATION,
        )
        add(led, "done", provider="mail", operation="send", status=Status.CONFIRMED)
    return [f"mail-{i}" for i in range(4)] + ["cal-0", "cal-1"]


def resolved(db_path: Path) -> dict[str, tuple[str, dict[str, object]]]:
    with Ledger.open(db_path) as led:
        out = {}
        for rec in led.query():
            ev = led.events(rec.action_id)[-1]
            if ev.kind == "resolved":
                out[rec.action_id] = (str(rec.status), ev.detail)
        return out


def test_dry_run_shows_and_changes_nothing(stuck: list[str], db_path: Path) -> None:
    before = dump(db_path)
    out = run_cli(
        "resolve",
        "--provider",
        "mail",
        "--older-than",
        "1h",
        "--not-applied",
        "--reason",
        "bounced",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("action\t")
    assert sorted(line.split("\t")[0] for line in lines[1:]) == ["mail-0", "mail-1", "mail-2"]
    assert all("FAILED" in line for line in lines[1:])
    assert "nothing recorded" in out.stderr
    js = run_cli(
        "resolve", "--provider", "mail", "--not-applied", "--reason", "b", "--dry-run", "--json"
    )
    assert {r["action_id"] for r in json.loads(js.stdout)} == {f"mail-{i}" for i in range(4)}
    assert dump(db_path) == before


def test_a_selection_without_a_terminal_needs_yes(stuck: list[str], db_path: Path) -> None:
    before = dump(db_path)
    out = run_cli("resolve", "--provider", "cal", "--applied", "--reason", "seen")
    assert out.returncode == 1 and "--yes" in out.stderr.splitlines()[-1]
    assert dump(db_path) == before


def test_yes_records_one_event_per_record_with_the_same_evidence(
    stuck: list[str], db_path: Path
) -> None:
    before = dump(db_path)
    out = run_cli(
        "resolve",
        "--status",
        "DENIED_UNRESOLVED",
        "--applied",
        "--reason",
        "seen in the CRM",
        "--evidence",
        "ticket 77",
        "--by",
        "carol",
        "--yes",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert sorted(r["action_id"] for r in data) == sorted(stuck)
    assert all(r["resolved"] and r["status"] == "CONFIRMED" for r in data)
    got = resolved(db_path)
    assert sorted(got) == sorted(stuck)
    want = {
        "verdict": "applied",
        "reason": "seen in the CRM",
        "evidence": "ticket 77",
        "object_id": None,
        "by": "carol",
    }
    assert all(status == "CONFIRMED" and detail == want for status, detail in got.values())
    after = dump(db_path)
    assert len(after) > len(before)
    with Ledger.open(db_path) as led:  # the others are untouched
        assert led.get("checking").status is Status.AWAITING_VERIFICATION
        assert len(led.events("checking")) == 3 and led.get("done").status is Status.CONFIRMED


def test_ids_from_stdin(stuck: list[str], db_path: Path) -> None:
    out = run_cli(
        "resolve",
        "-",
        "--not-applied",
        "--reason",
        "never arrived",
        "--yes",
        input="mail-0\n\nmail-3\ncal-1\n",
    )
    assert out.returncode == 0, out.stderr
    assert sorted(resolved(db_path)) == ["cal-1", "mail-0", "mail-3"]
    assert "recorded 3 verdict(s)" in out.stderr


def test_unknown_and_refused_ids_are_reported_and_the_rest_recorded(
    stuck: list[str], db_path: Path
) -> None:
    out = run_cli(
        "resolve",
        "-",
        "--applied",
        "--reason",
        "x",
        "--yes",
        input="mail-0\nghost\nchecking\ndone\n",
    )
    assert out.returncode == 7, out.stderr  # the highest of 6 (ghost) and 7 (checking, done)
    assert sorted(resolved(db_path)) == ["mail-0"]
    assert "ghost: not found" in out.stderr and "checking:" in out.stderr


def test_one_named_action_exits_0_whatever_the_verdict(stuck: list[str], db_path: Path) -> None:
    out = run_cli("resolve", "mail-0", "--not-applied", "--reason", "bounced")
    assert out.returncode == 0, out.stderr
    assert resolved(db_path)["mail-0"][0] == "FAILED"


@pytest.mark.parametrize(
    "args",
    [
        ("--provider", "billing"),
        ("--provider", "mail", "--operation", "nope"),
    ],
)
def test_unknown_filters_are_errors_that_list_the_names(
    stuck: list[str], db_path: Path, args: tuple[str, ...]
) -> None:
    before = dump(db_path)
    out = run_cli("resolve", *args, "--applied", "--reason", "x", "--yes")
    assert out.returncode == 1 and "known:" in out.stderr, out.stderr
    assert ("cal, mail" in out.stderr) or ("send" in out.stderr)
    assert dump(db_path) == before


@pytest.mark.skipif(not tmux_available(), reason="tmux is not installed")
@pytest.mark.parametrize(("answer", "recorded"), [("y", True), ("n", False)])
def test_a_terminal_is_asked_first(
    stuck: list[str], db_path: Path, answer: str, recorded: bool
) -> None:
    before = dump(db_path)
    screen = run_in_terminal(
        ["resolve", "--provider", "cal", "--applied", "--reason", "seen"],
        width=100,
        keys=[answer, "Enter"],
        wait_for="Record this verdict",
    )
    assert exit_code(screen) == 0, screen
    assert "cal-0" in screen and "CONFIRMED" in screen
    if recorded:
        assert sorted(resolved(db_path)) == ["cal-0", "cal-1"]
    else:
        assert dump(db_path) == before and "nothing recorded" in screen
