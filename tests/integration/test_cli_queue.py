"""settled queue and settled show as real processes: filters, what settles each row
next, monitors' exit codes, and the event timeline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer


@pytest.fixture
def filled(ledger: Ledger, sim: SimServer, tmp_path: Path) -> Iterator[Ledger]:
    """auto: unresolved, queryable (5xx after applying); person: blind; wait: awaiting
    its first check; other: the same as auto on a second provider."""
    conf = sim_conf(sim, verify_deadline=120.0, consistency_window=600.0)
    write_config(tmp_path / "settled.toml", {"sim": dict(conf), "other": dict(conf)})
    reg = Registry({"sim": conf, "other": conf}, source="test")
    d = Dispatcher(ledger, reg)
    for aid, provider, op, fault in [
        ("auto", "sim", "send", "5xx_after"),
        ("person", "sim", "notify", "ok"),
        ("wait", "sim", "send", "ok"),
        ("other", "other", "send", "5xx_after"),
    ]:
        sim.plan(aid, fault)
        d.submit(provider, op, {"to": "x"}, action_id=aid)
    yield ledger
    reg.close()


def rows(*args: str) -> list[dict[str, Any]]:
    out = run_cli("queue", *args, "--json")
    assert out.returncode in (0, 4), out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_default_queue_is_unresolved_oldest_first_and_says_what_settles_it(filled: Ledger) -> None:
    got = rows()
    assert [r["action_id"] for r in got] == ["auto", "person", "other"]
    nxt = {r["action_id"]: r["next"] for r in got}
    assert nxt["auto"].startswith("auto-check at ")
    assert (
        nxt["person"] == "needs a person: settled resolve person --applied|--not-applied --reason …"
    )
    human = run_cli("queue", env={"COLUMNS": "200"})
    assert human.returncode == 0
    assert "auto-check at" in human.stdout and "needs a person" in human.stdout


def test_status_provider_and_age_filters(filled: Ledger) -> None:
    assert [r["action_id"] for r in rows("--status", "AWAITING_VERIFICATION")] == ["wait"]
    assert rows("--status", "AWAITING_VERIFICATION")[0]["next"].startswith("auto-check at")
    assert len(rows("--status", "all")) == 4
    assert len(rows("--status", "awaiting_verification,denied_unresolved")) == 4
    assert [r["action_id"] for r in rows("--provider", "other")] == ["other"]
    assert rows("--older-than", "1h") == []
    assert len(rows("--older-than", "0s")) == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--status", "DONE"), "unknown status"),
        (("--older-than", "ten minutes"), "bad duration"),
        (("--older-than", "-5m"), "bad duration"),
    ],
)
def test_bad_filters_are_one_line_errors(
    filled: Ledger, args: tuple[str, ...], needle: str
) -> None:
    out = run_cli("queue", *args)
    assert out.returncode == 1 and needle in out.stderr and out.stderr.count("\n") == 1


def test_fail_if_any_is_for_monitors(filled: Ledger) -> None:
    assert run_cli("queue", "--fail-if-any").returncode == 4
    assert run_cli("queue", "--older-than", "1h", "--fail-if-any").returncode == 0
    typo = run_cli("queue", "--provider", "nobody", "--fail-if-any")  # a typo is no empty queue
    assert typo.returncode == 1 and "known: other, sim" in typo.stderr


def test_show_renders_the_full_timeline(filled: Ledger) -> None:
    res = run_cli(
        "resolve",
        "person",
        "--applied",
        "--reason",
        "customer called",
        "--evidence",
        "ticket 77",
        "--by",
        "carol",
    )
    assert res.returncode == 0, res.stderr
    out = run_cli("show", "person", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert [e["kind"] for e in data["events"]] == ["recorded", "claimed", "outcome", "resolved"]
    assert data["events"][-1]["actor"] == "operator:carol"
    human = run_cli("show", "person", env={"COLUMNS": "200"})
    assert human.returncode == 0
    text = " ".join(human.stdout.split())
    for needle in ("operator:carol", "resolved", "ticket 77", "customer called", "blind"):
        assert needle in text
    # a pipe gets no padding: `| grep ...$` works, and a narrow terminal at the end of
    # the pipe shows no blank lines
    assert not [line for line in human.stdout.splitlines() if line.endswith(" ")]
    assert run_cli("show", "auto").returncode == 0
    assert run_cli("show", "auto", "--exit-status").returncode == 4
    assert run_cli("show", "nope").returncode == 6
