"""Rule 20 at retry: a FAILED rests on a final answer, kept in its outcome event, or
it cannot be retried without a person (rule 14 extended to operations no query can
check). On both ledgers, against a real server on loopback."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import standins
from standins import StandIn

from settled import Ledger, policy
from settled.dispatch import Dispatcher
from settled.errors import RecheckFailed, TransitionNotAllowed
from settled.model import Declared, Status, Wire, WireResult
from settled.providers import Registry
from settled.sending import Outcome

TOKEN = {"SLACK_BOT_TOKEN": "xoxb-test-token"}


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in TOKEN.items():
        monkeypatch.setenv(k, v)
    fake = standins.Slack()
    host = StandIn(fake.handle)
    conf = {
        "type": "http",
        "base_url": f"{host.url}/api",
        "auth": {"type": "bearer", "token": "${SLACK_BOT_TOKEN}"},
        "operations": {
            "post": {
                "tier": "full",
                "attempts": 1,
                "object_id": "/ts",
                "status": "/ok",
                "applied": [True],
                "not_applied": [False],
                "maybe_applied": {"path": "/error", "in": ["internal_error", "fatal_error"]},
                "request": {"path": "/chat.postMessage"},
            }
        },
    }
    reg = Registry({"slack": conf})
    yield fake, reg
    reg.close()
    host.close()


PARAMS = {"channel": "C1", "text": "hello"}


def test_a_failed_that_rests_on_a_declared_final_answer_may_be_retried(
    ledger: Ledger, slack: Any
) -> None:
    fake, reg = slack
    d = Dispatcher(ledger, reg)
    fake.plan = ["channel_not_found"]
    rec = d.submit("slack", "post", PARAMS, action_id="a1").record
    assert rec is not None and rec.status is Status.FAILED
    [outcome] = [e for e in ledger.events("a1") if e.kind == "outcome"]
    assert outcome.detail["final"] == "the reply's declared not_applied predicate"
    report = d.retry("a1")
    assert report.outcome is Outcome.DISPATCHED and report.record.status is Status.CONFIRMED
    assert len(fake.messages) == 1


def test_an_error_that_may_follow_the_effect_is_never_failed_nor_retried(
    ledger: Ledger, slack: Any
) -> None:
    fake, reg = slack
    d = Dispatcher(ledger, reg)
    fake.plan = ["+fatal_error"]
    rec = d.submit("slack", "post", PARAMS, action_id="a2").record
    assert rec is not None and rec.status is Status.DENIED_UNRESOLVED
    with pytest.raises(TransitionNotAllowed):
        d.retry("a2")
    assert len(fake.messages) == 1


def test_a_failed_that_rests_on_nothing_final_needs_a_person_to_retry(
    ledger: Ledger, slack: Any
) -> None:
    """An outcome written before settled kept what a FAILED rests on (its event has no
    ``final``), on an operation no query can check: retry refuses, and a person's
    --no-recheck, recorded, lets it go."""
    fake, reg = slack
    declared = Declared.of(reg.operation("slack", "post"))
    d = Dispatcher(ledger, reg)
    now = ledger.clock().now()
    rec = policy.new_record(
        action_id="old",
        provider="slack",
        operation="post",
        params=PARAMS,
        declared=declared,
        now=now,
    )
    taken = policy.claim(rec, declared, now, actor="t", grace=30.0, default_backoff=0.05)
    claimed, _ = ledger.record_and_claim(rec, actor="t", claim=taken.move)
    wire = WireResult(Wire.ANSWERED, 200, applied=False, detail="HTTP 200; /ok = False")
    move = policy.outcome(
        claimed,
        declared,
        policy.ReplyProof.REJECTED,
        wire,
        now,
        owner=taken.owner,
        actor="t",
        tries=[],
    )
    legacy = replace(move, detail={k: v for k, v in move.detail.items() if k != "final"})
    assert ledger.move(legacy) is not None
    with pytest.raises(RecheckFailed) as err:
        d.retry("old")
    assert "rests on no final answer" in str(err.value)
    assert fake.messages == [] and ledger.get("old").status is Status.FAILED
    report = d.retry("old", recheck=False)
    assert report.record.status is Status.CONFIRMED and len(fake.messages) == 1
    [retried] = [e for e in ledger.events("old") if e.kind == "retry"]
    assert json.dumps(retried.detail).count("--no-recheck") == 1
