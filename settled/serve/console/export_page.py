"""``/ui/export``: everything the queue's current filter selects, as CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...advice import next_step
from ...clock import to_text
from ...display import config_secrets, redact_params
from ...storage.query import cursor, read_cursor
from .page_kit import (
    Filter,
    PageRoute,
    Refused,
    Visit,
)
from .rendering import HEADERS

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session

# The columns of a CSV export, one row per action (JSON has every field of the record).
EXPORT_COLUMNS = (
    "action_id",
    "status",
    "contradicted",
    "provider",
    "operation",
    "created_at",
    "updated_at",
    "attempt",
    "delivery",
    "tier",
    "reason",
    "contradiction",
    "next",
)
EXPORT_PAGE = 1000  # rows read a time: an export of any size holds one page in memory


def _cell(value: Any) -> str:
    """A CSV cell a spreadsheet shows as text: one that would start a formula (=, +, -,
    @, a tab or a carriage return) is written with a leading apostrophe."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


async def export(visit: Visit) -> Response:
    """Every action the queue's current filter selects, as CSV or JSON, in the queue's
    order, read page by page by cursor; params with their secrets shown as ``***``."""
    from starlette.responses import Response as Plain

    kind = visit.request.query_params.get("format", "csv")
    if kind not in ("csv", "json"):
        raise Refused(422, "export as csv or json")
    filt = Filter.of(visit.request.query_params)
    secrets = [*config_secrets(visit.service.config), *visit.service.tokens.secrets]

    def work(s: Session) -> tuple[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        sel = filt.selection(s, now)
        rows: list[Any] = []
        after = None
        while True:  # ends: every page moves past its last row, and the ledger is finite
            page = ledger.records(replace(sel, limit=EXPORT_PAGE, after=after))
            rows += [(r, next_step(r)) for r in page]
            if len(page) < EXPORT_PAGE:
                return to_text(now), rows
            after = read_cursor(sel, cursor(sel, page[-1]))

    stamp, rows = await visit.run(work)
    name = f"settled-queue-{stamp[:19].replace(':', '')}.{kind}"
    if kind == "json":
        body = json.dumps(
            [
                {**r.to_json(), "params": redact_params(r.params, secrets), "next": nxt}
                for r, nxt in rows
            ],
            ensure_ascii=False,
            indent=1,
            default=str,
        )
        media = "application/json"
    else:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\r\n")
        w.writerow(EXPORT_COLUMNS)
        for r, nxt in rows:
            values = {**r.to_json(), "contradicted": "yes" if r.contradiction else "", "next": nxt}
            w.writerow([_cell(values.get(c)) for c in EXPORT_COLUMNS])
        body = out.getvalue()
        media = "text/csv; charset=utf-8"
    headers = {**HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
    return Plain(body.encode("utf-8"), media_type=media, headers=headers)


ROUTES = (PageRoute("/export", export),)

__all__ = ["ROUTES", "export"]
