"""``/api/v1``: JSON for apps. Each route parses, calls the core in a worker thread with a
pooled session, and renders the record as the CLI's ``--json`` does; no rule lives here.

The route table is ``ENDPOINTS``: each entry's :class:`~settled.serve.openapi.Operation`
is its entry in the OpenAPI description, and its role is checked before it runs.
Action ids are one path segment each, percent-encoded and decoded exactly once (by the
server), so an id may hold ``/`` (``%2F``), ``%`` (``%25``), spaces or ``..`` (``%2E%2E``).

Status codes say what happened to the *request*; what happened to the *action* is the
record's ``status`` and the call's ``outcome`` and ``result`` in the body:

- ``POST /actions``: 201 when this call recorded the action (and dispatched it, unless
  it waits for confirmation); 200 when the id was already recorded with the same params
  (nothing was sent: ``already_completed``, ``in_progress`` or ``blocked``); 409 when it
  was recorded with other params.
- ``POST /actions/{id}/confirm``: 200 with rule 8's outcome; 404 when there is none.

A call acts as ``api:TOKEN`` in the events. ``resolve`` records the verdict of
``operator:BY via api:TOKEN`` when ``by`` is given, else of ``operator:api:TOKEN``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import SettledError
from ..model import action_id_problem
from .auth import REALM, Caller, bearer
from .openapi import API_PREFIX, Operation, Validators, document
from .problems import Problem, problem_for
from .service import Service, service_of

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ..session import Session

JSON_TYPES = ("application/json",)
MAX_LIMIT = 10_000
DEFAULT_LIMIT = 1000


@dataclass
class Call:
    """One API request on its way: the service, who calls, the action id of the path."""

    request: Request
    service: Service
    caller: Caller | None
    action_id: str | None

    @property
    def actor(self) -> str:
        return self.caller.actor if self.caller is not None else "api"

    async def run(self, fn: Callable[[Session], Any]) -> Any:
        """``fn(session)`` in a worker thread; settled's own errors become problems."""
        try:
            return await self.service.run(fn)
        except SettledError as exc:
            self.service.emit_error(exc, self.request)
            raise problem_for(exc, self.action_id) from None

    async def json(self, schema: str | None) -> dict[str, Any]:
        """The body as a JSON object matching ``schema`` ({} when empty and allowed)."""
        raw = await self.service.body(self.request)
        if not raw.strip():
            data: Any = {}
        else:
            ctype = self.request.headers.get("content-type", "")
            media = ctype.split(";", 1)[0].strip().lower()
            if media not in JSON_TYPES and not media.endswith("+json"):
                raise Problem(
                    415, f"send the body as application/json (got {media or 'no content type'!r})"
                )
            data = parse_json(raw)
        if schema is not None:
            why = VALIDATORS.errors(schema, data)
            if why:
                raise Problem(422, why, action_id=self.action_id)
        if not isinstance(data, dict):
            raise Problem(422, "body: must be a JSON object", action_id=self.action_id)
        return data


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, no numbers beyond a double, no lone
    surrogates (each is a 400: the body is not JSON)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    try:
        text = raw.decode("utf-8")
        data = json.loads(text, parse_constant=refuse)
        json.dumps(data, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except UnicodeError:
        raise Problem(400, "the body is not UTF-8 JSON") from None
    except RecursionError:
        raise Problem(400, "the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, a refused constant, inf
        raise Problem(400, f"the body is not valid JSON: {exc}") from None
    return data


def respond(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """JSON exactly as the record holds it (rule 13: data, never markup)."""
    from starlette.responses import Response

    # A lone surrogate (from a provider's reply, say) is written as its JSON escape.
    body = json.dumps(data, ensure_ascii=False, default=str).encode("utf-8", "backslashreplace")
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def location(action_id: str) -> str:
    return f"{API_PREFIX}/actions/{quote(action_id, safe='')}"


# ------------------------------------------------------------------ the handlers


async def openapi_json(call: Call) -> Response:
    return respond(DOCUMENT)


async def dispatch(call: Call) -> Response:
    from ..dispatch import Outcome

    body = await call.json("DispatchRequest")
    aid = _check_id(body["action_id"], "action_id")
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
            from ..errors import Conflict

            if isinstance(exc, Conflict):
                raise type(exc)(
                    f"action_id {aid!r} is already recorded with other params (or another "
                    "provider/operation); nothing was sent: use a new action_id for a new action"
                ) from None
            raise

    report = await call.run(work)
    created = report.outcome in (Outcome.DISPATCHED, Outcome.RECORDED)
    headers = {"Location": location(aid)}
    return respond(report.to_json(), 201 if created else 200, headers)


async def confirm(call: Call) -> Response:
    from ..dispatch import Outcome

    await call.json("Empty")
    aid = call.action_id
    assert aid is not None
    report = await call.run(lambda s: s.dispatcher(call.actor).confirm(aid))
    if report.outcome is Outcome.NOT_FOUND:
        raise Problem(404, f"no action {aid!r}", action_id=aid)
    return respond(report.to_json())


async def show(call: Call) -> Response:
    aid = call.action_id
    assert aid is not None

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = ledger.get(aid)
        data = rec.to_json()
        data["config_changes"] = config_changes(s, rec)
        data["events"] = [e.to_json() for e in ledger.events(aid)]
        return data

    return respond(await call.run(work))


async def listing(call: Call) -> Response:
    from dataclasses import replace

    from ..cli.common import next_step
    from ..clock import plus, to_text
    from ..storage.base import Selection

    q = call.request.query_params
    statuses, default = _statuses(q.get("status"))
    provider, operation = q.get("provider"), q.get("operation")
    age = _duration(q.get("older_than"))
    limit = _limit(q.get("limit"))

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        _check_names(s, provider, operation)
        now = ledger.clock(anchor=False).now()
        before = to_text(plus(now, -age)) if age is not None else None
        sel = Selection(
            statuses=statuses,
            provider=provider,
            operation=operation,
            created_before=before,
            also_contradicted=default,
        )
        rows = ledger.records(replace(sel, limit=limit))
        total = ledger.count(sel) if len(rows) >= limit else len(rows)
        actions = [{**r.to_json(), "next": next_step(r)} for r in rows]
        return {"actions": actions, "count": len(actions), "total": total}

    return respond(await call.run(work))


async def resolve(call: Call) -> Response:
    from ..resolve import resolve as do_resolve

    body = await call.json("ResolveRequest")
    aid = call.action_id
    assert aid is not None
    by = body.get("by")
    if by is not None:
        by = _check_text(by, "by")
    attested = f"{by} via {call.actor}" if by else call.actor
    recheck = not body.get("no_recheck", False)  # rule 14: weighed against the world first

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = do_resolve(
            ledger,
            aid,
            applied=body["applied"],
            reason=body["reason"],
            by=attested,
            now=ledger.clock().now(),
            evidence=body.get("evidence"),
            object_id=body.get("object_id"),
            registry=s.registry(),
            recheck=recheck,
        )
        return rec.to_json()

    return respond(await call.run(work))


async def retry(call: Call) -> Response:
    body = await call.json("RetryRequest")
    aid = call.action_id
    assert aid is not None
    recheck = not body.get("no_recheck", False)  # rule 14: weighed against the world first
    report = await call.run(lambda s: s.dispatcher(call.actor).retry(aid, recheck=recheck))
    return respond(report.to_json())


async def reconcile(call: Call) -> Response:
    await call.json("Empty")
    aid = call.action_id
    assert aid is not None

    def work(s: Session) -> dict[str, Any]:
        report = s.reconciler(actor=call.actor).run_ids([aid])
        data: dict[str, Any] = report.to_json()
        data["record"] = s.ledger().get(aid).to_json()
        return data

    return respond(await call.run(work))


async def stats(call: Call) -> Response:
    q = call.request.query_params
    provider, operation = q.get("provider"), q.get("operation")
    return respond(await call.run(lambda s: count_by_status(s, provider, operation)))


# ------------------------------------------------------------------ reads the CLI also makes


def count_by_status(s: Session, provider: str | None, operation: str | None) -> dict[str, Any]:
    """Records by status × provider × operation, from the ledger's existing reads:
    ``status_counts`` (by status and provider) once, and ``count`` per operation only
    for a provider that has several. Not one snapshot (see the Stats schema)."""
    from ..storage.base import Selection

    ledger = s.ledger()
    _check_names(s, provider, operation)
    ops: dict[str, list[str]] = {}
    for p, o in ledger.names():
        ops.setdefault(p, []).append(o)
    rows: list[dict[str, Any]] = []
    for (status, p), n in sorted(ledger.status_counts().items()):
        if n <= 0 or (provider is not None and p != provider):
            continue
        mine = sorted(ops.get(p, []))
        if len(mine) == 1 and operation in (None, mine[0]):
            rows.append({"status": status, "provider": p, "operation": mine[0], "count": n})
            continue
        for o in mine:
            if operation is not None and o != operation:
                continue
            k = ledger.count(Selection(statuses=[status], provider=p, operation=o))
            if k:
                rows.append({"status": status, "provider": p, "operation": o, "count": k})
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["count"]
    return {"total": sum(by_status.values()), "by_status": by_status, "counts": rows}


def config_changes(s: Session, rec: Any) -> list[str] | None:
    """How today's declaration of the record's operation differs from the one it was
    recorded with (rule 11), as ``show --json`` says it; None when nothing compares."""
    from ..model import Declared

    if rec.declared is None:
        return None
    try:
        spec = s.registry().operation(rec.provider, rec.operation)
    except SettledError:
        return None
    changes: list[str] = rec.declared.differences(Declared.of(spec))
    return changes


def _check_names(s: Session, provider: str | None, operation: str | None) -> None:
    """An unknown provider or operation selector is a 422 naming the real ones (a typo
    must not look like an empty queue to a monitor)."""
    from ..errors import InvalidInput

    if provider is None and operation is None:
        return
    pairs = set(s.ledger().names())
    providers = {p for p, _ in pairs} | set(s.config().providers)
    if provider is not None and provider not in providers:
        raise InvalidInput(
            f"provider: no provider {provider!r} in the config or the ledger; known: "
            f"{', '.join(sorted(providers)) or 'none'}"
        )
    if operation is not None:
        reg = s.registry()
        for name in s.config().providers:
            try:
                pairs |= {(name, o) for o in reg.provider(name).operations()}
            except SettledError:
                continue
        ops = {o for p, o in pairs if provider is None or p == provider}
        if operation not in ops:
            raise InvalidInput(
                f"operation: no operation {operation!r} in the config or the ledger; known: "
                f"{', '.join(sorted(ops)) or 'none'}"
            )


def _check_id(value: Any, what: str) -> str:
    why = action_id_problem(value, what)
    if why:
        raise Problem(422, why)
    assert isinstance(value, str)
    return value


def _check_text(value: str, what: str) -> str:
    if not value.strip() or not value.isprintable() or value != value.strip():
        raise Problem(422, f"{what}: 1-100 printable characters without surrounding spaces")
    return value


def _statuses(raw: str | None) -> tuple[list[str], bool]:
    """``status`` as the queue takes it: a comma list, or ``all``; by default
    DENIED_UNRESOLVED and every contradicted record (second value True)."""
    from ..cli.common import STATUSES

    if raw is None:
        return ["DENIED_UNRESOLVED"], True
    if raw.strip().lower() == "all":
        return list(STATUSES), False
    statuses = [s.strip().upper() for s in raw.split(",") if s.strip()]
    bad = [s for s in statuses if s not in STATUSES]
    if bad or not statuses:
        raise Problem(
            422, f"status: use one or more of {', '.join(STATUSES)} (comma-separated), or all"
        )
    return list(dict.fromkeys(statuses)), False


def _duration(raw: str | None) -> float | None:
    from ..cli.common import parse_duration

    if raw is None:
        return None
    try:
        return parse_duration(raw)
    except SettledError as exc:
        raise Problem(422, f"older_than: {str(exc).removeprefix('bad duration ')}") from None


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise Problem(422, f"limit: a whole number from 1 to {MAX_LIMIT}")
    return int(raw)


# ------------------------------------------------------------------ the route table


@dataclass(frozen=True)
class Endpoint:
    op: Operation
    handler: Callable[[Call], Awaitable[Response]]

    @property
    def route_path(self) -> str:
        """The Starlette path: the id may hold '/' once decoded, so it takes the rest."""
        return API_PREFIX + self.op.path.replace("{id}", "{id:path}")

    async def __call__(self, request: Request) -> Response:
        service = service_of(request)
        caller = authorize(service, request, self.op.roles)
        self.check_query(request)
        aid = None
        if "id" in request.path_params:
            aid = _check_id(self.action_id(request), "action id")
        call = Call(request, service, caller, aid)
        request.state.actor = call.actor if caller is not None else None
        return await self.handler(call)

    def check_query(self, request: Request) -> None:
        """Only the route's own query parameters, each once: a typo (``?stauts=``) must
        not look like the default selection to a monitor."""
        known = [q["name"] for q in self.op.query]
        names = [k for k, _v in request.query_params.multi_items()]
        for name in names:
            if name not in known:
                expected = f"; expected {', '.join(known)}" if known else ""
                raise Problem(422, f"unknown query parameter {name!r}{expected}")
            if names.count(name) > 1:
                raise Problem(422, f"query parameter {name!r}: give it once")

    def action_id(self, request: Request) -> str:
        """The id in the path, percent-decoded exactly once from the raw path (a server
        or test client that decoded the path already cannot decode it twice); without a
        raw path, the route's decoded parameter."""
        from urllib.parse import unquote_to_bytes

        raw = request.scope.get("raw_path")
        if not raw:
            return str(request.path_params["id"])
        text = raw.decode("latin-1").split("?", 1)[0]  # some clients hand the query along
        head = API_PREFIX + self.op.path.split("{id}")[0]
        tail = self.op.path.split("{id}")[1]
        if (
            not text.startswith(head)
            or not text.endswith(tail)
            or len(text) < len(head) + len(tail)
        ):
            # e.g. POST .../a%2Fconfirm: the decoded path looked like a confirm of `a`
            raise Problem(404, "no such route; encode '/' in an action id as %2F")
        segment = text[len(head) : len(text) - len(tail)]
        try:
            return unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError:
            raise Problem(422, "action id: the path is not percent-encoded UTF-8") from None


def authorize(service: Service, request: Request, roles: tuple[str, ...]) -> Caller | None:
    """The caller of a route that any of ``roles`` may call (none: no token needed): 401
    without a valid token (or with none configured), 403 with one that lacks the role."""
    if not roles:
        return None
    if not len(service.tokens):
        raise Problem(
            401,
            "no API tokens are configured, so the API refuses every call: add "
            "[serve.tokens.NAME] to settled.toml (docs/serve.md)",
            headers={"WWW-Authenticate": REALM},
        )
    token, why = bearer(request.headers.getlist("authorization"))
    if token is None:
        raise Problem(401, why, headers={"WWW-Authenticate": REALM})
    caller = service.tokens.identify(token)
    if caller is None:
        raise Problem(
            401,
            "the token is not valid",
            headers={"WWW-Authenticate": REALM + ', error="invalid_token"'},
        )
    if not any(caller.may(r) for r in roles):
        raise Problem(
            403, f"token {caller.token!r} lacks the role for this route ({' or '.join(roles)})"
        )
    return caller


_RECORD = (200, ("The record.", "Record"))
_NOT_FOUND = {404: ("No such action.", "Problem")}
_CONFLICT = {409: ("Not allowed now (the detail says why; nothing was changed).", "Problem")}
_SELECTORS = [
    {
        "name": "provider",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "Only this provider (422 when neither the config nor the ledger knows it).",
    },
    {
        "name": "operation",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "Only this operation.",
    },
]

ENDPOINTS = [
    Endpoint(
        Operation(
            "GET",
            "/openapi.json",
            "openapi",
            "This description (OpenAPI 3.1)",
            "The API's OpenAPI description; readable without a token.",
            (),
            {200: ("The OpenAPI document.", None)},
            errors=(421,),
        ),
        openapi_json,
    ),
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
                **_CONFLICT,
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
                *_SELECTORS,
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
            {200: ("The record and its events.", "Shown"), **_NOT_FOUND},
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
            {200: ("What this confirmation did.", "Report"), **_NOT_FOUND},
            request="Empty",
        ),
        confirm,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/resolve",
            "resolve",
            "Settle an action by a person's verdict",
            "As `settled resolve ID`: from DENIED_UNRESOLVED, from AWAITING_VERIFICATION when only a "
            "person can verify it, or on a contradicted settled record. The event records "
            "operator:BY via api:TOKEN (operator:api:TOKEN without `by`).",
            ("operate",),
            {_RECORD[0]: ("The record after the verdict.", "Record"), **_NOT_FOUND, **_CONFLICT},
            request="ResolveRequest",
            body_required=True,
        ),
        resolve,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/retry",
            "retry",
            "Open a new attempt of a FAILED action",
            "As `settled retry`: only from FAILED (new idempotency key ID:N+1), then dispatched; 409 "
            "from any other status or while a late reply contradicts the failure. The body may be empty.",
            ("operate",),
            {200: ("What the new attempt did.", "Report"), **_NOT_FOUND, **_CONFLICT},
            request="RetryRequest",
        ),
        retry,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/reconcile",
            "reconcile",
            "Check an action against the provider now",
            "As `settled reconcile ID --json`: queries the real effect now, whatever the schedule, and "
            "returns the check's report and the record afterwards. The body may be empty.",
            ("operate",),
            {200: ("The check's report and the record.", "Reconciled"), **_NOT_FOUND},
            request="Empty",
        ),
        reconcile,
    ),
    Endpoint(
        Operation(
            "GET",
            "/stats",
            "stats",
            "Counts by status, provider and operation",
            "Records by status × provider × operation, from the ledger's existing reads.",
            ("read",),
            {200: ("The counts.", "Stats")},
            query=list(_SELECTORS),
        ),
        stats,
    ),
]

DOCUMENT = document(e.op for e in ENDPOINTS)
VALIDATORS = Validators(DOCUMENT)


def routes() -> list[Any]:
    """The API's routes (Starlette), in the table's order; a path that two routes
    share (``/actions``) gets one route per method."""
    from starlette.routing import Route

    return [Route(e.route_path, e.__call__, methods=[e.op.method]) for e in ENDPOINTS]


__all__ = ["DOCUMENT", "ENDPOINTS", "Call", "Endpoint", "authorize", "routes"]
