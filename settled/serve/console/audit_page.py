"""``GET /ui/audit``: who did what, as ``settled log`` lists it (``storage.event_log``):
people's events newest first, filtered by person, token, session, command, action and
time, a page at a time (``before`` = the last id shown). Bad input is said on the page
(400) and reads nothing."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ...errors import InvalidInput
from ...model import EventKind
from ...session import Session
from ...storage import LogFilter
from ...storage.event_log import COMMAND_KINDS, parse_when, row_of
from .page_kit import PageRoute, Visit

PAGE = 100  # events a page
FIELDS = ("by", "token_name", "session", "command", "kind", "action_id", "since", "until")


def _filter(values: dict[str, str], now: Any) -> LogFilter:
    kinds = [k for k in values.get("kind", "").split(",") if k]
    known = {str(k) for k in EventKind}
    for k in kinds:
        if k not in known:
            raise InvalidInput(f"kind {k!r}: use one of {', '.join(sorted(known))}")
    command = values.get("command")
    if command:
        if command not in COMMAND_KINDS:
            raise InvalidInput(f"command {command!r}: use one of {', '.join(COMMAND_KINDS)}")
        kinds += [k for k in COMMAND_KINDS[command] if k not in kinds]
    before = values.get("before")
    if before and not (before.isdigit() and int(before) > 0):
        raise InvalidInput("before: the id of the last event shown")
    return LogFilter(
        person=values.get("by") or None,
        token=values.get("token_name") or None,
        session=values.get("session") or None,
        kinds=tuple(kinds),
        action_id=values.get("action_id") or None,
        since=parse_when(values["since"], now, "since") if values.get("since") else None,
        until=parse_when(values["until"], now, "until") if values.get("until") else None,
        before=int(before) if before else None,
        limit=PAGE + 1,
    )


async def audit(visit: Visit) -> Response:
    values = {
        k: v.strip() for k, v in visit.request.query_params.items() if k in (*FIELDS, "before")
    }
    values = {k: v for k, v in values.items() if v}

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        try:
            f = _filter(values, now)
        except InvalidInput as exc:
            return {"rows": [], "more": None, "now": now, "problem": str(exc)}
        found = ledger.log(f)
        rows = [row_of(e) for e in found[:PAGE]]
        more = rows[-1]["id"] if len(found) > PAGE else None
        return {"rows": rows, "more": more, "now": now, "problem": ""}

    data = await visit.run(work)
    shown = {k: v for k, v in values.items() if k != "before"}
    return visit.page(
        "audit.html",
        status=400 if data["problem"] else 200,
        nav="audit",
        values=shown,
        commands=list(COMMAND_KINDS),
        **data,
    )


ROUTES = (PageRoute("/audit", audit),)

__all__ = ["ROUTES", "audit"]
