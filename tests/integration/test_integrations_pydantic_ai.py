"""settled's PydanticAI toolset, driven by PydanticAI's own FunctionModel against the
real sim provider on loopback and a real ledger file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from frameworks import configure, events, release_event_loop, status, until
from pydantic_ai import Agent, DeferredToolRequests, ToolApproved, ToolDenied
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from settled.integrations import pydantic_ai as settled_ai
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_incidental

Policy = Callable[[list[str], int], ModelResponse]

# PydanticAI stops a run after 50 model requests by default; a polling model on a busy
# machine can need more before the verification deadline passes. The policies bound
# themselves (``turns``), so the run's own limit sits above theirs.
POLLING = UsageLimits(request_limit=500)


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, sim: SimServer) -> Iterator[None]:
    configure(tmp_path, sim)
    yield
    release_event_loop()


def returns(messages: list[ModelMessage]) -> list[str]:
    """Every tool result the model has read, oldest first."""
    return [
        str(part.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart)
    ]


def scripted(policy: Policy) -> tuple[FunctionModel, list[AgentInfo]]:
    """A model whose every turn is ``policy(results read so far, turn number)``."""
    seen: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return policy(returns(messages), len(seen))

    return FunctionModel(model), seen


def call(name: str, args: dict[str, Any], call_id: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id)])


def poll_until_settled(first: ModelResponse, aid: str, turns: int = 400) -> Policy:
    """Send, then ask check_action (at most ``turns`` times) until the result is no
    longer 'accepted'."""

    def policy(read: list[str], turn: int) -> ModelResponse:
        if turn == 1:
            return first
        if read[-1].startswith("accepted") and turn < turns:
            until(lambda: False, 0.02)  # a model's turn takes a while
            return call("check_action", {"action_id": aid}, f"check-{turn}")
        return ModelResponse(parts=[TextPart(read[-1].split(":")[0])])

    return policy


def test_late_delivery_is_accepted_then_success(sim: SimServer) -> None:
    sim.plan("receipt-1", "lag:0.4")
    first = call("sim_send", {"params": {"order_id": 1, "to": "ann@example.com"}}, "c1")
    model, infos = scripted(poll_until_settled(first, "receipt-1"))
    agent = Agent(model, toolsets=[settled_ai.toolset()])
    result = agent.run_sync("send the receipt", usage_limits=POLLING)
    read = returns(result.all_messages())
    assert read[0].startswith("accepted: sim.send receipt-1")
    assert read[-1].startswith("success: sim.send receipt-1") and result.output == "success"
    assert all(r.startswith("accepted") for r in read[:-1])
    assert len(sim.requests_for("receipt-1")) == 1
    tools = {t.name: t for t in infos[0].function_tools}
    params = tools["sim_send"].parameters_json_schema["properties"]["params"]
    assert params["required"] == ["order_id"]  # typed from the operation's declaration
    assert "action_id" not in tools["sim_send"].parameters_json_schema["properties"]


def test_a_lost_mail_is_never_success(sim: SimServer) -> None:
    sim.plan("receipt-2", "lost_after_accept")
    first = call("sim_send", {"params": {"order_id": 2, "to": "ann@example.com"}}, "c1")
    model, _ = scripted(poll_until_settled(first, "receipt-2"))
    agent = Agent(model, toolsets=[settled_ai.toolset()])
    result = agent.run_sync("send the receipt", usage_limits=POLLING)
    read = returns(result.all_messages())
    assert read[0].startswith("accepted") and read[-1].startswith("uncertain")
    assert not any(r.startswith("success") for r in read)
    assert status("receipt-2") == "DENIED_UNRESOLVED"


def test_a_replanned_call_sends_once(sim: SimServer) -> None:
    args = {"params": {"order_id": 3, "to": "ann@example.com"}}
    script = iter([call("sim_send", args, "c1"), call("sim_send", args, "c2-replanned")])

    def policy(read: list[str], turn: int) -> ModelResponse:
        return next(script, ModelResponse(parts=[TextPart("done")]))

    model, _ = scripted(policy)
    result = Agent(model, toolsets=[settled_ai.toolset()]).run_sync("send it")
    read = returns(result.all_messages())
    assert "repeated intent: nothing sent again" in read[1]
    assert len(sim.requests_for("receipt-3")) == 1


def test_approve_sends_once_and_deny_sends_nothing(sim: SimServer) -> None:
    def policy(read: list[str], turn: int) -> ModelResponse:
        if turn == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("sim_book", {"params": {"slot": "9"}}, tool_call_id="yes"),
                    ToolCallPart("sim_book", {"params": {"slot": "10"}}, tool_call_id="no"),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    model, _ = scripted(policy)
    agent = Agent(model, toolsets=[settled_ai.toolset()], output_type=[str, DeferredToolRequests])
    first = agent.run_sync("book both")
    asked = first.output
    assert isinstance(asked, DeferredToolRequests)
    assert {c.tool_call_id for c in asked.approvals} == {"yes", "no"}
    shown = asked.metadata["yes"]
    assert (shown["action_id"], shown["tier"], shown["params"]) == ("slot-9", "full", {"slot": "9"})
    assert status("slot-9") == status("slot-10") == "PENDING"
    assert sim.requests_for("slot-9") == sim.requests_for("slot-10") == []
    answers = asked.build_results(approvals={"yes": True, "no": ToolDenied("not now")})
    second = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=answers)
    read = returns(second.all_messages())
    assert any(r.startswith("success: sim.book slot-9 — confirmed and sent once") for r in read)
    assert "not now" in read
    assert len(sim.requests_for("slot-9")) == 1 and sim.requests_for("slot-10") == []
    assert status("slot-10") == "PENDING"


def test_an_approval_with_other_params_is_asked_anew(sim: SimServer) -> None:
    def policy(read: list[str], turn: int) -> ModelResponse:
        if turn == 1:
            return call("sim_book", {"params": {"slot": "11"}}, "c1")
        return ModelResponse(parts=[TextPart("done")])

    model, _ = scripted(policy)
    agent = Agent(model, toolsets=[settled_ai.toolset()], output_type=[str, DeferredToolRequests])
    first = agent.run_sync("book")
    assert isinstance(first.output, DeferredToolRequests)
    edited = ToolApproved(override_args={"params": {"slot": "12"}})
    answers = first.output.build_results(approvals={"c1": edited})
    second = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=answers)
    again = second.output
    assert isinstance(again, DeferredToolRequests)  # slot-12 was never shown: asked anew
    assert again.metadata[again.approvals[0].tool_call_id]["action_id"] == "slot-12"
    assert sim.requests_for("slot-11") == sim.requests_for("slot-12") == []


def test_a_5xx_after_the_send_is_not_nothing_sent(sim: SimServer) -> None:
    sim.plan("receipt-4", "5xx_after")

    def policy(read: list[str], turn: int) -> ModelResponse:
        if turn == 1:
            return call("sim_send", {"params": {"order_id": 4, "to": "a@example.com"}}, "c1")
        return ModelResponse(parts=[TextPart("done")])

    model, _ = scripted(policy)
    result = Agent(model, toolsets=[settled_ai.toolset()]).run_sync("send it")
    parts = [
        p
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if getattr(p, "tool_name", None) == "sim_send"
    ]
    assert len(parts) == 1 and isinstance(parts[0], ToolReturnPart)  # a result, not a failure
    text = str(parts[0].content)
    assert (
        text.split(":", maxsplit=1)[0] in ("uncertain", "accepted")
        and "nothing" not in text.split("—", maxsplit=1)[0]
    )
    assert parts[0].outcome == "success"  # the tool ran and answered: not a failed call
    assert len(sim.requests_for("receipt-4")) == 1
    assert status("receipt-4") in ("DENIED_UNRESOLVED", "AWAITING_VERIFICATION", "CONFIRMED")


def test_a_person_only_approval_is_never_asked_of_the_run(sim: SimServer) -> None:
    def policy(read: list[str], turn: int) -> ModelResponse:
        if turn == 1:
            return call("sim_deliver", {"action_id": "d-1", "params": {"to": "x"}}, "c1")
        return ModelResponse(parts=[TextPart("done")])

    model, _ = scripted(policy)
    agent = Agent(model, toolsets=[settled_ai.toolset()], output_type=[str, DeferredToolRequests])
    result = agent.run_sync("deliver")
    assert result.output == "done"  # no DeferredToolRequests: the run cannot approve it
    assert "only a person can approve it" in returns(result.all_messages())[0]
    assert sim.requests_for("d-1") == [] and status("d-1") == "PENDING"
    assert [e.kind for e in events("d-1")] == ["recorded"]
