"""``POST /hooks/{provider}``: provider callbacks (rule 16 in docs/rules.md).

A shell, like every route: it reads the raw body under the service's cap (413), hands
it with the headers and the query string to the callback core
(``settled.callbacks.Hooks.handle``: verified over the raw bytes before anything is
read, recorded once per event id, applied only through the declared values), in a
pooled session of its own, and answers what the core says. It counts each answer in
``settled_callbacks_total`` and logs its reason, never the body, the headers or the
query string (the ``token`` scheme may carry its secret there).
"""

from __future__ import annotations

from typing import Any

from .service import service_of


async def hook(request: Any) -> Any:
    from starlette.responses import Response

    service = service_of(request)
    provider = request.path_params["provider"]
    body = await service.body(request)
    headers = list(request.headers.items())
    query = request.scope.get("query_string", b"").decode("latin-1")
    method = request.method

    def handle(session: Any) -> Any:
        return session.hooks(max_body=service.max_body).handle(
            provider, method, headers, body, query
        )

    answer = await service.run(handle)
    service.metrics.callback(answer)
    # The log names the reason, and the provider only when it is one of ours: the path
    # segment of an unknown one is the sender's text.
    known = answer.reason != "unknown_provider"
    request.state.callback = {"reason": answer.reason, **({"provider": provider} if known else {})}
    return Response(answer.content(), status_code=answer.status, media_type="application/json")


def routes() -> list[Any]:
    from starlette.routing import Route

    return [Route("/hooks/{provider}", hook, methods=["POST"])]


__all__ = ["hook", "routes"]
