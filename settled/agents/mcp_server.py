"""``settled mcp``: the configured operations as MCP tools (docs/agents.md).

Built on the low-level ``mcp.server.Server`` of the official SDK (2.x), because the
tools are declared at run time from settled.toml, one per operation:

    {provider}_{operation}   input {action_id, params}; annotations from the declaration
    check_action             read-only; runs a due verification check first
    list_unresolved          read-only; the DENIED_UNRESOLVED queue
    settled://queue                  resource: the queue as JSON
    settled://actions/{action_id}    resource: one action's record and timeline

Every result carries ``{action_id, status, settled_status, reason, next_check_at}``
as structured content and one line of text (``settled.toolbox``). Errors are
``isError`` results with a one-line message; no traceback ever reaches the client.

An operation whose action key names the action (rule 21) takes ``{params}`` alone.
An operation that needs a person's confirmation is recorded first; the person is
then asked through elicitation (a server-to-client request on handshake-era
connections, an ``InputRequiredResult`` round on 2026-07-28 connections). An
approval goes through the same atomic claim as ``settled confirm``, bound to the
params the person was shown; without elicitation, or where the operation declares
``approval = "person"``, the result is ``accepted``, awaiting ``settled confirm`` (the
API, the console) and the client is never asked. No tool input can approve.

Ledger and provider calls are blocking: they run in worker threads, each with a
session of its own from a pool opened at start, so concurrent calls never share a
database connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import unquote

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp_types.version import is_version_at_least

from .. import __version__
from ..errors import InvalidInput, NotFound, SettledError
from ..toolbox import (
    CHECK_ACTION,
    LIST_UNRESOLVED,
    QUEUE_SCHEMA,
    RESULT_SCHEMA,
    Operation,
    Submitted,
    Toolbox,
    ToolResult,
    check_action_id,
    check_arguments,
    dumps,
    one_line,
    result_for,
)

log = logging.getLogger("settled.mcp")

CONFIRM_KEY = "settled_confirm"  # the input request's key on 2026-07-28 connections
CONFIRM_TIMEOUT = 600.0  # s a person has to answer; then the action stays awaiting confirmation
INPUT_REQUIRED_VERSION = "2026-07-28"  # first revision that asks through InputRequiredResult
POOL = 8  # ledger sessions kept open: tool calls that run side by side
RESOURCE_NOT_FOUND = -32002  # the JSON-RPC error code MCP gives an unknown resource
QUEUE_URI = "settled://queue"
ACTION_URI = "settled://actions/"
INSTRUCTIONS = (
    "settled keeps an honest ledger of side effects. Each tool result has a status: "
    "'success' means the effect was observed; 'accepted' means not yet observed (call "
    "check_action later with the same action_id); 'uncertain' means nobody can know now "
    "(tell the user it is unresolved; never report it as done, never resend under a new "
    "action_id); 'failed' means provably not applied. Reuse an action_id only to ask about "
    "or repeat the same intended action: a repeat never sends twice."
)
CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "confirm": {
            "type": "boolean",
            "title": "Send it",
            "description": "Send this action once. Leave unchecked to keep it unsent.",
        }
    },
    "required": ["confirm"],
}

T = TypeVar("T")


def _text(line: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=line)]


def tool_result(result: ToolResult) -> types.CallToolResult:
    return types.CallToolResult(content=_text(result.text), structured_content=result.to_json())


def tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=_text(one_line(message)[:1000]), is_error=True)


def _can_ask(caps: types.ClientCapabilities | None) -> bool:
    """The client can show a form to a person (an empty ``elicitation`` object means
    form mode, as the protocol had it before modes existed)."""
    if caps is None or caps.elicitation is None:
        return False
    return caps.elicitation.form is not None or caps.elicitation.url is None


class SettledMCP:
    """The tools, resources and elicitation flow of one ``settled mcp`` server.

    ``debug`` logs the traceback of an internal error (a bug) on the server's stderr;
    otherwise it is one line there too. The client always gets one line."""

    def __init__(self, toolbox: Toolbox, *, debug: bool = False) -> None:
        self.toolbox = toolbox
        self.debug = debug
        self.ops = {op.name: op for op in toolbox.operations()}
        self.tools = [self._tool(op) for op in self.ops.values()] + self._read_tools()

    def _error_line(self, exc: BaseException) -> str:
        if isinstance(exc, SettledError):
            return f"error: {exc}"
        line = f"internal error: {type(exc).__name__}: {exc}"
        log.error("settled mcp: %s", one_line(line), exc_info=exc if self.debug else None)
        return line

    # ------------------------------------------------------------ declarations
    @staticmethod
    def _tool(op: Operation) -> types.Tool:
        return types.Tool(
            name=op.name,
            title=op.title,
            description=op.description(),
            input_schema=op.input_schema(),
            output_schema=RESULT_SCHEMA,
            annotations=types.ToolAnnotations(
                title=op.title,
                read_only_hint=False,
                destructive_hint=op.destructive,
                idempotent_hint=True,  # the action id makes a repeat a no-op
                open_world_hint=True,
            ),
        )

    @staticmethod
    def _read_tools() -> list[types.Tool]:
        check = types.Tool(
            name=CHECK_ACTION,
            title="Check an action",
            description=(
                "The current status of an action, by its action_id. Runs the action's "
                "verification check first when one is due (never sooner than scheduled). "
                "Status: success (effect observed), accepted (not yet observed: check again "
                "after next_check_at), uncertain (nobody can know now: a person or evidence "
                "must settle it), failed (provably not applied). Sends nothing."
            ),
            input_schema={
                "type": "object",
                "properties": {"action_id": {"type": "string", "minLength": 1, "maxLength": 200}},
                "required": ["action_id"],
                "additionalProperties": False,
            },
            output_schema=RESULT_SCHEMA,
            annotations=types.ToolAnnotations(
                title="Check an action",
                read_only_hint=True,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=True,  # a due check queries the provider
            ),
        )
        unresolved = types.Tool(
            name=LIST_UNRESOLVED,
            title="List unresolved actions",
            description=(
                "Actions whose outcome nobody knows (DENIED_UNRESOLVED), oldest first: each "
                "blocks any re-send until evidence or a person settles it. Sends nothing."
            ),
            input_schema={
                "type": "object",
                "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 500}},
                "additionalProperties": False,
            },
            output_schema=QUEUE_SCHEMA,
            annotations=types.ToolAnnotations(
                title="List unresolved actions",
                read_only_hint=True,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        )
        return [check, unresolved]

    # ------------------------------------------------------------ handlers
    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            return await self._call(ctx, params)
        except Exception as exc:  # the tool boundary: every failure is one isError line
            return tool_error(self._error_line(exc))

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name = params.name
        args = dict(params.arguments or {})
        if name == CHECK_ACTION:
            check_arguments(args, {"action_id"})
            return tool_result(await _thread(self.toolbox.check, args.get("action_id")))
        if name == LIST_UNRESOLVED:
            check_arguments(args, {"limit"})
            limit = args.get("limit", 100)
            if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 500:
                return tool_error("error: limit must be a whole number from 1 to 500")
            rows = await _thread(self.toolbox.unresolved, limit)
            text = f"{len(rows)} unresolved action(s)" + "".join(f"; {r.text}" for r in rows[:20])
            return types.CallToolResult(
                content=_text(one_line(text)),
                structured_content={"count": len(rows), "actions": [r.to_json() for r in rows]},
            )
        op = self.ops.get(name)
        if op is None:
            return tool_error(f"error: unknown tool {name!r}")
        check_arguments(args, op.arguments)
        submitted = await _thread(
            self.toolbox.submit, op, args.get("action_id"), args.get("params")
        )
        if not submitted.awaiting_confirmation:
            if CONFIRM_KEY in (params.input_responses or {}):  # answered, but too late
                note = "another caller confirmed it while the person was asked: sent once"
                return tool_result(result_for(submitted.record, note))
            return tool_result(submitted.result)
        return await self._confirmation(ctx, params, op, submitted)

    # ------------------------------------------------------------ confirmation
    async def _confirmation(
        self,
        ctx: ServerRequestContext[Any],
        params: types.CallToolRequestParams,
        op: Operation,
        submitted: Submitted,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The record is PENDING: ask the person where the client can, else say so."""
        aid = submitted.result.action_id
        if op.person_only:  # approval = "person": settled confirm, the API or the console
            return tool_result(submitted.result)
        if not _can_ask(ctx.session.client_capabilities):
            return tool_result(submitted.result)  # accepted: awaiting a person's confirmation
        message = await _thread(self.toolbox.question, op, aid)
        if is_version_at_least(ctx.protocol_version, INPUT_REQUIRED_VERSION):
            answer = (params.input_responses or {}).get(CONFIRM_KEY)
            # An answer counts only in a round after the one that recorded the action:
            # the person must have been shown the question.
            if not isinstance(answer, types.ElicitResult) or not submitted.repeated:
                request = types.ElicitRequest(
                    params=types.ElicitRequestFormParams(
                        message=message, requested_schema=CONFIRM_SCHEMA
                    )
                )
                return types.InputRequiredResult(input_requests={CONFIRM_KEY: request})
        else:
            answer = None
            with anyio.move_on_after(CONFIRM_TIMEOUT):
                try:
                    answer = await ctx.session.elicit_form(
                        message, CONFIRM_SCHEMA, related_request_id=ctx.request_id
                    )
                except Exception as exc:  # the client could not ask: nothing is sent
                    log.warning("elicitation failed: %s", exc)
                    return tool_result(
                        await _thread(
                            self.toolbox.unconfirmed, aid, "the client could not ask a person"
                        )
                    )
            if answer is None:
                return tool_result(
                    await _thread(self.toolbox.unconfirmed, aid, "no answer from a person in time")
                )
        if answer.action == "accept" and (answer.content or {}).get("confirm") is True:
            shown = submitted.record.params_hash  # the approval is of the params asked about
            return tool_result(await _thread(partial(self.toolbox.confirm, aid, params_hash=shown)))
        why = {
            "accept": "the person did not tick 'Send it'",
            "decline": "the person declined",
            "cancel": "the person dismissed the confirmation",
        }[answer.action]
        return tool_result(await _thread(self.toolbox.unconfirmed, aid, why))

    # ------------------------------------------------------------ resources
    async def list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        queue = types.Resource(
            name="queue",
            title="Unresolved actions",
            uri=QUEUE_URI,
            description="DENIED_UNRESOLVED actions, oldest first, as JSON records.",
            mime_type="application/json",
        )
        return types.ListResourcesResult(resources=[queue])

    async def list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        timeline = types.ResourceTemplate(
            name="action",
            title="An action's timeline",
            uri_template=ACTION_URI + "{action_id}",
            description="One action's record and every event it went through, oldest first.",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[timeline])

    async def read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == QUEUE_URI:
            data: Any = await _thread(self.toolbox.queue_json)
        elif uri.startswith(ACTION_URI):
            aid = check_action_id(unquote(uri[len(ACTION_URI) :]))
            data = await _thread(self.toolbox.timeline, aid)
        else:
            raise NotFound(f"no resource {uri!r}; try {QUEUE_URI} or {ACTION_URI}{{action_id}}")
        contents = types.TextResourceContents(
            uri=uri, mime_type="application/json", text=dumps(data)
        )
        return types.ReadResourceResult(contents=[contents])

    # ------------------------------------------------------------ the server
    def server(self) -> Server[Any]:
        async def read_resource(
            ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            try:
                return await self.read_resource(ctx, params)
            except Exception as exc:  # a protocol error with one line, never a traceback
                from mcp.shared.exceptions import MCPError

                code = RESOURCE_NOT_FOUND if isinstance(exc, NotFound) else types.INTERNAL_ERROR
                raise MCPError(code, one_line(self._error_line(exc))[:1000]) from None

        return Server(
            "settled",
            version=__version__,
            title="settled",
            description="An honest ledger for side effects: never 'done' before the effect is observed.",
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_templates,
            on_read_resource=read_resource,
        )


async def _thread(fn: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(fn, *args)


def build_server(toolbox: Toolbox | None = None, *, debug: bool = False) -> Server[Any]:
    """The MCP server for ``toolbox`` (default: the environment's config and ledger).
    Config mistakes surface here; the ledger is created when missing, as
    ``settled dispatch`` would."""
    toolbox = toolbox or Toolbox(actor="mcp", pool=POOL)
    mcp = SettledMCP(toolbox, debug=debug)
    toolbox.prepare()
    return mcp.server()


def serve(server: Server[Any], address: tuple[str, int] | None = None) -> None:
    """Serve until the client goes away (stdio) or a signal stops it (HTTP)."""
    if address is None:
        anyio.run(serve_stdio, server)
    else:
        serve_http(server, *address)


async def serve_stdio(server: Server[Any]) -> None:
    """Serve over stdin and stdout, where every request gets an answer whatever its
    depth or encoding (``settled.agents.mcp_stdio``)."""
    from .mcp_stdio import stdio_transport

    async with stdio_transport() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server[Any], host: str, port: int) -> None:
    """Streamable HTTP at ``http://HOST:PORT/mcp``, with the SDK's DNS-rebinding
    protection for loopback hosts. The bound address (port 0 picks a free one) is
    printed on stderr before serving."""
    import signal
    import socket
    import sys

    import uvicorn

    app = server.streamable_http_app(host=host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(
        family, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # TCP_NODELAY (serve.run.bind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # listening before the address is printed: a client that reads it connects at
        # once, and a socket only bound refuses it (uvicorn listens later, in start-up)
        sock.listen(2048)
    except OSError as exc:
        sock.close()

        raise InvalidInput(f"--http {host}:{port}: cannot listen: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"settled mcp: serving streamable HTTP at http://{shown}:{bound}/mcp", file=sys.stderr)
    sys.stderr.flush()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    # uvicorn stops gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    # handlers it found: with these, a requested stop ends in exit 0, as the daemon's does.
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    uvicorn.Server(config).run(sockets=[sock])


__all__ = [
    "SettledMCP",
    "build_server",
    "serve",
    "serve_http",
    "serve_stdio",
    "tool_error",
    "tool_result",
]
