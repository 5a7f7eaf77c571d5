"""``/ui/stats``: counts, ages and reasons (``settled stats``), the queue's growth over
the last hour, day and week, and the audit's figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...clock import plus, to_text
from ...storage.ledger import Selection
from ...summary import OPEN, summarise
from .page_kit import (
    PageRoute,
    Visit,
)

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session


async def stats(visit: Visit) -> Response:
    windows = (("last hour", 3600.0), ("last day", 86400.0), ("last week", 7 * 86400.0))

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        data = summarise(ledger.stats(Selection(), now=to_text(now), by="provider"), "provider")
        over: list[tuple[str, list[int]]] = []
        for g in data["groups"]:
            counts = []
            for _label, secs in windows:
                sel = Selection(
                    statuses=["DENIED_UNRESOLVED"],
                    provider=g["key"],
                    created_after=to_text(plus(now, -secs)),
                )
                counts.append(ledger.count(sel))
            over.append((g["key"], counts))
        figures = sorted(ledger.figures().items())  # the audit's: how settled, how fast
        return {
            "data": data,
            "over": over,
            "windows": [w for w, _ in windows],
            "open": OPEN,
            "now": now,
            "figures": figures,
        }

    return visit.page("stats.html", nav="stats", **(await visit.run(work)))


ROUTES = (PageRoute("/stats", stats),)

__all__ = ["ROUTES", "stats"]
