"""settled's tools as a PydanticAI toolset (extra ``pydantic_ai``; docs/integrations/pydantic-ai.md)::

    from pydantic_ai import Agent, DeferredToolRequests
    from settled.integrations import pydantic_ai as settled_ai

    agent = Agent(model, toolsets=[settled_ai.toolset()], output_type=[str, DeferredToolRequests])

Each configured operation is one tool, ``{provider}_{operation}``, whose typed
arguments are the operation's own (``{action_id, params}``, ``{params}`` where an
action key names the action), plus ``check_action``. A tool returns
``ToolReturn(return_value=<the status line>, metadata=<the five fields>)``: the model
reads the line, which starts with ``success``, ``accepted``, ``uncertain`` or
``failed``; the application reads the fields.

An operation that needs a person's confirmation raises ``ApprovalRequired`` (the
action is recorded first, nothing sent; its metadata is what the person is shown).
The run ends with ``DeferredToolRequests``; a new run with ``DeferredToolResults``
sends it once when approved (bound to the params shown: ``override_args`` that change
them are asked about anew), and sends nothing when denied. Errors raised before
anything was sent are ``ModelRetry`` (arguments the model can fix) or ``ToolFailed``;
once a request has left, the result is the record's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import InvalidInput, SettledError
from ..toolbox import Operation, ToolResult
from . import framework
from ._kit import CHECK_ACTION, CHECK_DESCRIPTION, CHECK_SCHEMA, Kit, Pending, error_text

framework("pydantic_ai", "pydantic_ai")  # MissingExtra, naming the install, first
from pydantic_ai import ApprovalRequired, ModelRetry, RunContext, Tool, ToolReturn  # noqa: E402
from pydantic_ai.exceptions import ToolFailed  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402


def toolset(
    *,
    config: str | None = None,
    db: str | None = None,
    operations: Iterable[str] | None = None,
    wait: float = 0.0,
) -> FunctionToolset[Any]:
    """The configured operations (``operations``: some, as ``"mail.send"``), plus
    ``check_action``, as one ``FunctionToolset``; ``wait`` seconds of verification
    follow a call that sent."""
    kit = Kit(config=config, db=db, operations=operations, wait=wait, actor="pydantic_ai")
    tools: list[Tool[Any]] = [
        Tool.from_schema(
            _operation(kit, op),
            name=op.name,
            description=op.description(),
            json_schema=op.input_schema(),
            takes_ctx=True,
        )
        for op in kit.ops.values()
    ]
    tools.append(
        Tool.from_schema(
            _check(kit),
            name=CHECK_ACTION,
            description=CHECK_DESCRIPTION,
            json_schema=CHECK_SCHEMA,
            takes_ctx=False,
        )
    )
    return FunctionToolset(tools)


def _returned(result: ToolResult) -> ToolReturn[Any]:
    return ToolReturn(return_value=result.text, metadata=result.to_json())


def _refused(exc: SettledError) -> Exception:
    if isinstance(exc, InvalidInput):
        return ModelRetry(error_text(exc))
    return ToolFailed(error_text(exc))


def _operation(kit: Kit, op: Operation) -> Callable[..., ToolReturn[Any]]:
    def call(ctx: RunContext[Any], **arguments: Any) -> ToolReturn[Any]:
        try:
            if not kit.needs_asking(op):
                return _returned(kit.send(op, arguments))
            if ctx.tool_call_approved:
                shown = (ctx.tool_call_metadata or {}).get("params_hash")
                answer = kit.approved(op, arguments, shown=shown, by="pydantic_ai-approval")
            else:
                answer = kit.ask(op, arguments)
        except SettledError as exc:
            raise _refused(exc) from None
        if isinstance(answer, Pending):
            raise ApprovalRequired(metadata=answer.payload())
        return _returned(answer)

    call.__name__ = op.name
    return call


def _check(kit: Kit) -> Callable[..., ToolReturn[Any]]:
    def check_action(**arguments: Any) -> ToolReturn[Any]:
        try:
            return _returned(kit.check(arguments))
        except SettledError as exc:
            raise _refused(exc) from None

    return check_action


__all__ = ["toolset"]
