"""``/actions``: record and dispatch an action (``POST /actions``), list them (the queue,
``GET /actions``), one with its events (``GET /actions/{id}``), and confirm a recorded
one (``POST /actions/{id}/confirm``, rule 8), each as its CLI command does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ... import cause
from ...advice import next_step
from ...clock import plus, to_text
from ...dispatch import Outcome
from ...errors import Conflict, SettledError
from ...storage.ledger import Selection
from ...storage.query import SEARCH_MAX, SORT_FIELDS, cursor, read_cursor
from ..lookups import check_names, config_changes
from ..problems import Problem
from .endpoint import CONFLICT, NOT_FOUND, Call, Endpoint, respond
from .openapi import API_PREFIX, Operation
from .parsing import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    SELECTORS,
    check_id,
    read_causes,
    read_duration,
    read_flag,
    read_limit,
    read_search,
    read_statuses,
)

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session


def location(action_id: str) -> str:
    return f"{API_PREFIX}/actions/{quote(action_id, safe='')}"


async def dispatch(call: Call) -> Response:
    body = await call.json("DispatchRequest")
    aid = check_id(body["action_id"], "action_id")
    call.action_id = aid

    def work(s: Session) -> Any:
        d = s.dispatcher(call.actor)
        try:
            return d.submit(
                body["provider"],
                body["operation"],
                body.get("params", {}),
                action_id=aid,
                needs_confirmation=bool(body.get("needs_confirmation", False)),
            )
        except SettledError as exc:
            if isinstance(exc, Conflict):
                raise type(exc)(
                    f"action_id {aid!r} is already recorded with other params (or another "
                    "provider/operation); nothing was sent: use a new action_id for a new action"
                ) from None
            raise

    report = await call.run(work)
    call.service.metrics.dispatched(report)
    created = report.outcome in (Outcome.DISPATCHED, Outcome.RECORDED)
    headers = {"Location": location(aid)}
    return respond(report.to_json(), 201 if created else 200, headers)


async def confirm(call: Call) -> Response:
    await call.json("Empty")
    aid = call.action_id
    assert aid is not None
    report = await call.run(lambda s: s.dispatcher(call.actor).confirm(aid))
    if report.outcome is Outcome.NOT_FOUND:
        raise Problem(404, f"no action {aid!r}", action_id=aid)
    call.service.metrics.dispatched(report)
    return respond(report.to_json())


async def show(call: Call) -> Response:
    aid = call.action_id
    assert aid is not None

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = ledger.get(aid)
        data = {**rec.to_json(), **cause.to_json(rec)}
        data["config_changes"] = config_changes(s, rec)
        data["events"] = [e.to_json() for e in ledger.events(aid)]
        return data

    return respond(await call.run(work))


async def listing(call: Call) -> Response:
    from dataclasses import replace

    q = call.request.query_params
    search = read_search(q.get("q"))
    causes = read_causes(q.get("cause"))
    # a search finds a record whatever became of it: every status unless ``status``
    statuses, default = read_statuses(q.get("status", "all" if search is not None else None))
    provider, operation = q.get("provider"), q.get("operation")
    age = read_duration(q.get("older_than"))
    limit = read_limit(q.get("limit"))
    sort = q.get("sort", "created_at")
    if sort not in SORT_FIELDS:
        raise Problem(422, f"sort: use one of {', '.join(SORT_FIELDS)}")
    reverse = read_flag(q.get("reverse"), "reverse")

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        check_names(s, provider, operation)
        now = ledger.clock(anchor=False).now()
        before = to_text(plus(now, -age)) if age is not None else None
        sel = Selection(
            statuses=statuses,
            provider=provider,
            operation=operation,
            created_before=before,
            also_contradicted=default,
            search=search,
            causes=causes,
            sort=sort,
            reverse=reverse,
        )
        after = q.get("after")
        if after is not None:
            try:
                sel = replace(sel, after=read_cursor(sel, after))
            except ValueError as exc:
                raise Problem(422, f"after: {exc}") from None
        # one row more than the page: whether a next page exists, without counting
        rows = ledger.records(replace(sel, limit=limit + 1))
        more = len(rows) > limit
        rows = rows[:limit]
        total = ledger.count(sel) if more or after is not None else len(rows)
        actions = [{**r.to_json(), **cause.to_json(r), "next": next_step(r)} for r in rows]
        return {
            "actions": actions,
            "count": len(actions),
            "total": total,
            "next_cursor": cursor(sel, rows[-1]) if more else None,
        }

    return respond(await call.run(work))


ENDPOINTS = [
    Endpoint(
        Operation(
            "POST",
            "/actions",
            "dispatch",
            "Record an action and dispatch it",
            "As `settled dispatch`: the action is recorded and claimed (committed) before the request "
            "leaves. 201: this call recorded it (outcome `dispatched` with the real `result`, or "
            "`recorded` with needs_confirmation). 200: the id exists with the same params; nothing was "
            "sent (outcome `already_completed`, `in_progress` or `blocked`). 409: the id exists with "
            "other params.",
            ("dispatch",),
            {
                201: (
                    "Recorded by this call (and dispatched unless it awaits confirmation).",
                    "Report",
                ),
                200: ("Already recorded with the same params: nothing was sent.", "Report"),
                **CONFLICT,
            },
            request="DispatchRequest",
            body_required=True,
        ),
        dispatch,
    ),
    Endpoint(
        Operation(
            "GET",
            "/actions",
            "list_actions",
            "List actions (the queue)",
            "As `settled queue --json`: by default every DENIED_UNRESOLVED action and every settled one "
            "a later reply contradicts, oldest first, each with what settles it next.",
            ("read",),
            {200: ("The selected records, oldest first.", "Listing")},
            query=[
                {
                    "name": "status",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": (
                        "Comma-separated statuses, or `all` (default: DENIED_UNRESOLVED and "
                        "contradicted ones)."
                    ),
                },
                *SELECTORS,
                {
                    "name": "q",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "maxLength": SEARCH_MAX},
                    "description": (
                        "As `settled queue --search`: only actions whose id, params values or "
                        "reason hold every word (3 or more characters each, any case); of every "
                        "status unless `status` is given."
                    ),
                },
                {
                    "name": "cause",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": (
                        "As `settled queue --cause`: comma-separated causes (`http_503`, "
                        "`reply_lost`, `blind`, `contradicted`, ...), kept from each record's "
                        "first unknown outcome."
                    ),
                },
                {
                    "name": "older_than",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "Only actions created longer ago than this: 90s, 10m, 2h, 1d.",
                },
                {
                    "name": "limit",
                    "in": "query",
                    "required": False,
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_LIMIT,
                        "default": DEFAULT_LIMIT,
                    },
                    "description": "At most this many records (`total` says how many match).",
                },
                {
                    "name": "sort",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "default": "created_at"},
                    "description": (
                        "A field of `settled queue --sort` (`triage`: contradicted first, "
                        "then what waits for a person, each oldest first)."
                    ),
                },
                {
                    "name": "reverse",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "boolean", "default": False},
                    "description": "Reverse the order.",
                },
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": (
                        "The next page: the `next_cursor` of the page before, with the same "
                        "selectors and order (another order's cursor is refused, 422)."
                    ),
                },
            ],
        ),
        listing,
    ),
    Endpoint(
        Operation(
            "GET",
            "/actions/{id}",
            "show_action",
            "One action with its events",
            "As `settled show --json`: the record, every event oldest first, and how today's config "
            "differs from what the action was recorded with.",
            ("read",),
            {200: ("The record and its events.", "Shown"), **NOT_FOUND},
        ),
        show,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/confirm",
            "confirm",
            "Confirm a recorded action",
            "As `settled confirm` (rule 8): dispatches it at most once however many confirm. Outcome "
            "`dispatched` with the real `result` for the one caller that wins the claim; "
            "`already_completed`, `in_progress` (another caller has it) or `blocked` (a prior dispatch "
            "is unresolved) otherwise. The body may be empty.",
            ("dispatch", "operate"),
            {200: ("What this confirmation did.", "Report"), **NOT_FOUND},
            request="Empty",
        ),
        confirm,
    ),
]
