"""settled for the Claude Agent SDK (extra ``claude_agent_sdk``; docs/integrations/claude-agent-sdk.md)::

    from claude_agent_sdk import ClaudeAgentOptions
    from settled.integrations import claude_agent_sdk as settled_claude

    options = ClaudeAgentOptions(
        mcp_servers={"settled": settled_claude.server()},
        hooks=settled_claude.hooks(),
    )

``server(**opts)`` is an in-process SDK MCP server (``create_sdk_mcp_server``) with one
tool per configured operation, ``{provider}_{operation}`` (Claude sees
``mcp__settled__{provider}_{operation}``), plus ``check_action``. A result is one text
block that starts with ``success``, ``accepted``, ``uncertain`` or ``failed``; an
``is_error`` result means nothing was sent.

``hooks(**opts)`` is a PreToolUse hook on those tools. For an operation that needs a
person's confirmation it records the action (nothing sent) and answers ``ask``:
Claude Code asks the person, and only a call the hook asked about, with the very
params it recorded, is sent, once; a call it never asked about waits for ``settled
confirm`` (fail closed). For an intent that is already recorded past ``PENDING`` it
answers ``deny``, with the record's status as the reason: a second send of a settled
intent never reaches the tool. Otherwise it gives no opinion. An operation declaring
``approval = "person"`` is never sent on Claude Code's approval: only ``settled
confirm``, the API or the console sends it.

The hook and the server share, in this process, what the hook asked about (each entry
used once, for at most ``ASK_TTL`` seconds).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..errors import SettledError
from ..toolbox import Operation, ToolResult
from . import framework
from ._kit import CHECK_ACTION, CHECK_DESCRIPTION, CHECK_SCHEMA, Kit, Pending, error_text

framework("claude_agent_sdk", "claude_agent_sdk")  # MissingExtra, naming the install, first
from claude_agent_sdk import (  # noqa: E402
    HookMatcher,
    McpSdkServerConfig,
    SdkMcpTool,
    ToolAnnotations,
    create_sdk_mcp_server,
)

SERVER = "settled"  # the server's name in ClaudeAgentOptions.mcp_servers
ASK_TTL = 600.0  # s an ask stays good for the call that follows it


class _Asked:
    """What the hook asked a person about: (action id, params hash) -> when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[tuple[str, str], float] = {}

    def add(self, action_id: str, params_hash: str) -> None:
        with self._lock:
            self._asked[(action_id, params_hash)] = time.monotonic()

    def take(self, action_id: str, params_hash: str) -> bool:
        with self._lock:
            at = self._asked.pop((action_id, params_hash), None)
        return at is not None and time.monotonic() - at <= ASK_TTL


ASKED = _Asked()


def server(
    *,
    config: str | None = None,
    db: str | None = None,
    operations: Iterable[str] | None = None,
    wait: float = 0.0,
) -> McpSdkServerConfig:
    """The configured operations (``operations``: some, as ``"mail.send"``), plus
    ``check_action``, as an in-process SDK MCP server named ``settled``."""
    kit = Kit(config=config, db=db, operations=operations, wait=wait, actor="claude_agent_sdk")
    tools = [_tool(kit, op) for op in kit.ops.values()]
    tools.append(
        SdkMcpTool(
            name=CHECK_ACTION,
            description=CHECK_DESCRIPTION,
            input_schema=CHECK_SCHEMA,
            handler=_handler(kit.check),
            annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False),
        )
    )
    return create_sdk_mcp_server(SERVER, tools=tools)


def _tool(kit: Kit, op: Operation) -> SdkMcpTool[Any]:
    def run(args: Any) -> ToolResult:
        if not kit.needs_asking(op):
            return kit.send(op, args)
        rec = kit.existing(op, args)
        if rec is not None and ASKED.take(rec.action_id, rec.params_hash):
            answer = kit.approved(op, args, shown=rec.params_hash, by="claude-permission")
        else:
            answer = kit.ask(op, args)  # never asked by the hook: it waits (fail closed)
        return answer.result if isinstance(answer, Pending) else answer

    return SdkMcpTool(
        name=op.name,
        description=op.description(),
        input_schema=op.input_schema(),
        handler=_handler(run),
        annotations=ToolAnnotations(
            title=op.title,
            readOnlyHint=False,
            destructiveHint=op.destructive,
            idempotentHint=True,
            openWorldHint=True,
        ),
    )


def _handler(run: Callable[[Any], ToolResult]) -> Callable[[Any], Awaitable[dict[str, Any]]]:
    async def handle(args: Any) -> dict[str, Any]:
        try:
            result = await asyncio.to_thread(run, args)
        except SettledError as exc:
            return {"content": [{"type": "text", "text": error_text(exc)}], "is_error": True}
        return {"content": [{"type": "text", "text": result.text}]}

    return handle


def hooks(
    *,
    config: str | None = None,
    db: str | None = None,
    operations: Iterable[str] | None = None,
    wait: float = 0.0,
) -> dict[str, list[HookMatcher]]:
    """``ClaudeAgentOptions.hooks``: one PreToolUse matcher on settled's tools."""
    kit = Kit(config=config, db=db, operations=operations, wait=wait, actor="claude_agent_sdk")
    prefix = f"mcp__{SERVER}__"

    async def pre_tool_use(data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        name = str(data.get("tool_name", ""))
        op = kit.ops.get(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if op is None:
            return {}
        try:
            return await asyncio.to_thread(_decide, kit, op, data.get("tool_input") or {})
        except SettledError:
            return {}  # the tool refuses the call itself, with its reason

    matcher = HookMatcher(matcher=f"^{prefix}.*", hooks=[pre_tool_use])  # type: ignore[list-item]
    return {"PreToolUse": [matcher]}


def _decide(kit: Kit, op: Operation, args: Any) -> dict[str, Any]:
    rec = kit.existing(op, args)
    if rec is not None and str(rec.status) != "PENDING":
        again = kit.toolbox.submit(op, rec.action_id, rec.params).result  # sends nothing
        return _decision(
            "deny", f"this intent is already recorded; nothing is sent again: {again.text}"
        )
    if not kit.needs_asking(op):
        return {}
    asked = kit.ask(op, args)
    if not isinstance(asked, Pending):
        return _decision("deny", asked.text)
    ASKED.add(asked.action_id, asked.params_hash)
    return _decision("ask", asked.question)


def _decision(decision: str, reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
    }


__all__ = ["ASKED", "hooks", "server"]
