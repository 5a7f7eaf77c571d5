"""A cause that survives, as real processes on both backends: a send the provider
answered 503 is held as ``http_503`` from its outcome through every later check, so
when the verification budget is spent (and the reason turns into "budget spent") the
batch is still found by its cause (``--cause``, ``?cause=``) and by ``--match "HTTP
503"``, and ``show`` says it in a person's words. Each other first outcome leaves its
own code; a new attempt starts without one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from records import new_record
from support import SHORT, run_cli, sim_conf, write_config

from settled import cause
from settled.model import Status, Tier, Wire, WireResult
from settled.policy import ReplyProof, cause_of_outcome
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=20)


def record(aid: str) -> dict[str, Any]:
    out = run_cli("show", aid, "--json")
    assert out.returncode in (0, 3, 4, 5), out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def names(*args: str) -> list[str]:
    out = run_cli("queue", *args, "-o", "name")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def spend_the_budget(aid: str) -> dict[str, Any]:
    """Run the reconciler, pass after pass, until the record's budget is spent (bounded:
    each pass is a process that takes longer than the check interval)."""
    for _ in range(60):
        rec = record(aid)
        if "budget spent" in (rec["reason"] or ""):
            return rec
        done = run_cli("reconcile", "--due")
        assert done.returncode in (0, 4), done.stderr
    raise AssertionError(f"{aid}: the budget was not spent in 60 passes: {record(aid)}")


@pytest.fixture
def incident(db_path: Any, sim: SimServer, tmp_path: Path) -> Any:
    """A mail the relay answered 503 (never applied), a blind notification, and a send
    whose answer timed out after the provider applied it."""
    conf = sim_conf(sim, verify_interval=0.05, verify_deadline=0.4)
    # The same server, for the send whose answer is meant to time out: a timeout under
    # the server's hang (the client gives up first), and a budget long enough that one
    # of its checks, made with that timeout too, gets an answer.
    slow = sim_conf(sim, verify_interval=0.05, verify_deadline=5.0, timeout=SHORT)
    write_config(tmp_path / "settled.toml", {"sim": conf, "slow": slow})
    for aid, provider, op, fault in [
        ("m-503", "sim", "send", "http:503"),
        ("n-blind", "sim", "notify", "ok"),
        ("m-slow", "slow", "send", "timeout_after_apply"),
    ]:
        sim.plan(aid, fault)
        out = run_cli(
            "dispatch", provider, op, "--params", '{"to": "ana@example.com"}', "--action-id", aid
        )
        assert out.returncode in (0, 3, 4), out.stderr
    return db_path


def test_a_503_keeps_its_cause_after_the_budget_is_spent(incident: Any) -> None:
    first = record("m-503")
    assert first["cause"] == "http_503" and "HTTP 503" in first["reason"]
    spent = spend_the_budget("m-503")
    assert spent["status"] == "DENIED_UNRESOLVED" and spent["checks"] >= 3
    assert "HTTP 503" not in spent["reason"]  # the reason moved on; the cause did not
    assert spent["cause"] == "http_503"
    assert spent["cause_text"] == (
        f"the provider answered HTTP 503; {spent['checks']} checks since found nothing"
    )
    assert names("--cause", "http_503") == ["m-503"]
    assert names("--cause", "HTTP_503,blind") == ["m-503", "n-blind"]
    assert names("--match", "HTTP 503") == ["m-503"]
    shown = run_cli("show", "m-503", env={"COLUMNS": "200"})
    assert "the provider answered HTTP 503;" in shown.stdout and "(http_503)" in shown.stdout
    listed = json.loads(run_cli("queue", "--json").stdout)
    assert {r["action_id"]: r["cause"] for r in listed} == {
        "m-503": "http_503",
        "n-blind": "blind",
    }
    table = run_cli("queue", "-o", "table", env={"COLUMNS": "200"}).stdout
    assert "http_503" in table and "blind" in table


def test_each_first_outcome_leaves_its_own_cause(incident: Any) -> None:
    assert record("n-blind")["cause"] == "blind"
    assert record("n-blind")["cause_text"] == (
        "nothing can observe this effect; a person must say whether it happened"
    )
    slow = record("m-slow")
    assert slow["cause"] == "timeout_after_send"
    settled = spend_or_settle("m-slow")
    assert settled["status"] == "CONFIRMED" and settled["cause"] == "timeout_after_send"
    assert names("--cause", "timeout_after_send") == []  # the queue holds open records
    assert names("--cause", "timeout_after_send", "--status", "all") == ["m-slow"]


def spend_or_settle(aid: str) -> dict[str, Any]:
    for _ in range(60):
        rec = record(aid)
        if rec["status"] in ("CONFIRMED", "FAILED") or "budget spent" in (rec["reason"] or ""):
            return rec
        assert run_cli("reconcile", "--due").returncode in (0, 4)
    raise AssertionError(f"{aid} did not settle in 60 passes")


def test_a_new_attempt_starts_without_a_cause(incident: Any) -> None:
    spend_the_budget("m-503")
    out = run_cli(
        "resolve", "m-503", "--not-applied", "--reason", "relay log: never queued", "--no-recheck"
    )
    assert out.returncode == 0, out.stderr
    assert record("m-503")["cause"] == "http_503"  # a verdict keeps the story
    again = run_cli("retry", "m-503", "--no-recheck", "--yes")
    assert again.returncode in (0, 3, 4), again.stderr
    rec = record("m-503")
    assert rec["attempt"] == 2 and rec["status"] in ("CONFIRMED", "AWAITING_VERIFICATION")
    assert rec["cause"] in (None, "accepted_unseen")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("http_5", "unknown cause 'http_5'"),
        ("lost", "unknown cause 'lost'"),
        (",", "unknown cause ','"),
    ],
)
def test_an_unknown_cause_is_one_line_naming_the_causes(
    incident: Any, given: str, says: str
) -> None:
    out = run_cli("queue", "--cause", given)
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"settled: error: {says}; use one of http_NNN, timeout_after_send")


def test_the_api_filters_by_cause_and_words_it(
    incident: Any, tmp_path: Path, sim: SimServer, monkeypatch: Any
) -> None:
    from serving import auth, in_process, token_env, write_serve_config

    spend_the_budget("m-503")
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim)
    with in_process() as (client, _lines):
        r = client.get("/api/v1/actions", params={"cause": "http_503"}, headers=auth("reader"))
        assert r.status_code == 200, r.text
        (only,) = r.json()["actions"]
        assert only["action_id"] == "m-503" and only["cause"] == "http_503"
        assert only["cause_text"].startswith("the provider answered HTTP 503; ")
        one = client.get("/api/v1/actions/m-503", headers=auth("reader")).json()
        assert one["cause"] == "http_503" and one["cause_text"] == only["cause_text"]
        bad = client.get("/api/v1/actions", params={"cause": "nope"}, headers=auth("reader"))
        assert bad.status_code == 422 and bad.json()["detail"].startswith("cause: unknown cause")


@pytest.mark.ledger_free
@pytest.mark.parametrize(
    ("verdict", "tier", "queryable", "wire", "code"),
    [
        (ReplyProof.AMBIGUOUS, Tier.RECONCILABLE, True, WireResult(Wire.ANSWERED, 429), "http_429"),
        (
            ReplyProof.AMBIGUOUS,
            Tier.RECONCILABLE,
            True,
            WireResult(Wire.NO_ANSWER, detail="ReadTimeout: timed out"),
            "timeout_after_send",
        ),
        (
            ReplyProof.AMBIGUOUS,
            Tier.RECONCILABLE,
            True,
            WireResult(Wire.NO_ANSWER, detail="RemoteProtocolError: reset"),
            "reply_lost",
        ),
        (ReplyProof.CONFLICT, Tier.RECONCILABLE, True, WireResult(Wire.ANSWERED, 409), "conflict"),
        (
            ReplyProof.ACCEPTED,
            Tier.PARTIAL,
            True,
            WireResult(Wire.ANSWERED, 250),
            "awaiting_person",
        ),
        (ReplyProof.ACCEPTED, Tier.FULL, False, WireResult(Wire.ANSWERED, 202), "unprovable"),
        (ReplyProof.PROVEN, Tier.FULL, True, WireResult(Wire.ANSWERED, 201), None),
    ],
)
def test_the_policy_names_the_cause_of_each_outcome(
    verdict: ReplyProof, tier: Tier, queryable: bool, wire: WireResult, code: str | None
) -> None:
    assert cause_of_outcome(verdict, tier, queryable, wire) == code
    if code is not None:
        assert cause.is_cause(code)


@pytest.mark.ledger_free
def test_a_contradiction_is_shown_over_the_cause() -> None:
    rec = replace(
        new_record("a"),
        status=Status.CONFIRMED,
        cause="http_503",
        contradiction="a late reply says 400",
    )
    assert cause.shown(rec) == "contradicted"
    assert cause.sentence(rec) == (
        "a later reply contradicts the recorded outcome: a late reply says 400"
    )
