"""``/ui/``: the queue, with the CLI's filters and sort (``settled queue``), the tiles
that count what each status filter lists, the counts by cause, and pages by cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...cause import FIXED as CAUSE_CODES
from ...clock import to_text
from ...errors import InvalidInput, SettledError
from ...selection import (
    DELIVERIES,
    STATUSES,
)
from ...storage.ledger import Selection
from ...storage.query import SORT_FIELDS, cursor, read_cursor
from .page_kit import (
    CONTRADICTED,
    DOS,
    Filter,
    PageRoute,
    Visit,
    next_in_words,
)

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session

QUEUE_LIMIT = 100  # rows a page of the queue shows; next and previous links page on
# The tiles over the queue: (status filter, words). Each counts exactly the records
# its link lists (the same selection, the other filters kept), so a tile and the
# list it opens never disagree; the first three add up to the default list.
TILES = (
    (CONTRADICTED, "contradicted by later evidence"),
    ("DENIED_UNRESOLVED", "awaiting a person's verdict"),
    ("PENDING", "held for a person's confirmation"),
    ("AWAITING_VERIFICATION", "awaiting verification"),
    ("FAILED", "failed"),
)


@dataclass(frozen=True)
class Page:
    """Which page of the queue: after or before a cursor, or the first."""

    after: str | None = None
    before: str | None = None

    @classmethod
    def of(cls, source: Any) -> Page:
        after, before = source.get("after"), source.get("before")
        return cls(after or None, None if after else before or None)

    def values(self) -> dict[str, str]:
        return (
            {"after": self.after} if self.after else {"before": self.before} if self.before else {}
        )

    def apply(self, sel: Any) -> Any:
        """``sel`` read from this page (a ``SettledError`` for a cursor that is not one
        of this order)."""

        try:
            if self.after:
                return replace(sel, after=read_cursor(sel, self.after))
            if self.before:
                return replace(sel, before=read_cursor(sel, self.before))
        except ValueError as exc:
            raise InvalidInput(f"this page's link: {exc}") from None
        return sel


async def queue(visit: Visit) -> Response:
    filt = Filter.of(visit.request.query_params)
    page = Page.of(visit.request.query_params)

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        out: dict[str, Any] = {"now": now, "rows": [], "total": 0, "error": ""}
        out.update(tiles=[], causes=[], next_page="", prev_page="", checks_failing=0)
        names = set(ledger.names()) | _configured(s)
        out["names_p"] = sorted({p for p, _ in names})
        out["names_o"] = sorted({o for _, o in names})
        try:
            sel = filt.selection(s, now)
            read = page.apply(sel)
            tiles = [(k, words, filt.selection(s, now, status=k)) for k, words in TILES]
        except SettledError as exc:
            out["error"] = str(exc)
            return out
        # the tiles, the causes and the list all count the same selections
        out["tiles"] = [(k, words, ledger.count(t)) for k, words, t in tiles]
        out["total"] = ledger.count(sel)
        out["causes"] = ledger.causes(sel)
        # a health figure of the whole ledger, whatever the filter
        out["checks_failing"] = ledger.stats(_everything(), now=to_text(now)).checks_failing_now
        rows = ledger.records(replace(read, limit=QUEUE_LIMIT + 1))
        backward = read.before is not None
        more = len(rows) > QUEUE_LIMIT
        rows = rows[1:] if backward and more else rows[:QUEUE_LIMIT]
        if rows and (more or backward):  # a page follows this one
            out["next_page"] = filt.query(after=cursor(sel, rows[-1]))
        if rows and (more if backward else read.after is not None):  # a page comes before
            out["prev_page"] = filt.query(before=cursor(sel, rows[0]))
        out["rows"] = [(r, next_in_words(r, now)) for r in rows]
        return out

    data = await visit.run(work)
    error = data.pop("error")
    return visit.page(
        "queue.html",
        422 if error else 200,
        nav="queue",
        filter=filt,
        error=error,
        statuses=[CONTRADICTED, *STATUSES],
        cause_codes=CAUSE_CODES,
        deliveries=DELIVERIES,
        sorts=SORT_FIELDS,
        dos=DOS,
        shown_limit=QUEUE_LIMIT,
        here=filt.query(**page.values()),
        **data,
    )


def _everything() -> Any:
    return Selection()


def _configured(s: Session) -> set[tuple[str, str]]:
    reg = s.registry()
    out: set[tuple[str, str]] = set()
    for name in s.config().providers:
        try:
            out |= {(name, o) for o in reg.provider(name).operations()}
        except SettledError:
            continue
    return out


ROUTES = (PageRoute("/", queue),)

__all__ = ["ROUTES", "queue"]
