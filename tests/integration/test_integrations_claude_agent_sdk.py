"""settled's in-process SDK MCP server and PreToolUse hook for the Claude Agent SDK,
called directly (the server the SDK builds, through an MCP client in-process, and the
hook callback the SDK would call), without the Claude Code CLI, against the real sim
provider on loopback and a real ledger file."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from frameworks import configure, status, until
from mcp import Client

from settled.integrations import claude_agent_sdk as settled_claude
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_incidental

Hook = Callable[[dict[str, Any], str | None, Any], Awaitable[dict[str, Any]]]


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, sim: SimServer) -> Iterator[None]:
    configure(tmp_path, sim)
    yield


def session(steps: Callable[[Client, Hook], Awaitable[Any]]) -> Any:
    """``steps(client, hook)`` against a fresh server and hook, bounded in time."""

    async def go() -> Any:
        with anyio.fail_after(30):
            config = settled_claude.server()
            (matcher,) = settled_claude.hooks()["PreToolUse"]
            assert matcher.matcher == "^mcp__settled__.*"
            async with Client(config["instance"]) as client:
                return await steps(client, matcher.hooks[0])

    return anyio.run(go)


def pre(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "hook_event_name": "PreToolUse",
        "tool_name": f"mcp__settled__{tool}",
        "tool_input": args,
        "tool_use_id": "u-1",
        "session_id": "s",
        "transcript_path": "/dev/null",
        "cwd": ".",
    }


def decision(answer: dict[str, Any]) -> str | None:
    return answer.get("hookSpecificOutput", {}).get("permissionDecision")


def text(result: Any) -> str:
    return str(result.content[0].text)


def test_ask_then_the_allowed_call_sends_once_and_a_second_send_is_denied(
    sim: SimServer,
) -> None:
    args = {"params": {"slot": "9"}}

    async def steps(client: Client, hook: Hook) -> tuple[Any, ...]:
        asked = await hook(pre("sim_book", args), "u-1", None)
        pending = status("slot-9")
        sent = await client.call_tool("sim_book", args)  # Claude Code: the person allowed it
        again = await hook(pre("sim_book", args), "u-2", None)
        return asked, pending, sent, again

    asked, pending, sent, again = session(steps)
    assert decision(asked) == "ask" and pending == "PENDING"
    reason = asked["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == 'Send sim.book once, as action slot-9? Params: {"slot": "9"}'
    assert text(sent).startswith("success: sim.book slot-9 — confirmed and sent once")
    assert decision(again) == "deny"
    assert "nothing is sent again" in again["hookSpecificOutput"]["permissionDecisionReason"]
    assert len(sim.requests_for("slot-9")) == 1


def test_a_call_the_hook_never_asked_about_waits(sim: SimServer) -> None:
    async def steps(client: Client, hook: Hook) -> Any:
        return await client.call_tool("sim_book", {"params": {"slot": "10"}})

    res = session(steps)
    assert text(res).startswith("accepted: sim.book slot-10 — awaiting a person's confirmation")
    assert sim.requests_for("slot-10") == [] and status("slot-10") == "PENDING"


def test_an_ask_is_for_the_params_it_showed(sim: SimServer) -> None:
    async def steps(client: Client, hook: Hook) -> Any:
        await hook(pre("sim_book", {"params": {"slot": "11"}}), "u-1", None)
        return await client.call_tool("sim_book", {"params": {"slot": "12"}})

    res = session(steps)
    assert "awaiting a person's confirmation" in text(res)
    assert sim.requests_for("slot-11") == sim.requests_for("slot-12") == []


def test_a_denied_call_sends_nothing(sim: SimServer) -> None:
    async def steps(client: Client, hook: Hook) -> Any:
        return await hook(pre("sim_book", {"params": {"slot": "13"}}), "u-1", None)

    assert decision(session(steps)) == "ask"  # the person says no: the tool is never called
    assert sim.requests_for("slot-13") == [] and status("slot-13") == "PENDING"


def test_a_person_only_approval_is_not_claude_codes(sim: SimServer) -> None:
    args = {"action_id": "d-1", "params": {"to": "x"}}

    async def steps(client: Client, hook: Hook) -> tuple[Any, Any]:
        return await hook(pre("sim_deliver", args), "u-1", None), await client.call_tool(
            "sim_deliver", args
        )

    answer, res = session(steps)
    assert answer == {} and "only a person can approve it" in text(res)
    assert sim.requests_for("d-1") == []


def test_late_delivery_is_accepted_then_success_and_a_replan_sends_once(sim: SimServer) -> None:
    sim.plan("receipt-1", "lag:0.4")
    args = {"params": {"order_id": 1, "to": "a@x.org"}}

    async def steps(client: Client, hook: Hook) -> tuple[str, str, list[str]]:
        first = text(await client.call_tool("sim_send", args))
        replanned = text(await client.call_tool("sim_send", args))
        seen = []
        for _ in range(300):
            now = text(await client.call_tool("check_action", {"action_id": "receipt-1"}))
            seen.append(now)
            if not now.startswith("accepted"):
                break
            await anyio.sleep(0.02)
        return first, replanned, seen

    first, replanned, seen = session(steps)
    assert first.startswith("accepted: sim.send receipt-1")
    assert "repeated intent: nothing sent again" in replanned
    assert seen[-1].startswith("success") and len(sim.requests_for("receipt-1")) == 1


def test_a_lost_mail_is_never_success(sim: SimServer) -> None:
    sim.plan("receipt-2", "lost_after_accept")

    async def steps(client: Client, hook: Hook) -> list[str]:
        seen = [text(await client.call_tool("sim_send", {"params": {"order_id": 2, "to": "a"}}))]
        for _ in range(300):
            seen.append(text(await client.call_tool("check_action", {"action_id": "receipt-2"})))
            if not seen[-1].startswith("accepted"):
                break
            await anyio.sleep(0.02)
        return seen

    seen = session(steps)
    assert seen[0].startswith("accepted") and seen[-1].startswith("uncertain")
    assert not any(s.startswith("success") for s in seen)


def test_a_5xx_after_the_send_is_not_nothing_sent(sim: SimServer) -> None:
    sim.plan("receipt-4", "5xx_after")

    async def steps(client: Client, hook: Hook) -> Any:
        return await client.call_tool("sim_send", {"params": {"order_id": 4, "to": "a"}})

    res = session(steps)
    assert not res.is_error and text(res).split(":")[0] in ("uncertain", "accepted")
    assert len(sim.requests_for("receipt-4")) == 1
    assert until(lambda: status("receipt-4") != "IN_FLIGHT")


def test_errors_are_is_error_results_that_sent_nothing(sim: SimServer) -> None:
    async def steps(client: Client, hook: Hook) -> Any:
        return await client.call_tool("sim_send", {"params": {"order_id": "", "to": "x"}})

    res = session(steps)
    assert res.is_error and text(res).startswith("error: param 'order_id' is empty")
    assert "nothing was sent" in text(res) and status("receipt-") == "missing"
