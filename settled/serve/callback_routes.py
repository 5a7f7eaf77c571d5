"""``POST /hooks/{provider}``: provider callbacks (rule 16 in docs/rules.md).

A shell, like every route: it reads the raw body under the service's cap (413), hands
it with the headers and the query string to the callback core
(``settled.callbacks.Hooks.handle``: verified over the raw bytes before anything is
read, recorded once per event id, applied only through the declared values), in a
pooled session of its own, and answers what the core says.

Every answer, a refusal included, is counted in
``settled_callbacks_total{provider,reason}`` and named in the request's log line
(``callback: {reason, provider}``), never with the body, the headers or the query
string (the ``token`` scheme may carry its secret there). A provider that has no
callbacks is counted under ``provider="-"``: the path segment is the sender's text,
and a series per guess would grow without bound. The order of the checks is the
core's: method (405), provider (404), then, before a byte of the body is read, the
scheme's signature headers (401 when one is missing, ``required_headers``), size (413),
signature (401), body (400); an unknown provider's body is never read. A body read
before its signature is checked counts against its client address (429 past
``[serve] bodies_per_client``); one that stops arriving is answered 408
(``[serve] body_timeout``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..callbacks.verify import required_headers
from .problems import Problem
from .service import service_of

UNKNOWN = "-"  # the metric label of a provider with no callbacks


async def hook(request: Any) -> Any:
    from starlette.responses import Response

    service = service_of(request)
    answer = await _answer(request, service)
    service.metrics.callback(answer)
    request.state.callback = {
        "reason": answer.reason,
        "provider": answer.provider,
        **({"events": answer.counts} if answer.reason == "batch" else {}),
    }
    extra = (
        {"Allow": "POST"}
        if answer.status == 405
        else {"Retry-After": "1"}
        if answer.status == 429
        else None
    )
    return Response(
        answer.content(), status_code=answer.status, media_type="application/json", headers=extra
    )


async def _answer(request: Any, service: Any) -> Any:
    """The core's ``Answer`` for this request (a 413 for a body over the cap)."""
    from ..callbacks.hooks import Answer

    provider = request.path_params["provider"]
    method = request.method
    body = b""
    cfg = service.config.callbacks.get(provider)
    if cfg is not None and method == "POST":
        if not all(request.headers.get(h) for h in required_headers(cfg)):
            # unsigned: refused before a byte of the body is read (the connection then
            # ends: settled.serve.connections), so no sender holds one without a secret
            return Answer(401, {"error": "unauthorized"}, "bad_signature", provider)
        try:
            body = await service.body(request, authenticated=False)
        except Problem as refused:
            answer = _refused(refused, service, provider)
            if answer is None:
                raise
            return answer
    headers = list(request.headers.items())
    query = request.scope.get("query_string", b"").decode("latin-1")

    def handle(session: Any) -> Any:
        return session.hooks(max_body=service.max_body).handle(
            provider, method, headers, body, query
        )

    answer = await service.run(handle)
    if provider not in service.config.callbacks:  # a 404, or a 405 that came first
        answer = replace(answer, provider=UNKNOWN)
    return answer


def _refused(problem: Problem, service: Any, provider: str) -> Any:
    """The callback answer of a body that was not read whole (None: not one of those)."""
    from ..callbacks.hooks import Answer

    if problem.status == 413:  # over [serve] max_body, announced or not
        return Answer(
            413, {"error": "body too large", "max_body": service.max_body}, "too_large", provider
        )
    if problem.status == 429:  # [serve] bodies_per_client from this address at once
        return Answer(429, {"error": "too many at once; deliver again later"}, "busy", provider)
    if problem.status in (400, 408):  # it stopped, or the sender went away
        return Answer(problem.status, {"error": problem.detail}, "incomplete", provider)
    return None


def routes() -> list[Any]:
    from starlette.routing import Route

    # every method reaches the core, so that a GET is answered (405) and counted too
    return [Route("/hooks/{provider}", hook, methods=list(METHODS))]


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

__all__ = ["UNKNOWN", "hook", "routes"]
