"""settled's tools for the OpenAI Agents SDK (extra ``openai_agents``; docs/integrations/openai-agents.md)::

    from agents import Agent, Runner
    from settled.integrations import openai_agents as settled_agents

    agent = Agent(name="ops", tools=settled_agents.tools())

Each configured operation is one ``FunctionTool``, ``{provider}_{operation}``, with the
input ``settled mcp`` gives it, plus ``check_action``. Its output is the one line a
model reads, starting with ``success``, ``accepted``, ``uncertain`` or ``failed``.

An operation that needs a person's confirmation has ``needs_approval`` set: before
the run is interrupted the action is recorded (nothing sent), and only a call that
would send asks (a repeated intent already sent returns its record without asking).
Approve or reject through the SDK's ``RunState`` (``state.approve(item)``,
``state.reject(item)``); an approved call sends once, bound to the params recorded; a
rejected one sends nothing, and its record waits, ``PENDING``, for ``settled confirm``.
An operation declaring ``approval = "person"`` never asks the run: only ``settled
confirm``, the API or the console sends it. Errors raised before anything was sent are
returned to the model as one line starting with ``error:``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..errors import SettledError
from ..toolbox import Operation
from . import framework
from ._kit import CHECK_ACTION, CHECK_DESCRIPTION, CHECK_SCHEMA, Kit, Pending, error_text

framework("agents", "openai_agents")  # MissingExtra, naming the install, first
from agents import FunctionTool, RunContextWrapper  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402


def tools(
    *,
    config: str | None = None,
    db: str | None = None,
    operations: Iterable[str] | None = None,
    wait: float = 0.0,
) -> list[FunctionTool]:
    """The configured operations (``operations``: some, as ``"mail.send"``), plus
    ``check_action``, as ``FunctionTool`` objects; ``wait`` seconds of verification
    follow a call that sent."""
    kit = Kit(config=config, db=db, operations=operations, wait=wait, actor="openai_agents")
    out = [_tool(kit, op) for op in kit.ops.values()]
    out.append(
        FunctionTool(
            name=CHECK_ACTION,
            description=CHECK_DESCRIPTION,
            params_json_schema=CHECK_SCHEMA,
            on_invoke_tool=_invoke(kit.check),
            strict_json_schema=False,
        )
    )
    return out


def _tool(kit: Kit, op: Operation) -> FunctionTool:
    def run(args: Any) -> Any:
        if kit.needs_asking(op):  # invoked after the run's approval (or with nothing to ask)
            answer = kit.approved(op, args, by="openai_agents-approval")
            return answer.result if isinstance(answer, Pending) else answer
        return kit.send(op, args)

    needs_approval: bool | Callable[..., Awaitable[bool]] = False
    if kit.needs_asking(op):

        async def asks(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            try:
                answer = await asyncio.to_thread(kit.ask, op, params)
            except SettledError:
                return False  # the call is refused with its reason, nothing sent
            return isinstance(answer, Pending)

        needs_approval = asks
    return FunctionTool(
        name=op.name,
        description=op.description(),
        params_json_schema=op.input_schema(),
        on_invoke_tool=_invoke(run),
        strict_json_schema=False,  # params follow the operation's own schema
        needs_approval=needs_approval,
    )


def _invoke(run: Callable[[Any], Any]) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        try:
            args = json.loads(raw) if raw else {}
            result = await asyncio.to_thread(run, args)
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not JSON ({exc.msg}); nothing was sent"
        except SettledError as exc:
            return error_text(exc)
        return str(result.text)

    return invoke


__all__ = ["tools"]
