"""settled retry over many actions: selectors, ids from stdin (a TSV header skipped),
a preview, a question on a terminal or --yes, --dry-run; each record checked first
(rule 14) and sent through the bulk path (claims committed in groups before their
requests leave); the exit code is the highest among the lines; and the `next` hints
that name the command to run."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import check, dump
from support import run_cli, sim_conf, write_config
from tmux import exit_code, run_in_terminal, tmux_available

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

FAILED = ["f-0", "f-1", "f-2", "f 3"]  # rejected sends (one id with a space)


@pytest.fixture
def failed(tmp_path: Path, sim: SimServer, db_path: Any) -> Iterator[list[str]]:
    """Four FAILED sends (the provider rejected them), one FAILED booking, one
    unresolved blind notify and one CONFIRMED booking."""
    conf = sim_conf(sim, verify_interval=0.1, verify_deadline=0.3)
    write_config(tmp_path / "settled.toml", {"sim": conf})
    reg = Registry({"sim": conf}, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        for aid in FAILED:
            sim.plan(aid, "reject")
            assert d.submit("sim", "send", {"to": aid}, action_id=aid).record.status is (  # type: ignore[union-attr]
                Status.FAILED
            )
        sim.plan("book-x", "reject")
        d.submit("sim", "book", {"slot": "9"}, action_id="book-x")
        d.submit("sim", "notify", {"to": "n"}, action_id="blind")
        d.submit("sim", "book", {"slot": "10"}, action_id="done")
    reg.close()
    yield FAILED
    with Ledger.open(db_path) as led:
        check(led, sim, final=False)


def keys(sim: SimServer, aid: str) -> list[str]:
    return [r["idempotency_key"] for r in sim.requests_for(aid)]


def test_dry_run_shows_and_changes_nothing(failed: list[str], db_path: Any, sim: SimServer) -> None:
    before = dump(db_path)
    out = run_cli("retry", "--operation", "send", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("action\t")
    assert sorted(line.split("\t")[0] for line in lines[1:]) == sorted(failed)
    assert all("attempt 2 unless a check sees it" in line for line in lines[1:])
    assert "nothing sent (4 would be retried)" in out.stderr
    js = run_cli("retry", "--provider", "sim", "--dry-run", "--json")
    rows = json.loads(js.stdout)
    assert {r["action_id"] for r in rows} == {*failed, "book-x"}
    assert all(r["retried"] is False and r["skipped"] is None for r in rows)
    assert dump(db_path) == before and all(keys(sim, a) == [f"{a}:1"] for a in failed)


def test_a_selection_without_a_terminal_needs_yes(failed: list[str], db_path: Any) -> None:
    before = dump(db_path)
    out = run_cli("retry", "--provider", "sim")
    assert out.returncode == 1 and "--yes" in out.stderr.splitlines()[-1]
    assert "refusing to retry 5 action(s)" in out.stderr
    assert dump(db_path) == before


def test_yes_retries_each_through_one_bulk_dispatch(
    failed: list[str], db_path: Any, sim: SimServer
) -> None:
    out = run_cli(
        "retry", "--provider", "sim", "--yes", "--concurrency", "4", "--by", "dana", "--json"
    )
    assert out.returncode == 3, out.stderr  # the sends are accepted, not yet verified
    rows = {r["action_id"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {*failed, "book-x"}
    for aid in failed:
        assert rows[aid]["retried"] is True and rows[aid]["attempt"] == 2
        assert rows[aid]["status"] == "AWAITING_VERIFICATION" and rows[aid]["skipped"] is None
        assert keys(sim, aid) == [f"{aid}:1", f"{aid}:2"]
    assert rows["book-x"]["status"] == "CONFIRMED" and keys(sim, "book-x") == [
        "book-x:1",
        "book-x:2",
    ]
    with Ledger.open(db_path) as led:
        for aid in failed:
            opened = next(e for e in led.events(aid) if e.kind == "retry")
            assert opened.actor == "operator:dana" and opened.detail["recheck"].startswith(
                "not_yet"
            )
    human = run_cli("retry", "--provider", "sim", "--yes")
    assert human.returncode == 0  # nothing FAILED any more: nothing to do
    assert "retried 0 action(s)" in human.stderr


def test_ids_from_stdin_skip_the_queues_tsv_header(
    failed: list[str], db_path: Any, sim: SimServer
) -> None:
    listing = run_cli("queue", "--status", "FAILED", "--operation", "send", "-o", "tsv")
    assert listing.stdout.startswith("action\t")
    out = run_cli("retry", "-", "--yes", input=listing.stdout)
    assert out.returncode == 3, out.stderr
    assert "not found" not in out.stderr  # the header line is never read as an id
    assert all(keys(sim, a) == [f"{a}:1", f"{a}:2"] for a in failed)
    header = "action_id\tstatus\n" + "\n".join(f"{a}\tFAILED" for a in ["book-x"]) + "\n"
    again = run_cli("retry", "-", "--yes", "--json", input=header)
    assert again.returncode == 0, again.stderr
    assert [r["action_id"] for r in json.loads(again.stdout)] == ["book-x"]


def test_records_that_cannot_be_retried_are_refused_each_with_why(
    failed: list[str], db_path: Any, sim: SimServer
) -> None:
    out = run_cli("retry", "-", "--yes", input="f-0\nblind\ndone\nghost\n")
    assert out.returncode == 7, out.stderr  # the highest of 3 (f-0), 6 (ghost), 7 (the others)
    assert keys(sim, "f-0") == ["f-0:1", "f-0:2"]
    assert "blind: skipped: DENIED_UNRESOLVED" in out.stderr and "settled reconcile" in out.stderr
    assert "done: skipped: CONFIRMED; retry is allowed only from FAILED" in out.stderr
    assert "ghost: skipped: not found" in out.stderr
    assert keys(sim, "blind") == ["blind:1"] and keys(sim, "done") == ["done:1"]
    only_missing = run_cli("retry", "-", "--yes", input="ghost\n")
    assert only_missing.returncode == 6
    sel = run_cli("retry", "--status", "DENIED_UNRESOLVED", "--yes", "--json")
    assert sel.returncode == 7
    (row,) = json.loads(sel.stdout)
    assert row["action_id"] == "blind" and row["retried"] is False and "DENIED" in row["skipped"]


def test_a_group_is_claimed_before_any_of_its_requests_leaves(
    failed: list[str], db_path: Any, sim: SimServer
) -> None:
    """SIGKILL right after the group's claims commit: every retry is IN_FLIGHT at
    attempt 2 and the provider saw none of them; a lease lapse then reconciles them."""
    out = run_cli("retry", "--operation", "send", "--yes", crash_at="after_group_claim")
    assert out.returncode == -9, out.stderr
    with Ledger.open(db_path) as led:
        for aid in failed:
            rec = led.get(aid)
            assert (rec.status, rec.attempt) == (Status.IN_FLIGHT, 2), rec
    assert all(keys(sim, a) == [f"{a}:1"] for a in failed)


def test_one_id_keeps_the_single_retry_and_its_exit_code(failed: list[str], sim: SimServer) -> None:
    out = run_cli("retry", "book-x", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outcome"] == "dispatched"
    dry = run_cli("retry", "f-1", "--dry-run")
    assert dry.returncode == 0 and keys(sim, "f-1") == ["f-1:1"]
    assert run_cli("retry").returncode == 2  # neither ids nor selectors


@pytest.mark.skipif(not tmux_available(), reason="tmux is not installed")
@pytest.mark.parametrize(("answer", "sent"), [("y", True), ("n", False)])
def test_a_terminal_is_asked_first(
    failed: list[str], db_path: Any, sim: SimServer, answer: str, sent: bool
) -> None:
    before = dump(db_path)
    screen = run_in_terminal(
        ["retry", "--operation", "book"], width=100, keys=[answer, "Enter"], wait_for="Retry 1"
    )
    assert exit_code(screen) == 0, screen
    assert "book-x" in screen and "attempt 2" in screen
    if sent:
        assert keys(sim, "book-x") == ["book-x:1", "book-x:2"]
    else:
        assert dump(db_path) == before and "nothing sent" in screen


# -- next: the command to run --------------------------------------------------------------


def test_next_names_the_command_with_the_id_shell_quoted(
    failed: list[str], tmp_path: Path, sim: SimServer
) -> None:
    sim.plan("given up", "lost_after_accept")
    dispatched = run_cli(
        "dispatch", "sim", "send", "--action-id", "given up", "--wait", "--wait-timeout", "30"
    )
    assert dispatched.returncode == 4, dispatched.stderr
    rows = {
        r["action_id"]: r["next"]
        for r in json.loads(run_cli("queue", "--status", "all", "--json").stdout)
    }
    assert rows["given up"] == "settled reconcile 'given up'"  # a query can still settle it
    assert (
        rows["blind"] == "needs a person: settled resolve blind --applied|--not-applied --reason …"
    )
    assert rows["f 3"] == "settled retry 'f 3'" and rows["done"] == "settled"
    assert shlex.split(rows["f 3"]) == ["settled", "retry", "f 3"]
    shown = run_cli("show", "given up").stdout
    assert "settled reconcile 'given up'" in shown and "at least 3 checks" in shown
