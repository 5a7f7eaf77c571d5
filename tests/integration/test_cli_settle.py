"""settled reconcile / resolve / retry as real processes: exit codes, JSON, messages,
and the ledger unchanged after every refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.cli.common import default_actor
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer


@pytest.fixture
def make(ledger: Ledger, sim: SimServer, tmp_path: Path) -> Iterator[Any]:
    """Records dispatched in-process; the CLI sees the same provider settings. The
    verification budget is long so that a slow machine never spends it mid-test."""
    conf = sim_conf(sim, verify_deadline=120.0)
    write_config(tmp_path / "settled.toml", {"sim": dict(conf)})
    registry = Registry({"sim": conf}, source="test")
    d = Dispatcher(ledger, registry)

    def _make(aid: str, op: str = "send", *faults: str) -> Any:
        if faults:
            sim.plan(aid, *faults)
        return d.submit("sim", op, {"to": "x"}, action_id=aid).record

    yield _make
    registry.close()


def snapshot(ledger: Ledger, aid: str) -> tuple[Any, int]:
    return ledger.get(aid).to_json(), len(ledger.events(aid))


# -- reconcile ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "give ACTION_IDs"),
        (("a", "--due"), "give no ACTION_IDs or selectors with it"),
        (("--due", "--provider", "sim"), "give no ACTION_IDs or selectors with it"),
        (("--due", "--yes"), "not --due"),
        (("a", "--limit", "3"), "--limit applies to --due and to selectors"),
        (("--due", "--limit", "0"), "--limit"),
    ],
)
def test_reconcile_usage_errors(sim_config: Path, args: tuple[str, ...], needle: str) -> None:
    out = run_cli("reconcile", *args)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr


def test_reconcile_due_prints_the_pass_report_and_exits_0(
    make: Any, ledger: Ledger, sim: SimServer
) -> None:
    make("ok")
    make("bounced", "send", "bounce")
    make("lost", "send", "lost_after_accept")
    out = run_cli("reconcile", "--due", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["examined"] == 3 and report["counts"] == {"CONFIRMED": 1, "FAILED": 1}
    assert [s["action_id"] for s in report["waiting"]] == ["lost"]
    assert report["waiting"][0]["kind"] == "waiting" and report["waiting"][0]["seen"] == "not_yet"
    assert report["skipped"] == [] and report["stopped"] is False
    assert set(report["changes"][0]) == {
        "at",
        "action_id",
        "from",
        "to",
        "kind",
        "reason",
        "next_check_at",
        "seen",
        "error",
    }
    assert report["unusable"] == {}
    human = run_cli("reconcile", "--due")
    assert human.returncode == 0 and "examined" in human.stderr


def test_reconcile_due_with_a_limit(make: Any, ledger: Ledger) -> None:
    for i in range(5):
        make(f"a{i}")
    out = run_cli("reconcile", "--due", "--limit", "2", "--json")
    assert json.loads(out.stdout)["examined"] == 2
    assert len(ledger.query(statuses=["CONFIRMED"])) == 2


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        ("ok", 0, "CONFIRMED"),
        ("bounce", 5, "FAILED"),
        ("lost_after_accept", 3, "AWAITING_VERIFICATION"),
    ],
)
def test_reconcile_one_id_exits_by_its_status(
    make: Any, ledger: Ledger, fault: str, code: int, status: str
) -> None:
    make("a", "send", fault)
    out = run_cli("reconcile", "a")
    assert out.returncode == code, out.stderr
    assert ledger.get("a").status == status


def test_reconcile_one_unresolved_id_exits_4(make: Any) -> None:
    make("n", "notify")
    out = run_cli("reconcile", "n", "--json")
    assert out.returncode == 4
    assert "needs a person" in json.loads(out.stdout)["skipped"][0]["reason"]


def test_reconcile_several_ids_exits_0(make: Any) -> None:
    make("a", "send", "bounce")
    make("b")
    out = run_cli("reconcile", "a", "b", "--json")
    assert out.returncode == 0
    assert json.loads(out.stdout)["counts"] == {"FAILED": 1, "CONFIRMED": 1}


def test_reconcile_unknown_id_exits_6_and_checks_nothing(
    make: Any, ledger: Ledger, sim: SimServer
) -> None:
    rec = make("a")
    out = run_cli("reconcile", "a", "nope")
    assert out.returncode == 6 and out.stderr.startswith("settled: error:") and "nope" in out.stderr
    assert sim.queries_for(rec.reconciliation_key) == 0


# -- resolve -----------------------------------------------------------------------------


def test_resolve_requires_a_reason_and_a_verdict(make: Any, ledger: Ledger) -> None:
    make("n", "notify")
    before = snapshot(ledger, "n")
    assert run_cli("resolve", "n", "--applied").returncode == 2
    no_verdict = run_cli("resolve", "n", "--reason", "x")
    assert no_verdict.returncode == 2 and "--applied or --not-applied" in no_verdict.stderr
    blank = run_cli("resolve", "n", "--applied", "--reason", "  ")
    assert blank.returncode == 1 and "--reason" in blank.stderr
    empty_by = run_cli("resolve", "n", "--applied", "--reason", "x", "--by", "")
    assert empty_by.returncode == 1
    assert snapshot(ledger, "n") == before


@pytest.mark.parametrize(("op", "fault"), [("book", "ok"), ("send", "lost_after_accept")])
def test_resolve_is_refused_where_evidence_decides(
    make: Any, ledger: Ledger, op: str, fault: str
) -> None:
    """CONFIRMED is terminal; a reconcilable record awaiting its check is the
    verifier's to settle."""
    make("a", op, fault)
    before = snapshot(ledger, "a")
    out = run_cli("resolve", "a", "--not-applied", "--reason", "I think so")
    assert out.returncode == 7 and out.stderr.count("\n") == 1, out.stderr
    assert snapshot(ledger, "a") == before


def test_resolve_unknown_id_exits_6(make: Any) -> None:
    make("a")
    assert run_cli("resolve", "nope", "--applied", "--reason", "x").returncode == 6


def test_resolve_without_a_ledger_names_its_path_and_creates_none(
    sim_config: Path, db_path: Path
) -> None:
    out = run_cli("resolve", "nope", "--applied", "--reason", "x")
    assert out.returncode == 1 and f"no ledger at {db_path}" in out.stderr
    assert not db_path.exists()


def test_resolve_defaults_to_the_os_user_and_keeps_the_evidence(make: Any, ledger: Ledger) -> None:
    make("p", "deliver")  # partial: a person may verify it while it awaits
    out = run_cli(
        "resolve",
        "p",
        "--applied",
        "--reason",
        "customer replied",
        "--evidence",
        "ticket 991",
        "--object-id",
        "msg-7",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["confirmed_by"] == f"operator:{default_actor()}"
    assert rec["provider_object_id"] == "msg-7" and rec["acceptance"] == "ACCEPTED"
    ev = ledger.events("p")[-1]
    assert ev.actor == f"operator:{default_actor()}" and ev.kind == "resolved"
    assert ev.detail == {
        "verdict": "applied",
        "reason": "customer replied",
        "evidence": "ticket 991",
        "object_id": "msg-7",
        "by": default_actor(),
    }
    again = run_cli("resolve", "p", "--not-applied", "--reason", "changed my mind")
    assert again.returncode == 7 and ledger.get("p").status == "CONFIRMED"


def test_confirmed_by_tells_provider_reconciliation_and_operator_apart(
    make: Any, ledger: Ledger
) -> None:
    make("full", "book")
    make("rec", "send")
    make("op", "notify")
    run_cli("reconcile", "--due")
    run_cli("resolve", "op", "--applied", "--reason", "seen", "--by", "bob")
    assert [ledger.get(a).confirmed_by for a in ("full", "rec", "op")] == [
        "provider",
        "reconciliation",
        "operator:bob",
    ]


# -- retry -------------------------------------------------------------------------------


def test_retry_from_unresolved_is_refused_with_the_way_out(make: Any, ledger: Ledger) -> None:
    make("n", "notify")
    before = snapshot(ledger, "n")
    out = run_cli("retry", "n")
    assert out.returncode == 7
    assert "DENIED_UNRESOLVED" in out.stderr and "settled reconcile" in out.stderr
    assert "settled resolve" in out.stderr
    assert snapshot(ledger, "n") == before


def test_retry_after_resolve_not_applied_opens_attempt_two(
    make: Any, ledger: Ledger, sim: SimServer
) -> None:
    make("n", "notify")
    assert run_cli("resolve", "n", "--not-applied", "--reason", "never arrived").returncode == 0
    out = run_cli("retry", "n", "--json")
    assert out.returncode == 4  # blind again: a person verifies attempt 2 as well
    rec = json.loads(out.stdout)
    assert (rec["attempt"], rec["idempotency_key"], rec["outcome"]) == (2, "n:2", "dispatched")
    assert [r["idempotency_key"] for r in sim.requests_for("n")] == ["n:1", "n:2"]


def test_retry_unknown_and_pending(make: Any, ledger: Ledger, sim: SimServer) -> None:
    assert run_cli("retry", "nope").returncode == 6
    make("a", "send", "lost_after_accept")
    out = run_cli("retry", "a")
    assert out.returncode == 7 and "only from FAILED" in out.stderr
    assert len(sim.requests_for("a")) == 1


@pytest.mark.ledger_free
@pytest.mark.parametrize("moved", [True, False])
@pytest.mark.parametrize(
    "change",
    [
        {},
        {"to_status": "CONFIRMED", "kind": "confirmed"},
        {"error": "ConnectError: [Errno 111] refused", "kind": "check_failed"},
        {"error": "HTTP 503", "paused": "HTTP 503"},
        {"action_id": "id\x1b[31m-\u202e", "reason": "line one\nline two\ttab\x07"},
        {"reason": "x " * 3000},
        {"from_status": "IN_FLIGHT", "to_status": "DENIED_UNRESOLVED", "kind": "lease_expired"},
    ],
)
def test_reconcile_plain_lines_are_the_rich_lines_characters(
    moved: bool, change: dict[str, Any]
) -> None:
    """Off a terminal, reconcile's writer thread builds its lines as strings; they are
    the characters the rich Texts it prints on a terminal hold, escapes and cuts too."""
    from settled.cli.reconcile_cmd import _lines, plain
    from settled.reconcile import Change

    fields = {
        "action_id": "a-1",
        "from_status": "AWAITING_VERIFICATION",
        "to_status": "AWAITING_VERIFICATION",
        "kind": "checked",
        "reason": "the provider has no record of it yet (HTTP 404)",
        **change,
    }
    item = (moved, Change(**fields))
    assert _lines(item, plain) == [line.plain for line in _lines(item)]
