"""``GET /stats``: records by status × provider × operation, from the counts the
ledger's writes keep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..lookups import check_names
from .endpoint import Call, Endpoint, respond
from .openapi import Operation
from .parsing import SELECTORS

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session


async def stats(call: Call) -> Response:
    q = call.request.query_params
    provider, operation = q.get("provider"), q.get("operation")
    return respond(await call.run(lambda s: count_by_status(s, provider, operation)))


def count_by_status(s: Session, provider: str | None, operation: str | None) -> dict[str, Any]:
    """Records by status × provider × operation: the counts the writes keep, read in
    one statement (no scan of the records, however large the ledger)."""
    ledger = s.ledger()
    check_names(s, provider, operation)
    rows: list[dict[str, Any]] = []
    for (status, p, o), n in sorted(ledger.counts().items()):
        if n <= 0 or provider not in (None, p) or operation not in (None, o):
            continue
        rows.append({"status": status, "provider": p, "operation": o, "count": n})
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["count"]
    return {"total": sum(by_status.values()), "by_status": by_status, "counts": rows}


ENDPOINTS = [
    Endpoint(
        Operation(
            "GET",
            "/stats",
            "stats",
            "Counts by status, provider and operation",
            "Records by status × provider × operation, from the ledger's existing reads.",
            ("read",),
            {200: ("The counts.", "Stats")},
            query=list(SELECTORS),
        ),
        stats,
    ),
]
