"""``GET /events``: who did what, as ``settled log --json`` lists it
(``storage.event_log``), newest first, a page at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import InvalidInput
from ...model import EventKind
from ...storage import LogFilter
from ...storage.event_log import COMMAND_KINDS, parse_when, row_of
from ..problems import Problem
from .endpoint import Call, Endpoint, respond
from .openapi import Operation
from .parsing import MAX_LIMIT, query_param, read_limit

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session

EVENTS_LIMIT = 100  # the audit pages by 100 events unless told


async def events(call: Call) -> Response:
    """The audit (``settled log --json``): people's events, newest first, a page at a
    time; ``next`` is the cursor of the page after this one (None on the last)."""
    q = call.request.query_params
    kinds = [k for k in (q.get("kind") or "").split(",") if k]
    known = {str(k) for k in EventKind}
    for k in kinds:
        if k not in known:
            raise Problem(422, f"kind: {k!r} is not one of {', '.join(sorted(known))}")
    command = q.get("command")
    if command is not None:
        if command not in COMMAND_KINDS:
            raise Problem(422, f"command: use one of {', '.join(COMMAND_KINDS)}")
        kinds += [k for k in COMMAND_KINDS[command] if k not in kinds]
    cursor = q.get("cursor")
    if cursor is not None and not (cursor.isdigit() and int(cursor) > 0):
        raise Problem(422, "cursor: the `next` of the page before")
    everyone = q.get("all", "false")
    if everyone not in ("true", "false"):
        raise Problem(422, "all: true or false")
    limit = read_limit(q.get("limit"), default=EVENTS_LIMIT)

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        try:
            window = {k: parse_when(q[k], now, k) if q.get(k) else None for k in ("since", "until")}
        except InvalidInput as exc:
            raise Problem(422, str(exc)) from None
        f = LogFilter(
            person=q.get("by"),
            token=q.get("token_name"),
            session=q.get("session"),
            kinds=tuple(kinds),
            action_id=q.get("action_id"),
            everyone=everyone == "true",
            before=int(cursor) if cursor else None,
            limit=limit + 1,
            **window,
        )
        found = ledger.log(f)
        rows = [row_of(e) for e in found[:limit]]
        more = len(found) > limit
        return {"events": rows, "count": len(rows), "next": rows[-1]["id"] if more else None}

    return respond(await call.run(work))


ENDPOINTS = [
    Endpoint(
        Operation(
            "GET",
            "/events",
            "list_events",
            "Who did what (the audit)",
            "As `settled log --json`: the events people wrote (verdicts, refused verdicts kept as "
            "notes, confirmations, retries, the checks they asked for), newest first, each with the "
            "`person` and the surface that vouched (`via`: api:TOKEN, ui:HOW:SESSION). `all=true` "
            "adds the machines' events. Page on with `cursor` = the page's `next`.",
            ("read",),
            {200: ("A page of events, newest first.", "EventsPage")},
            query=[
                query_param("by", "The person (a whole name)."),
                query_param(
                    "token_name",
                    "The name of the API token that vouched (`token` itself is refused in any "
                    "query string).",
                ),
                query_param("session", "The console login session."),
                query_param("kind", "Comma-separated event kinds (resolved, note, retry, ...)."),
                query_param(
                    "command", "resolve, retry, confirm or reconcile: the kinds it writes."
                ),
                query_param("action_id", "One action."),
                query_param("since", "From (inclusive): 90s, 10m, 2h, 1d back, or an ISO time."),
                query_param("until", "To (exclusive): a duration back or an ISO time."),
                query_param("all", "true: the machines' events too."),
                query_param("cursor", "The `next` of the page before."),
                {
                    "name": "limit",
                    "in": "query",
                    "required": False,
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_LIMIT,
                        "default": EVENTS_LIMIT,
                    },
                    "description": "At most this many events in the page.",
                },
            ],
        ),
        events,
    ),
]
