"""settled's tools for LangChain and LangGraph (extra ``langchain``; docs/integrations/langchain.md)::

    from langgraph.prebuilt import ToolNode
    from settled.integrations import langchain as settled_lc

    tools = settled_lc.tools()
    node = ToolNode(tools)      # or model.bind_tools(tools)

Each configured operation is one ``StructuredTool``, ``{provider}_{operation}``, with the
input ``settled mcp`` gives it, plus ``check_action``; ``response_format`` is
``content_and_artifact``: the ``ToolMessage`` content is the one line a model reads
(starting with ``success``, ``accepted``, ``uncertain`` or ``failed``) and its
artifact the five fields.

Inside a LangGraph node, an operation that needs a person's confirmation records the
action (nothing sent) and calls ``langgraph.types.interrupt()`` with its action id,
params, params_hash and tier. Resume with ``Command(resume=True)`` (or ``False``, or
``{"approved": bool, "params_hash": ...}`` to bind the answer to the params shown):
the node re-runs from the top, the tool finds the recorded action, and sends it once
when approved; a refusal is recorded as an event and sends nothing. A node that runs
again after that sends nothing twice: the action is found, its record returned.
Outside a graph the action is recorded and waits for ``settled confirm``.

An operation declaring ``approval = "person"`` never interrupts: only ``settled
confirm``, the API or the console sends it. Errors raised before anything was sent are
``ToolException`` (returned to the model as one line starting with ``error:``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import SettledError
from ..toolbox import Operation, ToolResult
from . import framework
from ._kit import CHECK_ACTION, CHECK_DESCRIPTION, CHECK_SCHEMA, Kit, Pending, error_text

framework("langchain_core", "langchain")  # MissingExtra, naming the install, first
framework("langgraph", "langchain")
from langchain_core.tools import BaseTool, StructuredTool, ToolException  # noqa: E402
from langgraph.errors import GraphInterrupt  # noqa: E402
from langgraph.types import interrupt  # noqa: E402

Answer = tuple[str, dict[str, Any]]


def tools(
    *,
    config: str | None = None,
    db: str | None = None,
    operations: Iterable[str] | None = None,
    wait: float = 0.0,
) -> list[BaseTool]:
    """The configured operations (``operations``: some, as ``"mail.send"``), plus
    ``check_action``, as LangChain tools; ``wait`` seconds of verification follow a
    call that sent."""
    kit = Kit(config=config, db=db, operations=operations, wait=wait, actor="langchain")
    out: list[BaseTool] = [
        _tool(op.name, op.description(), op.input_schema(), _operation(kit, op))
        for op in kit.ops.values()
    ]
    out.append(_tool(CHECK_ACTION, CHECK_DESCRIPTION, CHECK_SCHEMA, _checked(kit)))
    return out


def _tool(
    name: str, description: str, schema: dict[str, Any], fn: Callable[..., Answer]
) -> BaseTool:
    return StructuredTool.from_function(
        func=fn,
        name=name,
        description=description,
        args_schema=schema,
        response_format="content_and_artifact",
        handle_tool_error=True,  # a ToolException's line goes back to the model
        infer_schema=False,
    )


def _answer(result: ToolResult) -> Answer:
    return result.text, result.to_json()


def _operation(kit: Kit, op: Operation) -> Callable[..., Answer]:
    def call(**arguments: Any) -> Answer:
        try:
            if not kit.needs_asking(op):
                return _answer(kit.send(op, arguments))
            return _answer(_with_interrupt(kit, op, arguments))
        except SettledError as exc:
            raise ToolException(error_text(exc)) from None

    return call


def _with_interrupt(kit: Kit, op: Operation, arguments: dict[str, Any]) -> ToolResult:
    asked = kit.ask(op, arguments)
    if not isinstance(asked, Pending):
        return asked  # sent before, or only a person through settled: the record
    try:
        resume = interrupt(asked.payload())
    except GraphInterrupt:
        raise  # LangGraph pauses the graph here; the node runs again on resume
    except (RuntimeError, KeyError):  # not inside a graph: settled confirm sends it
        return asked.result
    approved, shown = _read_resume(resume)
    if not approved:
        return kit.declined(op, arguments, "the person declined (LangGraph resume)", by="langgraph")
    answer = kit.approved(op, arguments, shown=shown, by="langgraph-approval")
    if isinstance(answer, Pending):  # the answer was about other params
        return answer.result
    return answer


def _read_resume(value: Any) -> tuple[bool, str | None]:
    """``True``/``False`` or ``{"approved": bool, "params_hash": str}``; anything else
    is no approval (fail closed)."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, Mapping) and isinstance(value.get("approved"), bool):
        shown = value.get("params_hash")
        return bool(value["approved"]), shown if isinstance(shown, str) else None
    return False, None


def _checked(kit: Kit) -> Callable[..., Answer]:
    def check_action(**arguments: Any) -> Answer:
        try:
            return _answer(kit.check(arguments))
        except SettledError as exc:
            raise ToolException(error_text(exc)) from None

    return check_action


__all__ = ["tools"]
