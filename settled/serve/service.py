"""The request context every route shares: one :class:`Service` per process.

A route (an API call today, a provider callback at ``/hooks/{provider}`` tomorrow)
gets it with ``service_of(request)`` and finds there:

- ``await service.run(fn)``: ``fn(session)`` in a worker thread, with a
  :class:`~settled.session.Session` of its own from the pool (its ``ledger()`` and
  ``registry()``), so that no database connection is ever used by two threads at
  once; at most ``pool`` calls run at the same time, the rest wait without a thread;
- ``await service.body(request)``: the raw body, refused with 413 over ``max_body``;
- ``service.log``: the JSON log (``settled.log.json_lines``); ``service.emit``
  writes one line with the server's name and the time;
- ``service.metrics``: the Prometheus registry of ``settled.metrics`` (plus the
  service's own request counters: ``settled.serve.asgi``);
- ``service.tokens``, ``service.guard``, ``service.config``, ``service.stopping``.

The service holds no state of its own beyond that pool and the console's login
throttle (``service.logins``): several processes may share one PostgreSQL ledger.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import to_text, utcnow
from ..errors import ConfigError, LedgerError, MissingExtra, SettledError
from ..log import Log, json_lines
from .auth import Guard, Tokens
from .logins import Logins
from .problems import Problem, one_line

if TYPE_CHECKING:
    from ..config import Config
    from ..metrics import Metrics
    from ..session import Session
    from ..sweep import Sweeper
    from ..toolbox import Toolbox
    from .sessions import Sessions

T = TypeVar("T")
TIMED_OUT = "settled.timed_out"  # set in a scope by settled.serve.connections
POOL = 8  # ledger sessions: API calls (and MCP tool calls) that run side by side


@dataclass
class Service:
    toolbox: Toolbox  # the session pool (settled.toolbox.Toolbox), shared with /mcp
    config: Config
    tokens: Tokens
    guard: Guard
    metrics: Metrics
    log: Log = field(default_factory=json_lines)
    name: str = field(default_factory=lambda: f"serve:{os.getpid()}")
    sweeper: Sweeper | None = None  # --reconcile: the daemon's pass in this process
    debug: bool = False
    stopping: bool = False
    ledger_location: str = ""  # fit to show: a URL's password is masked
    closing: list[Callable[[], None]] = field(default_factory=list)
    sessions: Sessions | None = None  # the console's signed sessions (settled.serve.sessions)
    # the console's failed logins and used login nonces: the one state held in memory
    # (settled.serve.logins says why that is acceptable)
    logins: Logins = field(default_factory=Logins)
    # bodies being read before their sender is known, by client address (at most
    # [serve] bodies_per_client each): the event loop's own count, never shared
    _bodies: dict[str, int] = field(default_factory=dict)
    _limiter: Any = None

    def close(self) -> None:
        """Close the pool and whatever else the service opened (once)."""
        self.toolbox.close()
        while self.closing:
            self.closing.pop()()

    @property
    def max_body(self) -> int:
        return self.config.serve.max_body

    @property
    def pool(self) -> int:
        return max(1, self.toolbox.pool)

    def emit(self, event: str, **fields: Any) -> None:
        self.log({"time": to_text(utcnow()), "event": event, "server": self.name, **fields})

    def emit_error(self, exc: BaseException, request: Any = None) -> None:
        """A failure the server must look into (the ledger, the config, a bug) as one
        ``error`` line; a caller's own mistake (404, 409, 422) is only its request line."""

        if isinstance(exc, SettledError) and not isinstance(
            exc, (LedgerError, ConfigError, MissingExtra)
        ):
            return

        route = request.scope.get("settled.route") if request is not None else None
        self.emit(
            "error",
            level="error",
            error=type(exc).__name__,
            message=one_line(str(exc)),
            route=route,
        )

    async def run(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in a worker thread, with a pooled session of its own."""
        import anyio.to_thread

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.pool)

        def work() -> T:
            with self.toolbox.session(create=True) as session:
                return fn(session)

        return await anyio.to_thread.run_sync(work, limiter=self._limiter)

    async def body(self, request: Any, *, authenticated: bool = True) -> bytes:
        """The request's body, at most ``max_body`` bytes (413 beyond, whether or not
        it announced its length). A body read before its sender is known
        (``authenticated=False``: a callback before its signature is checked, a console
        login) counts against its client address: at most ``[serve]
        bodies_per_client`` of them at once, 429 beyond. A body that stops arriving is
        the connection's limit (``settled.serve.connections``): 408."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise too_large(self.max_body)
        if authenticated:
            return await self._read(request)
        client = request.client.host if request.client else "-"
        if self._bodies.get(client, 0) >= self.config.serve.bodies_per_client:
            raise Problem(
                429,
                f"more than {self.config.serve.bodies_per_client} requests from this address "
                "are sending their bodies at once ([serve] bodies_per_client); retry later",
                headers={"Retry-After": "1"},
            )
        self._bodies[client] = self._bodies.get(client, 0) + 1
        try:
            return await self._read(request)
        finally:
            self._bodies[client] -= 1
            if not self._bodies[client]:
                del self._bodies[client]

    async def _read(self, request: Any) -> bytes:
        from starlette.requests import ClientDisconnect

        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise too_large(self.max_body)
                chunks.append(chunk)
        except ClientDisconnect:
            if request.scope.get(TIMED_OUT) == "body":
                raise Problem(
                    408,
                    f"the body did not arrive within {self.config.serve.body_timeout:g} s "
                    "([serve] body_timeout)",
                ) from None
            raise Problem(400, "the client closed the connection before its body arrived") from None
        return b"".join(chunks)


def too_large(limit: int) -> Problem:
    return Problem(413, f"the body is larger than {limit} bytes ([serve] max_body)")


def service_of(request: Any) -> Service:
    """The service a request is served by (``request.app.state.service``)."""
    service: Service = request.app.state.service
    return service


__all__ = ["POOL", "TIMED_OUT", "Service", "service_of", "too_large"]
