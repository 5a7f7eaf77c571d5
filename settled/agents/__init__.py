"""Tools for AI agents that never say "done" on a 200.

Python agent code calls an operation through ``settled.tool`` and polls through
``settled.check``; both return a :class:`ToolResult` whose ``status`` is ``success``
(effect observed), ``accepted`` (not yet observed), ``uncertain`` (nobody can know
now) or ``failed`` (provably not applied), on the ledger the CLI uses::

    import settled

    send = settled.tool("mail", "send")
    result = send("order-42-receipt", to="ann@example.com", subject="Your receipt")
    print(result.text)                 # accepted: mail.send order-42-receipt — ...
    result = settled.check("order-42-receipt")
    if result.done:                    # only when the effect was observed
        ...

``tool_specs()`` turns the configured operations into JSON-schema tool specs any
LLM tool-calling API accepts, and ``call(name, arguments)`` runs what a model asked
for. ``settled mcp`` serves the same tools over MCP (``settled.agents.mcp_server``,
which alone needs the ``mcp`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidInput
from ..toolbox import (
    ACTION_ID_SCHEMA,
    CHECK_ACTION,
    Operation,
    Toolbox,
    ToolResult,
    agent_status,
    check_action_id,
    check_arguments,
)

Confirm = Callable[[str], bool]
STYLES = ("json", "openai", "anthropic")


class Tool:
    """One operation as a callable: ``tool(action_id, **params) -> ToolResult``, or
    ``tool(**params)`` where the operation's action key makes the id from the params.

    A repeated ``action_id`` (or intent) never sends twice. When the operation needs a person's
    confirmation, ``confirm(question) -> bool`` is asked (through the same atomic
    claim as ``settled confirm``); without it, or where the operation declares
    ``approval = "person"``, the result is ``accepted``, awaiting ``settled confirm``
    from a shell. ``wait`` seconds of in-process verification
    follow each call (0: return at once; the daemon or ``check`` verifies later)."""

    def __init__(
        self, toolbox: Toolbox, op: Operation, *, confirm: Confirm | None, wait: float
    ) -> None:
        self.toolbox = toolbox
        self.op = op
        self.confirm = confirm
        self.wait = wait
        self.name = op.name

    def __call__(self, action_id: str | None = None, /, **params: Any) -> ToolResult:
        return self.run(action_id, params)

    def run(self, action_id: Any, params: Any) -> ToolResult:
        submitted = self.toolbox.submit(self.op, action_id, params)
        result = submitted.result
        ask = submitted.awaiting_confirmation and not self.op.person_only
        if ask and self.confirm is not None:
            aid = result.action_id
            if self.confirm(self.toolbox.question(self.op, aid)) is True:
                result = self.toolbox.confirm(aid, params_hash=submitted.record.params_hash)
            else:
                result = self.toolbox.unconfirmed(aid, "the person declined")
        if self.wait > 0 and result.status == "accepted" and result.settled_status != "PENDING":
            result = self.toolbox.settle_after(result, self.wait)
        return result

    def spec(self, style: str = "json") -> dict[str, Any]:
        """This tool as a JSON-schema tool spec (see ``tool_specs``)."""
        return _spec(self.name, self.op.description(), self.op.input_schema(), style)

    def __repr__(self) -> str:
        return f"<settled tool {self.name} ({self.op.tier})>"


def tool(
    provider: str,
    operation: str,
    *,
    needs_confirmation: bool = False,
    confirm: Confirm | None = None,
    wait: float = 0.0,
    db: str | None = None,
    config: str | None = None,
) -> Tool:
    """The operation ``provider.operation`` as a callable tool.

    ``needs_confirmation`` adds a person's confirmation to an operation that does not
    declare one (it never removes a declared one). ``db``/``config`` are the CLI's
    ``--db``/``--config`` (default ``SETTLED_DB`` / ``SETTLED_CONFIG`` /
    ``./settled.toml``)."""
    _check_wait(wait)
    extra = {f"{provider}.{operation}"} if needs_confirmation else set()
    box = Toolbox(db=db, config_path=config, actor="agent", confirm=extra)
    return Tool(box, box.operation(provider, operation), confirm=confirm, wait=wait)


def check(
    action_id: str, *, wait: float = 0.0, db: str | None = None, config: str | None = None
) -> ToolResult:
    """An action's status now, after its verification check when one is due; with
    ``wait``, verification runs in this process for up to that many seconds."""
    _check_wait(wait)
    box = Toolbox(db=db, config_path=config, actor="agent")
    if wait > 0:
        check_action_id(action_id)
        return box.settle(action_id, wait)
    return box.check(action_id)


def tools(*, db: str | None = None, config: str | None = None) -> dict[str, Tool]:
    """Every configured operation as a :class:`Tool`, by tool name."""
    box = Toolbox(db=db, config_path=config, actor="agent")
    return {op.name: Tool(box, op, confirm=None, wait=0.0) for op in box.operations()}


def tool_specs(
    style: str = "json", *, db: str | None = None, config: str | None = None
) -> list[dict[str, Any]]:
    """The configured operations, plus ``check_action``, as JSON-schema tool specs.

    ``style``: ``"json"`` gives ``{name, description, parameters}`` (a function
    declaration, as Gemini and most local runtimes take it); ``"openai"`` wraps it
    as ``{"type": "function", "function": {...}}`` (Chat Completions); ``"anthropic"``
    gives ``{name, description, input_schema}``."""
    if style not in STYLES:
        raise InvalidInput(f"style {style!r}: use one of {', '.join(STYLES)}")
    specs = [t.spec(style) for t in tools(db=db, config=config).values()]
    check_schema = {
        "type": "object",
        "properties": {"action_id": ACTION_ID_SCHEMA},
        "required": ["action_id"],
        "additionalProperties": False,
    }
    specs.append(
        _spec(
            CHECK_ACTION,
            "The current status of an action, by its action_id (runs its verification "
            "check when one is due; sends nothing). Only 'success' means the effect was "
            "observed.",
            check_schema,
            style,
        )
    )
    return specs


def call(
    name: str,
    arguments: Mapping[str, Any] | None,
    *,
    confirm: Confirm | None = None,
    db: str | None = None,
    config: str | None = None,
) -> ToolResult:
    """Run the tool call a model asked for (a name from ``tool_specs``). Errors are
    raised as ``settled.SettledError`` with a one-line message, for the caller to
    hand back to the model."""
    args = dict(arguments or {})
    if name == CHECK_ACTION:
        check_arguments(args, {"action_id"})
        return check(args.get("action_id"), db=db, config=config)  # type: ignore[arg-type]
    found = tools(db=db, config=config).get(name)
    if found is None:
        raise InvalidInput(f"unknown tool {name!r}")
    check_arguments(args, found.op.arguments)
    found.confirm = confirm
    return found.run(args.get("action_id"), args.get("params"))


def _check_wait(wait: float) -> None:
    if not (isinstance(wait, int | float) and 0 <= wait < float("inf")):
        raise InvalidInput(f"wait {wait!r}: must be a finite number of seconds >= 0")


def _spec(name: str, description: str, schema: dict[str, Any], style: str) -> dict[str, Any]:
    if style == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    fn = {"name": name, "description": description, "parameters": schema}
    if style == "openai":
        return {"type": "function", "function": fn}
    return fn


__all__ = [
    "Operation",
    "Tool",
    "ToolResult",
    "Toolbox",
    "agent_status",
    "call",
    "check",
    "tool",
    "tool_specs",
    "tools",
]
