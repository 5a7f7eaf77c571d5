"""The Python tool layer for agent code (settled.tool, settled.check, tool_specs, call)
against a real sim provider on loopback, and the status mapping it rests on."""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from invariants import check
from support import ROOT, run_cli, sim_conf, write_config

import settled
from settled import Ledger
from settled.agents import call, tool_specs, tools
from settled.errors import (
    ConfigError,
    Conflict,
    InvalidInput,
    LedgerError,
    NotFound,
    UnknownProvider,
)
from settled.model import Acceptance, ActionRecord, Delivery, Status, Tier
from settled.providers.sim_server import SimServer
from settled.toolbox import Operation, Toolbox, agent_status, check_params, result_for

pytestmark = pytest.mark.ledger_incidental

DOCS = (ROOT / "docs" / "agents.md").read_text()


def test_success_only_once_the_effect_is_observed(sim_config: Path, sim: SimServer) -> None:
    send = settled.tool("sim", "send")
    first = send("m-1", to="ann@example.com")
    assert first.status == "accepted" and not first.done
    assert first.settled_status == "AWAITING_VERIFICATION"
    later = settled.check("m-1", wait=10)
    assert later.status == "success" and later.done and sim.effects_for("m-1") == 1
    assert str(later) == later.text and later.text.startswith("success: sim.send m-1")


def test_a_lost_mail_is_accepted_then_uncertain_never_success(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    sim.plan("lost-1", "lost_after_accept")
    first = settled.tool("sim", "send")("lost-1", to="ann@example.com")
    assert first.status == "accepted"
    seen = [first.status]
    for _ in range(200):
        res = settled.check("lost-1")
        seen.append(res.status)
        if res.status != "accepted":
            break
        threading.Event().wait(0.02)
    assert seen[-1] == "uncertain" and "success" not in seen
    assert "do not resend under a new action_id" in res.text
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        check(led, sim)


def test_a_repeated_action_id_sends_once(sim_config: Path, sim: SimServer) -> None:
    book = settled.tool("sim", "book")
    first, again = book("b-1", slot="10:00"), book("b-1", slot="10:00")
    assert first.status == again.status == "success"
    assert "repeated action_id: nothing sent again" in again.text
    with pytest.raises(Conflict, match="already used with different params"):
        book("b-1", slot="11:00")
    assert len(sim.requests_for("b-1")) == 1


def test_concurrent_calls_from_threads_send_once(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    book = settled.tool("sim", "book")
    results: list[str] = []

    def one() -> None:
        results.append(book("twin", slot="10:00").status)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 4 and set(results) <= {"success", "accepted"}
    assert len(sim.requests_for("twin")) == 1
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        assert led.integrity_check() == "ok"


def test_confirmation_through_a_callback_or_a_shell(sim_config: Path, sim: SimServer) -> None:
    asked: list[str] = []

    def yes(question: str) -> bool:
        asked.append(question)
        return True

    ok = settled.tool("sim", "book", needs_confirmation=True, confirm=yes)("c-1", slot="9")
    assert ok.status == "success" and "confirmed and sent once" in ok.text
    assert asked == ['Send sim.book once, as action c-1? Params: {"slot": "9"}']
    no = settled.tool("sim", "book", needs_confirmation=True, confirm=lambda q: False)("c-2")
    assert (no.status, no.settled_status) == ("accepted", "PENDING")
    assert no.reason.startswith("the person declined: nothing was sent")
    waiting = settled.tool("sim", "book", needs_confirmation=True)("c-3")
    assert waiting.reason == "awaiting a person's confirmation; nothing has been sent"
    assert sim.requests_for("c-2") == sim.requests_for("c-3") == []
    p = run_cli("confirm", "c-3")
    assert p.returncode == 0, p.stderr
    assert settled.check("c-3").status == "success"
    assert len(sim.requests_for("c-3")) == 1


def test_wait_verifies_in_process(sim_config: Path, sim: SimServer) -> None:
    res = settled.tool("sim", "send", wait=10)("w-1", to="a")
    assert res.status == "success"
    sim.plan("w-2", "lost_after_accept")
    assert settled.tool("sim", "send", wait=10)("w-2").status == "uncertain"
    with pytest.raises(InvalidInput, match="wait"):
        settled.tool("sim", "send", wait=-1)


def test_errors_are_raised_with_one_line(sim_config: Path, sim: SimServer) -> None:
    with pytest.raises(UnknownProvider, match="no operation 'nope'"):
        settled.tool("sim", "nope")
    with pytest.raises(LedgerError, match="no ledger at"):  # checking creates no ledger
        settled.check("missing")
    settled.tool("sim", "notify")("n-1")
    with pytest.raises(NotFound, match="no action 'missing'"):
        settled.check("missing")
    with pytest.raises(InvalidInput, match="action_id must be a string"):
        settled.tool("sim", "send")(" padded")


def test_tool_specs_in_each_style_and_call_runs_them(sim_config: Path, sim: SimServer) -> None:
    plain = tool_specs()
    names = [s["name"] for s in plain]
    assert names == ["sim_book", "sim_deliver", "sim_notify", "sim_send", "sim_set", "check_action"]
    assert plain[0]["parameters"]["required"] == ["action_id"]
    assert "only 'success' means the effect was observed" in plain[0]["description"]
    openai = tool_specs("openai")
    assert openai[3]["type"] == "function" and openai[3]["function"]["name"] == "sim_send"
    anthropic = tool_specs("anthropic")
    assert anthropic[5]["input_schema"]["required"] == ["action_id"]
    json.dumps([plain, openai, anthropic])  # plain JSON, as the APIs take it
    with pytest.raises(InvalidInput, match="style"):
        tool_specs("yaml")
    assert call("sim_book", {"action_id": "k-1", "params": {"slot": "9"}}).status == "success"
    assert call("check_action", {"action_id": "k-1"}).status == "success"
    with pytest.raises(InvalidInput, match='go inside "params"'):
        call("sim_book", {"action_id": "k-2", "slot": "9"})
    with pytest.raises(InvalidInput, match="unknown tool"):
        call("sim_bogus", {"action_id": "k-3"})
    assert set(tools()) == set(names[:-1])


def test_a_declared_params_schema_is_enforced() -> None:
    from dataclasses import dataclass

    from settled.providers.base import OperationSpec

    @dataclass(frozen=True)
    class Declared(OperationSpec):
        params_schema: Any = None

    schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
    op = Operation(
        "m_send", "m", "send", Declared("send", Tier.RECONCILABLE, params_schema=schema), False
    )
    assert check_params(op, {"to": "a"}) == {"to": "a"}
    with pytest.raises(InvalidInput, match=r"'to' is a required property"):
        check_params(op, {})
    with pytest.raises(InvalidInput, match=r"at params/to"):
        check_params(op, {"to": 5})
    assert op.input_schema()["required"] == ["action_id", "params"]
    broken = Declared("send", Tier.RECONCILABLE, params_schema={"type": 5})
    with pytest.raises(ConfigError, match="params_schema is not a valid JSON schema"):
        check_params(Operation("m_send", "m", "send", broken, False), {})
    plain = Operation("m_send", "m", "send", OperationSpec("send", Tier.RECONCILABLE), False)
    with pytest.raises(InvalidInput, match="must be a JSON object"):
        check_params(plain, [1])


def _record(status: Status, **kw: Any) -> ActionRecord:
    base = ActionRecord(
        action_id="a",
        provider="p",
        operation="o",
        params={},
        params_hash="h",
        tier=Tier.RECONCILABLE,
        reconciliation_key=None,
        eligible_at=None,
        requires_manual_verification=False,
        attempt=1,
        idempotency_key="a:1",
        dispatch_id=None,
        provider_object_id=None,
        status=status,
        delivery=Delivery.PENDING,
        acceptance=Acceptance.UNKNOWN,
        dispatched_at=None,
        confirmed_at=None,
        confirmed_by=None,
        created_at="2026-01-01T00:00:00.000000Z",
        updated_at="2026-01-01T00:00:00.000000Z",
    )
    return replace(base, **kw)


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("next_check_at", [None, "2026-01-01T00:00:01.000000Z"])
@pytest.mark.parametrize("manual", [False, True])
def test_the_status_comes_from_the_record_and_success_means_confirmed(
    status: Status, next_check_at: str | None, manual: bool
) -> None:
    rec = _record(status, next_check_at=next_check_at, requires_manual_verification=manual)
    res = result_for(rec, "a note")
    assert res.status == agent_status(rec)
    assert (res.status == "success") == (status is Status.CONFIRMED)
    assert (res.status == "failed") == (status is Status.FAILED)
    if status is Status.DENIED_UNRESOLVED:
        assert res.status == "uncertain"
    if status in (Status.PENDING, Status.IN_FLIGHT):
        assert res.status == "accepted"
    assert res.to_json()["settled_status"] == str(status)
    assert "\n" not in res.text and res.text.startswith(f"{res.status}: p.o a — ")


def test_a_toolbox_pool_serves_threads_side_by_side(sim_config: Path, sim: SimServer) -> None:
    with Toolbox(pool=3) as box:
        assert box.prepare().endswith("ledger.db")
        op = box.operation("sim", "book")
        out: list[str] = []
        threads = [
            threading.Thread(
                target=lambda i=i: out.append(box.submit(op, f"t-{i}", {}).result.status)
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert out == ["success"] * 6
    assert all(len(sim.requests_for(f"t-{i}")) == 1 for i in range(6))


def test_the_docs_python_example_runs(
    tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = re.search(r"```python\n(.*?)```", DOCS, flags=re.S)
    assert block is not None
    assert len(block.group(1).strip().splitlines()) <= 12
    write_config(tmp_path / "settled.toml", {"mail": sim_conf(sim)})
    monkeypatch.chdir(tmp_path)
    exec(compile(block.group(1), "docs/agents.md", "exec"), {})
    assert len(sim.requests_for("order-42-receipt")) == 1


def test_reasons_reach_the_model_as_one_line_of_escaped_text() -> None:
    rec = _record(Status.FAILED, reason="HTTP 422; body: \x1b[31mno\x1b[0m\r\nsecond\x07 line")
    res = result_for(rec)
    for text in (res.text, res.reason):
        assert "\x1b" not in text and "\x07" not in text and "\n" not in text
        assert text.isprintable()
    assert "\\x1b[31mno\\x1b[0m second\\x07 line" in res.reason
