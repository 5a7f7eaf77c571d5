"""settled's FunctionTools in the OpenAI Agents SDK, driven by the SDK's own
ScriptedModel against the real sim provider on loopback and a real ledger file."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.testing.model import ModelCall
from frameworks import configure, events, status, until

from settled.integrations import openai_agents as settled_agents
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_incidental

Policy = Callable[[list[str], int], Any]


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, sim: SimServer) -> Iterator[None]:
    set_tracing_disabled(True)  # nothing leaves this machine
    configure(tmp_path, sim)
    yield


def outputs(items: Any) -> list[str]:
    """Every tool output the model has read, oldest first."""
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            out.append(str(item.get("output")))
    return out


def scripted(policy: Policy, turns: int = 400) -> ScriptedModel:
    """A model whose every turn is ``policy(tool outputs read so far, turn number)``."""
    count = [0]

    def respond(call: ModelCall) -> Any:
        count[0] += 1
        return policy(outputs(call.input), count[0])

    return ScriptedModel([ModelStep.respond(respond) for _ in range(turns)])


def run(agent: Agent[Any], start: Any) -> Any:
    return asyncio.run(Runner.run(agent, start, max_turns=500))


def poll_until_settled(first: Any, aid: str, turns: int = 300) -> Policy:
    def policy(read: list[str], turn: int) -> Any:
        if turn == 1:
            return [first]
        if read[-1].startswith("accepted") and turn < turns:
            until(lambda: False, 0.02)  # a model's turn takes a while
            return [function_call("check_action", {"action_id": aid}, call_id=f"k{turn}")]
        return [assistant_message(read[-1].split(":")[0])]

    return policy


def test_late_delivery_is_accepted_then_success(sim: SimServer) -> None:
    sim.plan("receipt-1", "lag:0.4")
    first = function_call("sim_send", {"params": {"order_id": 1, "to": "a@x.org"}}, call_id="c1")
    agent = Agent(
        name="ops",
        model=scripted(poll_until_settled(first, "receipt-1")),
        tools=settled_agents.tools(),
    )
    result = run(agent, "send the receipt")
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert read[0].startswith("accepted: sim.send receipt-1")
    assert read[-1].startswith("success: sim.send receipt-1") and result.final_output == "success"
    assert all(r.startswith("accepted") for r in read[:-1])
    assert len(sim.requests_for("receipt-1")) == 1


def test_a_lost_mail_is_never_success(sim: SimServer) -> None:
    sim.plan("receipt-2", "lost_after_accept")
    first = function_call("sim_send", {"params": {"order_id": 2, "to": "a@x.org"}}, call_id="c1")
    agent = Agent(
        name="ops",
        model=scripted(poll_until_settled(first, "receipt-2")),
        tools=settled_agents.tools(),
    )
    result = run(agent, "send the receipt")
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert read[0].startswith("accepted") and read[-1].startswith("uncertain")
    assert not any(r.startswith("success") for r in read)


def test_a_replanned_call_sends_once(sim: SimServer) -> None:
    args = {"params": {"order_id": 3, "to": "a@x.org"}}

    def policy(read: list[str], turn: int) -> Any:
        if turn <= 2:  # the same intent under a new call id, as a re-planning model does
            return [function_call("sim_send", args, call_id=f"c{turn}")]
        return [assistant_message("done")]

    result = run(Agent(name="ops", model=scripted(policy), tools=settled_agents.tools()), "go")
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert "repeated intent: nothing sent again" in read[1]
    assert len(sim.requests_for("receipt-3")) == 1


def test_approve_sends_once_and_reject_sends_nothing_across_a_resumed_run(
    sim: SimServer,
) -> None:
    def policy(read: list[str], turn: int) -> Any:
        if turn == 1:
            return [
                function_call("sim_book", {"params": {"slot": "9"}}, call_id="yes"),
                function_call("sim_book", {"params": {"slot": "10"}}, call_id="no"),
            ]
        return [assistant_message("done")]

    agent = Agent(name="ops", model=scripted(policy), tools=settled_agents.tools())
    first = run(agent, "book both")
    asked = {i.raw_item.call_id: i for i in first.interruptions}
    assert set(asked) == {"yes", "no"}
    assert status("slot-9") == status("slot-10") == "PENDING"  # recorded before asking
    assert sim.requests_for("slot-9") == sim.requests_for("slot-10") == []
    saved = first.to_state().to_string()

    # A new process resumes: new tools, the same ledger; the SDK's RunState approves.
    resumed = Agent(name="ops", model=scripted(policy), tools=settled_agents.tools())
    state = asyncio.run(RunState.from_string(resumed, saved))
    items = {i.raw_item.call_id: i for i in state.get_interruptions()}
    state.approve(items["yes"])
    state.reject(items["no"])
    second = run(resumed, state)
    read = [str(i.output) for i in second.new_items if hasattr(i, "output")]
    assert any(r.startswith("success: sim.book slot-9 — confirmed and sent once") for r in read)
    assert len(sim.requests_for("slot-9")) == 1 and sim.requests_for("slot-10") == []
    assert status("slot-10") == "PENDING"

    # The same intent again: already sent, so nothing to approve and nothing sent.
    def again(read: list[str], turn: int) -> Any:
        if turn == 1:
            return [function_call("sim_book", {"params": {"slot": "9"}}, call_id="again")]
        return [assistant_message("done")]

    third = run(Agent(name="ops", model=scripted(again), tools=settled_agents.tools()), "book")
    assert third.interruptions == []
    assert len(sim.requests_for("slot-9")) == 1


def test_a_5xx_after_the_send_is_not_nothing_sent(sim: SimServer) -> None:
    sim.plan("receipt-4", "5xx_after")

    def policy(read: list[str], turn: int) -> Any:
        if turn == 1:
            args = {"params": {"order_id": 4, "to": "a@x.org"}}
            return [function_call("sim_send", args, call_id="c1")]
        return [assistant_message("done")]

    result = run(Agent(name="ops", model=scripted(policy), tools=settled_agents.tools()), "go")
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert read[0].split(":")[0] in ("uncertain", "accepted"), read[0]
    assert not read[0].startswith("error") and "An error occurred" not in read[0]
    assert len(sim.requests_for("receipt-4")) == 1


def test_a_person_only_approval_never_interrupts_the_run(sim: SimServer) -> None:
    def policy(read: list[str], turn: int) -> Any:
        if turn == 1:
            args = {"action_id": "d-1", "params": {"to": "x"}}
            return [function_call("sim_deliver", args, call_id="c1")]
        return [assistant_message("done")]

    result = run(Agent(name="ops", model=scripted(policy), tools=settled_agents.tools()), "go")
    assert result.interruptions == [] and result.final_output == "done"
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert "only a person can approve it" in read[0]
    assert sim.requests_for("d-1") == [] and [e.kind for e in events("d-1")] == ["recorded"]


def test_bad_arguments_are_one_line_for_the_model(sim: SimServer) -> None:
    def policy(read: list[str], turn: int) -> Any:
        if turn == 1:
            return [function_call("sim_send", {"params": {"to": "x"}}, call_id="c1")]
        return [assistant_message("done")]

    result = run(Agent(name="ops", model=scripted(policy), tools=settled_agents.tools()), "go")
    read = [str(i.output) for i in result.new_items if hasattr(i, "output")]
    assert read[0].startswith("error: params need 'order_id'") and "\n" not in read[0]
    assert "nothing was sent" in read[0]
