"""python -m bench agents: one scripted agent transcript through each framework, once
with that framework's plain tool (a function that POSTs to the provider, written as
its docs show) and once with settled's, against the sim provider on loopback.

The transcript, for every framework and both tools (one intent per step):

    late      the provider accepts, the effect shows 0.3 s later
    lost      the provider accepts and loses it
    timeout   the provider applies it, the reply times out; the model retries (new call id)
    5xx       the provider applies it, then answers 500; the model retries (new call id)
    resume    it is sent; the run dies before it keeps the result; the resumed run calls again
    approval  a person approves a booking; the approved run is resumed twice from the
              same saved state (a retried job)

Counted at the provider: intents delivered more than once (duplicates), and times the
model was told "done" while the effect was not observable there (false done). A
plain tool says done on any 2xx and reports errors so the model retries; settled's
tool says success only when observed. The figures go in docs/agents.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from settled.providers.sim_server import SimServer

STEPS = ("late", "lost", "timeout", "5xx", "resume", "approval")
FAULTS = {
    "late": "lag:0.3",
    "lost": "lost_after_accept",
    "timeout": "timeout_after_apply",
    "5xx": "5xx_after",
}
TIMEOUT = 0.3  # s the tools wait for a reply; the sim hangs 0.6 s on a timeout fault
POLLS = 150  # check_action calls a model makes at most while a result is 'accepted'
RETRIED = ("timeout", "5xx")  # steps where a model retries what did not read as done


@dataclass
class Tally:
    told: list[str] = field(default_factory=list)  # what the model read, by step
    false_done: list[str] = field(default_factory=list)


class Plain:
    """A naive tool body: POST the params once per call, an id per call, no ledger."""

    def __init__(self, sim: SimServer) -> None:
        self.sim = sim
        self.client = httpx.Client(timeout=TIMEOUT)
        self.calls: dict[str, int] = {}
        self.step = ""

    def post(self, op: str, params: dict[str, Any]) -> str:
        n = self.calls[self.step] = self.calls.get(self.step, 0) + 1
        aid = f"{self.step}#{n}"
        body = {"action_id": aid, "reconciliation_key": aid, "params": params}
        reply = self.client.post(f"{self.sim.url}/v1/{op}", json=body)
        reply.raise_for_status()  # an error the framework shows the model
        return f"done: {op} sent (HTTP {reply.status_code}) as {aid}"


# ------------------------------------------------------------------ the frameworks


class Framework(ABC):
    """One framework: a turn through its own machinery, and its approval flow."""

    name = ""

    def __init__(self, plain: Plain | None, opts: dict[str, str]) -> None:
        self.plain = plain  # None: settled's tools
        self.opts = opts  # settled's: config and db

    @abstractmethod
    def turn(self, tool: str, args: dict[str, Any], call_id: str) -> str: ...

    @abstractmethod
    def approve_and_resume_twice(self, args: dict[str, Any]) -> list[str]: ...

    # the input each kind of tool takes
    def send_args(self, order: str) -> tuple[str, dict[str, Any]]:
        params = {"order_id": order, "to": "ann@example.com"}
        return ("send_receipt", params) if self.plain else ("sim_send", {"params": params})

    def book_args(self, slot: str) -> dict[str, Any]:
        return {"slot": slot} if self.plain else {"params": {"slot": slot}}


class OpenAIAgents(Framework):
    name = "OpenAI Agents SDK"

    def tools(self) -> list[Any]:
        from agents import RunContextWrapper, function_tool

        from settled.integrations import openai_agents

        if self.plain is None:
            return openai_agents.tools(**self.opts)
        plain = self.plain

        @function_tool
        def send_receipt(order_id: str, to: str) -> str:
            """Send the receipt for an order."""
            return plain.post("send", {"order_id": order_id, "to": to})

        async def always(ctx: RunContextWrapper[Any], params: dict[str, Any], cid: str) -> bool:
            return True

        @function_tool(needs_approval=always)
        def book_slot(slot: str) -> str:
            """Book a slot."""
            return plain.post("book", {"slot": slot})

        return [send_receipt, book_slot]

    def agent(self, steps: list[Any]) -> Any:
        from agents import Agent
        from agents.testing import ScriptedModel

        return Agent(name="ops", model=ScriptedModel(steps), tools=self.tools())

    def turn(self, tool: str, args: dict[str, Any], call_id: str) -> str:
        from agents import Runner
        from agents.testing import assistant_message, function_call

        agent = self.agent(
            [[function_call(tool, args, call_id=call_id)], [assistant_message("ok")]]
        )
        result = asyncio.run(Runner.run(agent, "go"))
        return next(str(i.output) for i in result.new_items if hasattr(i, "output"))

    def approve_and_resume_twice(self, args: dict[str, Any]) -> list[str]:
        from agents import Runner, RunState
        from agents.testing import assistant_message, function_call

        tool = "book_slot" if self.plain else "sim_book"
        agent = self.agent([[function_call(tool, args, call_id="b1")], [assistant_message("ok")]])
        first = asyncio.run(Runner.run(agent, "book"))
        state = first.to_state()
        for item in first.interruptions:
            state.approve(item)
        saved = state.to_string()
        told = []
        for _ in range(2):  # the job that resumes it is retried
            again = self.agent([[assistant_message("ok")]])
            resumed = asyncio.run(RunState.from_string(again, saved))
            result = asyncio.run(Runner.run(again, resumed))
            told += [str(i.output) for i in result.new_items if hasattr(i, "output")]
        return told


class PydanticAI(Framework):
    name = "PydanticAI"

    def toolset(self) -> Any:
        from pydantic_ai import ModelRetry
        from pydantic_ai.toolsets import FunctionToolset

        from settled.integrations import pydantic_ai

        if self.plain is None:
            return pydantic_ai.toolset(**self.opts)
        plain = self.plain
        tools = FunctionToolset()

        @tools.tool_plain
        def send_receipt(order_id: str, to: str) -> str:
            """Send the receipt for an order."""
            try:
                return plain.post("send", {"order_id": order_id, "to": to})
            except httpx.HTTPError as exc:
                raise ModelRetry(f"send failed: {exc}") from None

        @tools.tool_plain(requires_approval=True)
        def book_slot(slot: str) -> str:
            """Book a slot."""
            return plain.post("book", {"slot": slot})

        return tools

    def agent(self, tool: str, args: dict[str, Any], call_id: str) -> Any:
        from pydantic_ai import Agent, DeferredToolRequests
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel

        asked = [False]

        def model(messages: Any, info: Any) -> ModelResponse:
            if asked[0]:
                return ModelResponse(parts=[TextPart("ok")])
            asked[0] = True
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=call_id)])

        return Agent(
            FunctionModel(model),
            toolsets=[self.toolset()],
            output_type=[str, DeferredToolRequests],
            retries=2,  # a ModelRetry goes back to the model, as a plain tool means it
        )

    @staticmethod
    def returned(messages: Any) -> list[str]:
        from pydantic_ai.messages import ModelRequest, RetryPromptPart, ToolReturnPart

        out = []
        for m in messages:
            if isinstance(m, ModelRequest):
                for p in m.parts:
                    if isinstance(p, ToolReturnPart):
                        out.append(str(p.content))
                    elif isinstance(p, RetryPromptPart):
                        out.append(f"error: {p.content}")
        return out

    def turn(self, tool: str, args: dict[str, Any], call_id: str) -> str:
        result = self.agent(tool, args, call_id).run_sync("go")
        return self.returned(result.all_messages())[-1]

    def approve_and_resume_twice(self, args: dict[str, Any]) -> list[str]:
        tool = "book_slot" if self.plain else "sim_book"
        agent = self.agent(tool, args, "b1")
        first = agent.run_sync("book")
        answers = first.output.build_results(approve_all=True)
        told = []
        for _ in range(2):  # the job that resumes it is retried
            again = agent.run_sync(
                message_history=first.all_messages(), deferred_tool_results=answers
            )
            told += self.returned(again.new_messages())
        return told


class LangGraph(Framework):
    name = "LangGraph"

    def tools(self) -> list[Any]:
        from langchain_core.tools import StructuredTool, ToolException
        from langgraph.types import interrupt

        from settled.integrations import langchain

        if self.plain is None:
            return langchain.tools(**self.opts)
        plain = self.plain

        def send_receipt(order_id: str, to: str) -> str:
            """Send the receipt for an order."""
            try:
                return plain.post("send", {"order_id": order_id, "to": to})
            except httpx.HTTPError as exc:
                raise ToolException(f"send failed: {exc}") from None

        def book_slot(slot: str) -> str:
            """Book a slot, once a person approves."""
            if interrupt({"book": slot}) is not True:
                return "not approved"
            return plain.post("book", {"slot": slot})

        return [
            StructuredTool.from_function(send_receipt, handle_tool_error=True),
            StructuredTool.from_function(book_slot),
        ]

    def graph(self, tool: str, args: dict[str, Any], call_id: str) -> Any:
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        from langchain_core.messages import AIMessage
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        model = GenericFakeChatModel(
            messages=iter(
                [AIMessage("", tool_calls=[{"name": tool, "args": args, "id": call_id}])]
                + [AIMessage("ok")] * 4
            )
        )
        g = StateGraph(MessagesState)
        g.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        g.add_node("tools", ToolNode(self.tools()))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        return g.compile(checkpointer=InMemorySaver())

    def turn(self, tool: str, args: dict[str, Any], call_id: str) -> str:
        from langchain_core.messages import HumanMessage, ToolMessage

        app = self.graph(tool, args, call_id)
        out = app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}})
        return str([m for m in out["messages"] if isinstance(m, ToolMessage)][-1].content)

    def approve_and_resume_twice(self, args: dict[str, Any]) -> list[str]:
        from langchain_core.messages import HumanMessage, ToolMessage
        from langgraph.types import Command

        tool = "book_slot" if self.plain else "sim_book"
        app = self.graph(tool, args, "b1")
        thread = {"configurable": {"thread_id": "t"}}
        app.invoke({"messages": [HumanMessage("book")]}, thread)
        paused = app.get_state(thread).config  # the checkpoint both resumes start from
        told = []
        for _ in range(2):  # the job that resumes it is retried
            out = app.invoke(Command(resume=True), paused)
            told += [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
        return told


class ClaudeAgentSDK(Framework):
    name = "Claude Agent SDK"

    def server(self) -> Any:
        from claude_agent_sdk import create_sdk_mcp_server, tool

        from settled.integrations import claude_agent_sdk

        if self.plain is None:
            return claude_agent_sdk.server(**self.opts)["instance"]
        plain = self.plain

        async def post(op: str, params: dict[str, Any]) -> dict[str, Any]:
            try:
                done = await asyncio.to_thread(plain.post, op, params)
            except httpx.HTTPError as exc:
                return {"content": [{"type": "text", "text": f"error: {exc}"}], "is_error": True}
            return {"content": [{"type": "text", "text": done}]}

        @tool("send_receipt", "Send the receipt for an order", {"order_id": str, "to": str})
        async def send_receipt(args: dict[str, Any]) -> dict[str, Any]:
            return await post("send", args)

        @tool("book_slot", "Book a slot", {"slot": str})
        async def book_slot(args: dict[str, Any]) -> dict[str, Any]:
            return await post("book", args)

        return create_sdk_mcp_server("plain", tools=[send_receipt, book_slot])["instance"]

    def call(self, calls: list[tuple[str, dict[str, Any]]], hook: bool = False) -> list[str]:
        from mcp import Client

        from settled.integrations import claude_agent_sdk

        async def go() -> list[str]:
            out = []
            pre = claude_agent_sdk.hooks(**self.opts)["PreToolUse"][0].hooks[0]
            async with Client(self.server()) as client:
                for name, args in calls:
                    if hook and self.plain is None:  # settled's hook asks; the person allows
                        data = {"tool_name": f"mcp__settled__{name}", "tool_input": args}
                        await pre(data, "u", None)  # type: ignore[arg-type]
                    res = await client.call_tool(name, args)
                    out.append(str(res.content[0].text))  # type: ignore[union-attr]
            return out

        return asyncio.run(go())

    def turn(self, tool: str, args: dict[str, Any], call_id: str) -> str:
        return self.call([(tool, args)])[0]

    def approve_and_resume_twice(self, args: dict[str, Any]) -> list[str]:
        tool = "book_slot" if self.plain else "sim_book"
        # Claude Code asks (the hook), the person allows; the resumed session calls again.
        return self.call([(tool, args), (tool, args)], hook=True)


FRAMEWORKS: tuple[type[Framework], ...] = (OpenAIAgents, PydanticAI, LangGraph, ClaudeAgentSDK)


# ------------------------------------------------------------------ the transcript


def release_event_loop() -> None:
    """Close the loop PydanticAI's ``run_sync`` leaves current in this thread (it never
    closes it; the next ``asyncio.run`` would drop it unclosed)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    asyncio.set_event_loop(None)


def done(text: str, plain: bool) -> bool:
    return text.startswith("done:") if plain else text.startswith("success")


def transcript(fw: Framework, sim: SimServer, observed: Callable[[str], bool]) -> Tally:
    """Run the steps; each 'done' the model reads is checked against the provider."""
    tally = Tally()
    plain = fw.plain is not None

    def told(step: str, text: str) -> None:
        tally.told.append(f"{step}: {text[:70]}")
        if done(text, plain) and not observed(step):
            tally.false_done.append(step)

    for step in STEPS:
        if fw.plain is not None:
            fw.plain.step = step
        if step in FAULTS:
            sim.plan(f"{step}#1" if plain else f"receipt-{step}", FAULTS[step])
        if step == "approval":
            for text in fw.approve_and_resume_twice(fw.book_args(step)):
                told(step, text)
            continue
        tool, args = fw.send_args(step)
        text = fw.turn(tool, args, f"{step}-c1")
        told(step, text)
        if step == "resume" or (step in RETRIED and not done(text, plain)):
            # a retry (or the resumed run) under a new call id, the same business args
            text = fw.turn(tool, args, f"{step}-c2")
            told(step, text)
        polls = 0
        while not plain and text.startswith("accepted") and polls < POLLS:
            polls += 1
            time.sleep(0.02)  # a model's turn takes a while
            text = fw.turn("check_action", {"action_id": f"receipt-{step}"}, f"{step}-k{polls}")
            if not text.startswith("accepted"):
                told(step, text)
    return tally


def effects_by_step(sim: SimServer) -> dict[str, int]:
    out = dict.fromkeys(STEPS, 0)
    for aid, n in sim.truth()["effects"].items():
        step = aid.split("#")[0] if "#" in aid else aid.split("-", 1)[1]
        out[step] = out.get(step, 0) + n
    return out


def run_one(cls: type[Framework], plain: bool, tmp: Path) -> dict[str, Any]:
    with SimServer(hang=2 * TIMEOUT) as sim:
        db = tmp / f"{cls.__name__}-{plain}.db"
        conf = tmp / f"{cls.__name__}-{plain}.toml"
        conf.write_text(
            "[providers.sim]\n"
            f'type = "sim"\nbase_url = "{sim.url}"\ntimeout = {TIMEOUT}\nconsistency_window = 0\n'
            "verify = { interval = 0.05, deadline = 2, min_checks = 3 }\n"
            '[providers.sim.operations.send]\naction_key = "receipt-{order_id}"\n'
            '[providers.sim.operations.book]\naction_key = "slot-{slot}"\napproval = "client"\n'
        )
        fw = cls(Plain(sim) if plain else None, {"config": str(conf), "db": str(db)})

        def observed(step: str) -> bool:
            key = f"{step}#{(fw.plain.calls.get(step, 1)) if fw.plain else 1}"
            if fw.plain is None:
                from settled import Ledger

                with Ledger.open(str(db)) as led:
                    rec = led.find(f"{'slot' if step == 'approval' else 'receipt'}-{step}")
                key = rec.reconciliation_key if rec and rec.reconciliation_key else ""
            return bool(key) and sim.effect_view(key) is not None

        started = time.perf_counter()
        try:
            tally = transcript(fw, sim, observed)
        finally:
            if fw.plain is not None:
                fw.plain.client.close()
            release_event_loop()
        effects = effects_by_step(sim)
        return {
            "framework": cls.name,
            "tool": "plain" if plain else "settled",
            "duplicates": sorted(s for s, n in effects.items() if n > 1),
            "false_done": sorted(set(tally.false_done)),
            "sends": sum(effects.values()),
            "seconds": round(time.perf_counter() - started, 1),
            "told": tally.told,
        }


def main(argv: list[str] | None = None) -> int:
    import argparse

    from agents import set_tracing_disabled

    parser = argparse.ArgumentParser(
        prog="python -m bench agents", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    parser.add_argument("-v", "--verbose", action="store_true", help="what the model read")
    args = parser.parse_args(argv)
    set_tracing_disabled(True)  # nothing leaves this machine
    rows = []
    with tempfile.TemporaryDirectory(prefix="settled-bench-agents-") as tmp:
        for cls in FRAMEWORKS:
            for plain in (True, False):
                row = run_one(cls, plain, Path(tmp))
                rows.append(row)
                if args.json:
                    print(json.dumps({k: v for k, v in row.items() if k != "told"}), flush=True)
                if args.verbose:
                    for line in row["told"]:
                        print(f"  {row['framework']} / {row['tool']}: {line}", file=sys.stderr)
    if not args.json:
        head = f"{'framework':<19} {'tool':<8} {'duplicates':>10} {'false done':>10} {'sends':>6}  steps"
        print(head)
        print("-" * len(head))
        for r in rows:
            which = ", ".join(sorted(set(r["duplicates"]) | set(r["false_done"]))) or "-"
            print(
                f"{r['framework']:<19} {r['tool']:<8} {len(r['duplicates']):>10} "
                f"{len(r['false_done']):>10} {r['sends']:>6}  {which}"
            )
        print(f"\nsteps: {', '.join(STEPS)}; {len(STEPS)} intents per run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
