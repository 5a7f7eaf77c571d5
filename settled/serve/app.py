"""The ASGI application: the route table, the checks every request passes, the log.

Layers, outermost first (each one concern):

    Observe     one JSON log line and the metrics per request (method, route template,
                status, duration; never the raw path, the query, headers, bodies or
                tokens); any exception becomes a 500 problem, never a traceback
    Gate        Host (421), a token in the query string (401), a cross-origin write
                (403), the body cap (413), before any route runs
    Starlette   the routes (``routes``), problems rendered as application/problem+json

Routes: ``/healthz`` and ``/metrics`` (no token, as the daemon serves them),
``/api/v1/...`` (``settled.serve.api``), ``/ui/...`` (the console,
``settled.serve.console``), ``/mcp`` (the MCP server of ``settled mcp``, its own
DNS-rebinding guard kept; a token with the ``dispatch`` role once any token is
configured), and the provider callbacks of ``hook_routes``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from .auth import REALM, bearer
from .problems import Problem, one_line
from .service import Service, service_of, too_large

QUERY_TOKENS = ("token", "access_token")  # refused in any query string: URLs end up in logs
QUERY_TOKEN_EXEMPT = ("/hooks/",)  # the `token` callback scheme may carry its secret there
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def hook_routes() -> list[Any]:
    """``POST /hooks/{provider}``: provider callbacks (rule 16), answered by the
    callback core (``settled.serve.hooks``). Its path starts with ``/hooks/``: the
    query-string token refusal does not apply there (the ``token`` scheme)."""
    from . import hooks

    return hooks.routes()


def routes(service: Service, mcp: list[Any]) -> list[Any]:
    """Every route of the service, in matching order."""
    from starlette.routing import Route

    from . import api, console

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *api.routes(),
        *console.routes(),
        *mcp,
        *hook_routes(),
    ]


# ------------------------------------------------------------------ monitors


async def healthz(request: Any) -> Any:
    """200 while the ledger answers (and, with ``--reconcile``, while passes succeed:
    503 before the first has finished and after a failed one); 503 while stopping."""
    from starlette.responses import PlainTextResponse

    from ..errors import SettledError

    svc = service_of(request)
    if svc.stopping:
        return PlainTextResponse("unhealthy: stopping\n", status_code=503)
    try:
        await svc.run(lambda s: s.ledger().find(""))
    except SettledError as exc:
        svc.emit_error(exc, request)
        return PlainTextResponse(
            f"unhealthy: the ledger cannot be read ({type(exc).__name__})\n", status_code=503
        )
    if svc.sweeper is not None:
        code, text = svc.metrics.health()
        return PlainTextResponse(text, status_code=code)
    return PlainTextResponse("ok\n")


async def metrics(request: Any) -> Any:
    """The daemon's Prometheus registry, plus the service's request counters. Without
    ``--reconcile`` no pass counts the queue, so its depth is read at each scrape."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
    from starlette.responses import Response

    svc = service_of(request)
    if svc.sweeper is None:
        svc.metrics.queue(await svc.run(lambda s: s.ledger().status_counts()))
    return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# ------------------------------------------------------------------ /mcp


class TokenGate:
    """``/mcp`` once tokens are configured: a bearer token with the ``dispatch`` role
    (its tools dispatch and confirm). Without tokens (loopback only) it is open, as
    ``settled mcp --http`` is."""

    def __init__(self, app: Any, service: Service, role: str = "dispatch") -> None:
        self.app = app
        self.service = service
        self.role = role

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and len(self.service.tokens):
            headers = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
            token, why = bearer(headers)
            caller = self.service.tokens.identify(token) if token is not None else None
            if caller is None:
                await Problem(
                    401, why or "the token is not valid", headers={"WWW-Authenticate": REALM}
                ).send(send)
                return
            if not caller.may(self.role):
                await Problem(
                    403, f"token {caller.token!r} lacks the {self.role} role for /mcp"
                ).send(send)
                return
            scope.setdefault("state", {})["actor"] = caller.actor
        await self.app(scope, receive, send)


def mcp_routes(
    service: Service,
) -> tuple[list[Any], Callable[[], AbstractAsyncContextManager[Any]]]:
    """``/mcp``: the streamable HTTP endpoint of ``settled mcp`` over the service's
    session pool, with the SDK's DNS-rebinding guard set to the service's hosts, and
    its session manager's lifespan (run by the service's)."""
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.routing import Route

    from ..agents.mcp_server import SettledMCP

    server = SettledMCP(service.toolbox, debug=service.debug).server()
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=service.guard.allowed_hosts(),
        allowed_origins=service.guard.allowed_origins(),
    )
    sub = server.streamable_http_app(
        transport_security=security, max_request_body_size=service.max_body
    )
    inner = next(r for r in sub.routes if isinstance(r, Route) and r.path == "/mcp")
    route = Route("/mcp", endpoint=TokenGate(inner.endpoint, service))
    return [route], lambda: sub.router.lifespan_context(sub)


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
            # as a refused callback (settled.serve.hooks); it reads nothing past the cap
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


# ------------------------------------------------------------------ assembly


def build(service: Service, *, mcp: bool = True) -> Any:
    """The ASGI application of ``service``: its routes behind the checks and the log.
    ``mcp`` mounts ``/mcp`` (it needs the MCP SDK, ``settled[mcp]``)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    mcp_table, mcp_lifespan = mcp_routes(service) if mcp else ([], None)

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
    return Observe(Gate(app, service), service, table)


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
    "Observe",
    "TokenGate",
    "build",
    "hook_routes",
    "route_template",
    "routes",
]
