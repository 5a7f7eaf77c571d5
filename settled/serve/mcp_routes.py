"""``/mcp``: the streamable HTTP endpoint of the MCP server ``settled serve`` mounts (the
server of ``settled mcp``, built by the caller, so the service imports no other shell),
with the SDK's DNS-rebinding guard set to the service's hosts, behind a token with the
``dispatch`` role once any token is configured.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from .auth import REALM, bearer
from .problems import Problem
from .service import Service


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


def routes(
    service: Service, server: Any
) -> tuple[list[Any], Callable[[], AbstractAsyncContextManager[Any]]]:
    """``/mcp``: the streamable HTTP endpoint of ``server`` (the MCP server of ``settled
    mcp``, over the service's session pool), with the SDK's DNS-rebinding guard set to
    the service's hosts, and its session manager's lifespan (run by the service's)."""
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.routing import Route

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


__all__ = ["TokenGate", "routes"]
