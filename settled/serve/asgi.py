"""The ASGI application: the route table, the checks every request passes, the log.

Layers, outermost first (each one concern):

    NoStore     ``Cache-Control: no-store`` on every answer of ``/api/v1`` and ``/mcp``
                (records carry params), refusals included, unless the route set its own
                (the OpenAPI description may be cached briefly)
    Observe     one JSON log line and the metrics per request (method, route template,
                status, duration; never the raw path, the query, headers, bodies or
                tokens); any exception becomes a 500 problem, never a traceback
    Gate        Host (421), a token in the query string (401), a cross-origin write
                (403), the body cap (413), before any route runs
    Starlette   the routes (``routes``), problems rendered as application/problem+json

Routes, each family from its own module: ``/healthz`` and ``/metrics``
(``monitor_routes``, no token, as the daemon serves them), ``/api/v1/...``
(``settled.serve.api``), ``/ui/...`` (the console, ``settled.serve.console``), ``/mcp``
(``mcp_routes``: the MCP server of ``settled mcp``, its own DNS-rebinding guard kept; a
token with the ``dispatch`` role once any token is configured), and the provider
callbacks of ``hook_routes`` (``callback_routes``).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from . import api, callback_routes, console, mcp_routes, monitor_routes
from .auth import REALM
from .problems import Problem, one_line
from .service import Service, too_large

QUERY_TOKENS = ("token", "access_token")  # refused in any query string: URLs end up in logs
QUERY_TOKEN_EXEMPT = ("/hooks/",)  # the `token` callback scheme may carry its secret there
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
NO_STORE = ("/api/v1", "/mcp")  # answers that may carry a record or its params
_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def hook_routes() -> list[Any]:
    """``POST /hooks/{provider}``: provider callbacks (rule 16), answered by the
    callback core (``settled.serve.callback_routes``). Its path starts with ``/hooks/``: the
    query-string token refusal does not apply there (the ``token`` scheme)."""

    return callback_routes.routes()


def routes(service: Service, mcp: list[Any]) -> list[Any]:
    """Every route of the service, in matching order."""
    return [
        *monitor_routes.routes(),
        *api.routes(),
        *console.routes(),
        *mcp,
        *hook_routes(),
    ]


# ------------------------------------------------------------------ the checks


class Gate:
    """What every request passes before a route runs (see the module docstring)."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.check(scope)
        if problem is not None:
            scope.setdefault("state", {})["refused"] = problem.detail
            await problem.send(send)
            return
        await self.app(scope, self.capped(receive), send)

    def check(self, scope: Any) -> Problem | None:
        headers: dict[str, list[str]] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.decode("latin-1").lower(), []).append(v.decode("latin-1"))
        hosts = headers.get("host", [])
        if len(hosts) != 1:
            return Problem(400, "a request needs exactly one Host header")
        if not self.service.guard.host_ok(hosts[0]):
            return Problem(
                421,
                "this service does not answer to that Host ([serve] hosts lists the names it does)",
            )
        if not scope["path"].startswith(QUERY_TOKEN_EXEMPT):
            for key, _value in parse_qsl(
                scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
            ):
                if key.lower() in QUERY_TOKENS:
                    scope.setdefault("state", {})["query_token"] = key.lower()
                    return Problem(
                        401,
                        f"a token in the URL ({key.lower()}=...) is refused: URLs end up in logs and "
                        "proxies. Send Authorization: Bearer TOKEN, and replace the token that was exposed",
                        headers={"WWW-Authenticate": REALM},
                    )
        method = scope["method"]
        origins = headers.get("origin", [])
        if method not in SAFE_METHODS and origins:
            if len(origins) > 1 or not self.service.guard.same_origin(
                origins[0], scope.get("scheme", "http"), hosts[0]
            ):
                return Problem(
                    403, "a write from another origin is refused (Origin is not this service)"
                )
        length = headers.get("content-length", [])
        if length:
            if len(length) > 1 or not length[0].strip().isdigit():
                return Problem(400, "a malformed Content-Length")
            # a callback's route answers its own 413, so that it is counted and logged
            # as a refused callback (settled.serve.callback_routes); it reads nothing past the cap
            if int(length[0]) > self.service.max_body and not scope["path"].startswith(
                QUERY_TOKEN_EXEMPT
            ):
                return too_large(self.service.max_body)
        return None

    def capped(self, receive: Any) -> Any:
        """``receive`` that refuses a body past the cap, announced or not."""
        limit = self.service.max_body
        seen = 0

        async def wrapped() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit)
            return message

        return wrapped


def route_template(routes: list[Any], scope: Any) -> str:
    """The template of the route a request goes to (``/api/v1/actions/{id}/confirm``),
    never its raw path: ids and tokens stay out of the log. '-' when none matches."""
    from starlette.routing import Match

    partial = "-"
    for route in routes:
        match, _child = route.matches(scope)
        if match is Match.FULL:
            return _CONVERTER.sub(r"{\1}", route.path)
        if match is Match.PARTIAL and partial == "-":
            partial = _CONVERTER.sub(r"{\1}", route.path)
    return partial


class Observe:
    """One log line and the metrics per request; the last line of defence."""

    def __init__(self, app: Any, service: Service, table: list[Any]) -> None:
        from prometheus_client import Counter, Histogram

        self.app = app
        self.service = service
        self.table = table
        registry = service.metrics.registry
        self.requests = Counter(
            "settled_http_requests",
            "Requests served, by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "settled_http_request_duration_seconds",
            "Time to answer a request, by route template.",
            ["route"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = route_template(self.table, scope)
        scope["settled.route"] = route
        status: list[int] = []

        async def observed(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        failure: str | None = None
        try:
            await self.app(scope, receive, observed)
        except Exception as exc:  # the process boundary: a bug is one line, never a traceback
            failure = f"{type(exc).__name__}: {one_line(str(exc))}"
            if self.service.debug:
                import traceback

                traceback.print_exc()
            if not status:
                problem = Problem(500, "internal error; see the server's log")
                try:
                    await problem.send(observed)
                except Exception:  # noqa: S110 - the client went away: nothing left to answer
                    pass
        seconds = time.perf_counter() - started
        code = status[0] if status else 500
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        self.requests.labels(method, route, str(code)).inc()
        self.duration.labels(route).observe(seconds)
        line: dict[str, Any] = {
            "method": method,
            "route": route,
            "status": code,
            "duration_ms": round(seconds * 1000, 3),
        }
        state = scope.get("state") or {}
        if state.get("actor"):
            line["actor"] = state["actor"]
        if state.get("query_token"):
            line["refused"] = (
                f"token in the query string ({state['query_token']}=, value not logged)"
            )
        elif state.get("refused"):
            line["refused"] = state["refused"]
        if state.get("callback"):
            line["callback"] = state["callback"]
        if failure is not None:
            line.update(level="error", error=failure)
        self.service.emit("request", **line)


class NoStore:
    """``Cache-Control: no-store`` on every answer under ``prefixes`` that names no
    cache policy of its own: no browser, proxy or CDN keeps a record or its params."""

    def __init__(self, app: Any, prefixes: tuple[str, ...] = NO_STORE) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return

        async def stored_nowhere(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"cache-control" for k, _v in headers):
                    headers.append((b"cache-control", b"no-store"))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stored_nowhere)


# ------------------------------------------------------------------ assembly


def build(service: Service, *, mcp: Any = None) -> Any:
    """The ASGI application of ``service``: its routes behind the checks and the log.
    ``mcp``, an MCP server (``settled.agents.mcp_server.SettledMCP(...).server()``, which
    needs the SDK, ``settled[mcp]``), is mounted at ``/mcp``; the caller builds it, as
    ``settled serve`` starts both, so the service imports no other shell."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    mcp_table, mcp_lifespan = mcp_routes.routes(service, mcp) if mcp is not None else ([], None)

    async def on_problem(request: Any, exc: Exception) -> Any:
        assert isinstance(exc, Problem)
        return exc.response()

    async def on_http(request: Any, exc: Exception) -> Any:
        assert isinstance(exc, HTTPException)
        detail = {
            404: "no such route; the API is under /api/v1 (see /api/v1/openapi.json)",
            405: "this route does not take that method",
        }.get(exc.status_code, exc.detail)
        return Problem(exc.status_code, detail, headers=dict(exc.headers or {})).response()

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with _running(service, mcp_lifespan):
            yield

    async def on_bug(request: Any, exc: Exception) -> Any:  # then Observe logs it
        return Problem(500, "internal error; see the server's log").response()

    table = routes(service, mcp_table)
    app = Starlette(
        routes=table,
        exception_handlers={Problem: on_problem, HTTPException: on_http, Exception: on_bug},
        lifespan=lifespan,
    )
    app.state.service = service
    return NoStore(Observe(Gate(app, service), service, table))


@asynccontextmanager
async def _running(
    service: Service, mcp_lifespan: Callable[[], AbstractAsyncContextManager[Any]] | None
) -> AsyncIterator[None]:
    """While the application runs: the MCP session manager and, with ``--reconcile``,
    the daemon's pass in a thread of its own; both stopped when it ends."""
    import threading

    import anyio.to_thread

    sweeper = service.sweeper
    thread = None

    def sweep() -> None:
        assert sweeper is not None
        sweeper.serve()
        if sweeper.exit_code:  # the ledger's schema moved (``ledger_changed``): stop it all
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)

    if sweeper is not None:
        thread = threading.Thread(target=sweep, name="settled-reconcile", daemon=True)
        thread.start()
    try:
        if mcp_lifespan is not None:
            async with mcp_lifespan():
                yield
        else:
            yield
    finally:
        if sweeper is not None and thread is not None:
            sweeper.request_stop("the service is stopping")
            await anyio.to_thread.run_sync(thread.join)


__all__ = [
    "QUERY_TOKEN_EXEMPT",
    "Gate",
    "NoStore",
    "Observe",
    "build",
    "hook_routes",
    "route_template",
    "routes",
]
