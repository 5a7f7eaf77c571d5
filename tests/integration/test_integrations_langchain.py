"""settled's LangChain tools inside LangGraph graphs with a checkpointer
(InMemorySaver) and LangChain's GenericFakeChatModel, against the real sim provider on
loopback and a real ledger file: interrupts, resumes, and nodes that run again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from frameworks import configure, events, status, until
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

from settled.integrations import langchain as settled_lc
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_incidental

THREAD = {"configurable": {"thread_id": "t-1"}}


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, sim: SimServer) -> Iterator[None]:
    configure(tmp_path, sim)
    yield


def ask(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])


def agent_graph(decide: Callable[[list[BaseMessage]], AIMessage]) -> Any:
    """The usual agent loop: a model node and a ToolNode, checkpointed."""
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [decide(state["messages"])]})
    graph.add_node("tools", ToolNode(settled_lc.tools()))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def fake(*messages: AIMessage) -> Callable[[list[BaseMessage]], AIMessage]:
    model = GenericFakeChatModel(messages=iter(messages))
    return model.invoke  # type: ignore[return-value]


def read(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def polling(
    first: AIMessage, aid: str, turns: int = 300
) -> Callable[[list[BaseMessage]], AIMessage]:
    count = [0]

    def decide(history: list[BaseMessage]) -> AIMessage:
        count[0] += 1
        last = history[-1]
        if count[0] == 1:
            return first
        if isinstance(last, ToolMessage) and str(last.content).startswith("accepted"):
            if count[0] < turns:
                until(lambda: False, 0.02)  # a model's turn takes a while
                return ask("check_action", {"action_id": aid}, f"k{count[0]}")
        return AIMessage(str(last.content).split(":")[0])

    return decide


def test_late_delivery_is_accepted_then_success(sim: SimServer) -> None:
    sim.plan("receipt-1", "lag:0.4")
    first = ask("sim_send", {"params": {"order_id": 1, "to": "a@x.org"}}, "c1")
    app = agent_graph(polling(first, "receipt-1"))
    out = app.invoke({"messages": [HumanMessage("send it")]}, {**THREAD, "recursion_limit": 1000})
    msgs = read(out)
    assert str(msgs[0].content).startswith("accepted: sim.send receipt-1")
    assert msgs[0].artifact["status"] == "accepted"  # the five fields, as the artifact
    assert str(msgs[-1].content).startswith("success") and msgs[-1].artifact["status"] == "success"
    assert len(sim.requests_for("receipt-1")) == 1


def test_a_lost_mail_is_never_success(sim: SimServer) -> None:
    sim.plan("receipt-2", "lost_after_accept")
    first = ask("sim_send", {"params": {"order_id": 2, "to": "a@x.org"}}, "c1")
    app = agent_graph(polling(first, "receipt-2"))
    out = app.invoke({"messages": [HumanMessage("send it")]}, {**THREAD, "recursion_limit": 1000})
    statuses = [m.artifact["status"] for m in read(out)]
    assert statuses[0] == "accepted" and statuses[-1] == "uncertain"
    assert "success" not in statuses


def test_approve_through_an_interrupt_sends_once(sim: SimServer) -> None:
    app = agent_graph(fake(ask("sim_book", {"params": {"slot": "9"}}, "c1"), AIMessage("booked")))
    paused = app.invoke({"messages": [HumanMessage("book 9")]}, THREAD)
    (stop,) = paused["__interrupt__"]
    assert stop.value["action_id"] == "slot-9" and stop.value["tier"] == "full"
    assert stop.value["params"] == {"slot": "9"} and len(stop.value["params_hash"]) == 64
    assert status("slot-9") == "PENDING" and sim.requests_for("slot-9") == []
    out = app.invoke(Command(resume=True), THREAD)
    (msg,) = read(out)
    assert str(msg.content).startswith("success: sim.book slot-9 — confirmed and sent once")
    assert len(sim.requests_for("slot-9")) == 1


@pytest.mark.parametrize("answer", [False, {"approved": False}, "yes please"])
def test_a_rejected_resume_records_the_refusal_and_sends_nothing(
    sim: SimServer, answer: Any
) -> None:
    app = agent_graph(
        fake(ask("sim_book", {"params": {"slot": "10"}}, "c1"), AIMessage("not booked"))
    )
    app.invoke({"messages": [HumanMessage("book 10")]}, THREAD)
    out = app.invoke(Command(resume=answer), THREAD)
    (msg,) = read(out)
    assert "the person declined (LangGraph resume): nothing was sent" in str(msg.content)
    assert sim.requests_for("slot-10") == [] and status("slot-10") == "PENDING"
    notes = [e for e in events("slot-10") if e.kind == "note"]
    assert len(notes) == 1 and notes[0].detail["approval"] == "not given"


def test_an_answer_about_other_params_sends_nothing(sim: SimServer) -> None:
    app = agent_graph(fake(ask("sim_book", {"params": {"slot": "11"}}, "c1"), AIMessage("x")))
    app.invoke({"messages": [HumanMessage("book 11")]}, THREAD)
    out = app.invoke(Command(resume={"approved": True, "params_hash": "0" * 64}), THREAD)
    (msg,) = read(out)
    assert msg.artifact["settled_status"] == "PENDING" and sim.requests_for("slot-11") == []


def test_a_node_that_runs_again_sends_nothing_twice(sim: SimServer) -> None:
    """A node re-runs from the top after every resume: the tool inside it is called
    again each time, and the action is sent once."""
    book = {t.name: t for t in settled_lc.tools()}["sim_book"]
    runs: list[str] = []

    def node(state: MessagesState) -> dict[str, Any]:
        result = book.invoke({"params": {"slot": "12"}})  # asks, then sends once approved
        runs.append(str(result).split(":")[0])
        note = interrupt({"question": "anything else?"})  # a second pause, after the send
        return {"messages": [AIMessage(f"{result} / {note}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("work", node)
    graph.add_edge(START, "work")
    graph.add_edge("work", END)
    app = graph.compile(checkpointer=InMemorySaver())
    first = app.invoke({"messages": [HumanMessage("book 12")]}, THREAD)
    assert first["__interrupt__"][0].value["action_id"] == "slot-12"
    second = app.invoke(Command(resume=True), THREAD)  # approved: sent, then the next pause
    assert second["__interrupt__"][0].value == {"question": "anything else?"}
    assert len(sim.requests_for("slot-12")) == 1
    third = app.invoke(Command(resume="no"), THREAD)  # the node runs a third time
    assert str(third["messages"][-1].content).startswith("success: sim.book slot-12")
    assert runs == ["success", "success"] and len(sim.requests_for("slot-12")) == 1


def test_a_5xx_after_the_send_is_not_nothing_sent(sim: SimServer) -> None:
    sim.plan("receipt-4", "5xx_after")
    app = agent_graph(
        fake(ask("sim_send", {"params": {"order_id": 4, "to": "a@x.org"}}, "c1"), AIMessage("k"))
    )
    out = app.invoke({"messages": [HumanMessage("send")]}, THREAD)
    (msg,) = read(out)
    assert msg.status != "error" and msg.artifact["status"] in ("uncertain", "accepted")
    assert str(msg.content).startswith(msg.artifact["status"])
    assert len(sim.requests_for("receipt-4")) == 1


def test_errors_go_back_to_the_model_as_one_line(sim: SimServer) -> None:
    app = agent_graph(fake(ask("sim_send", {"params": {"to": "x"}}, "c1"), AIMessage("k")))
    out = app.invoke({"messages": [HumanMessage("send")]}, THREAD)
    (msg,) = read(out)
    assert str(msg.content).startswith("error: params need 'order_id'")
    assert "nothing was sent" in str(msg.content)


def test_outside_a_graph_a_confirmation_waits_for_settled_confirm(sim: SimServer) -> None:
    book = {t.name: t for t in settled_lc.tools()}["sim_book"]
    text = book.invoke({"params": {"slot": "13"}})
    assert str(text).startswith("accepted: sim.book slot-13 — awaiting a person's confirmation")
    assert sim.requests_for("slot-13") == []
