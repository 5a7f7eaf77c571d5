"""``/healthz`` and ``/metrics``, as the daemon serves them (no token): the service's
health (the ledger answers and, with ``--reconcile``, passes succeed) and the daemon's
Prometheus registry with the service's own request counters.
"""

from __future__ import annotations

from typing import Any

from ..errors import SettledError
from .service import service_of


async def healthz(request: Any) -> Any:
    """200 while the ledger answers (and, with ``--reconcile``, while passes succeed:
    503 before the first has finished and after a failed one); 503 while stopping."""
    from starlette.responses import PlainTextResponse

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


def routes() -> list[Any]:
    from starlette.routing import Route

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


__all__ = ["healthz", "metrics", "routes"]
