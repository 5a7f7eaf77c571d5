"""``/ui/``: the console, pages rendered on the server from the same core as the CLI.

Routes (every one answers HTML with ``pages.HEADERS``):

    GET  /ui/                 the queue: the CLI's filters and sort, counts by cause
    GET  /ui/actions/{id}     one action: what it was, where it stands, its timeline
    POST /ui/actions/{id}     a verdict on it (``do`` = resolve, confirm, retry, reconcile)
    GET  /ui/bulk             the preview of a verdict on everything a filter selects
    POST /ui/bulk             that verdict, on exactly the records the preview showed
    GET  /ui/providers        each operation's declaration, callbacks and audit debt
    GET  /ui/stats            counts, ages and reasons
    GET  /ui/login, POST /ui/login, POST /ui/logout
    GET  /ui/static/{name}    the console's own stylesheet and script

A GET never changes anything. A POST needs a session (``settled.serve.sessions``), an
``Origin`` of this service, the form's CSRF token, and the role: ``operate`` for
verdicts, ``dispatch`` or ``operate`` to confirm. A refused POST changes nothing.

No rule lives here: a verdict is ``settled.resolve.resolve`` (rule 14's check first), a
retry the dispatcher's, a bulk preview the CLI's ``plan`` rules (``why_not`` and
``becomes`` of ``settled.cli.verdicts``), the queue's selection the CLI's ``queue``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from ..errors import SettledError
from .pages import HEADERS, PREFIX, STATIC, aid_url, render
from .problems import Problem
from .service import Service, service_of
from .sessions import COOKIE, Person, name_problem

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ..session import Session

FORM = "application/x-www-form-urlencoded"
MAX_BULK = 10_000  # records one bulk verdict may change: narrow the filter for more
MAX_ID = 1000  # characters of an id in a path: more than any the ledger accepts (200)
QUEUE_LIMIT = 500  # rows the queue page shows (the count says how many match)
FILTERS = ("status", "provider", "operation", "older_than", "since", "match", "delivery",
           "sort", "reverse")  # fmt: skip
DOS = {
    "resolve_applied": "Resolve as applied",
    "resolve_not_applied": "Resolve as not applied",
    "retry": "Retry (new attempt)",
    "reconcile": "Check with the provider now",
}
DONE = {  # ?did= after a verdict (a fixed key: no text from the URL is ever shown)
    "resolved": "Your verdict was recorded.",
    "retried": "A new attempt was opened and dispatched.",
    "reconciled": "The provider was checked now.",
    "confirm-dispatched": "Confirmed: it was dispatched (once).",
    "confirm-already_completed": "Nothing sent: it had already completed.",
    "confirm-in_progress": "Nothing sent: another caller is dispatching it.",
    "confirm-blocked": "Nothing sent: a prior dispatch is unresolved; reconcile before retry.",
}
STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


class Refused(Exception):
    """A console request refused with a page (its status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Visit:
    """One request to the console: who, and what the page is being given."""

    request: Request
    service: Service
    person: Person | None
    set_cookie: bool = False
    notice: str = ""
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def csrf(self) -> str:
        assert self.service.sessions is not None and self.person is not None
        return self.service.sessions.csrf(self.person)

    def page(self, template: str, status: int = 200, **context: Any) -> Response:
        from starlette.responses import HTMLResponse

        ctx = {"person": self.person, "csrf": self.csrf if self.person else "",
               "notice": self.notice, "error": "", "nav": "", **context}  # fmt: skip
        response = HTMLResponse(render(template, ctx), status_code=status, headers=HEADERS)
        if self.set_cookie and self.person is not None:
            set_session(self, response, self.person)
        return response

    async def run(self, fn: Any) -> Any:
        try:
            return await self.service.run(fn)
        except SettledError as exc:
            self.service.emit_error(exc, self.request)
            from .problems import problem_for

            problem = problem_for(exc, None)
            raise Refused(problem.status, str(exc)) from None


def set_session(visit: Visit, response: Response, person: Person) -> None:
    assert visit.service.sessions is not None
    secure = visit.request.url.scheme == "https"
    response.set_cookie(
        COOKIE, visit.service.sessions.cookie(person), max_age=visit.service.sessions.ui.session_ttl,
        path=f"{PREFIX}/", secure=secure, httponly=True, samesite="strict",
    )  # fmt: skip


def visit_of(request: Request) -> Visit:
    service = service_of(request)
    sessions = service.sessions
    if sessions is None:
        return Visit(request, service, None)
    peer = request.scope.get("settled.peer") or (request.client.host if request.client else None)
    person, fresh, why = sessions.person(request.cookies.get(COOKIE), peer, request.headers)
    if why:
        raise Refused(403, f"the proxy's user header is refused: {why}")
    if person is not None:
        request.state.actor = person.actor
    return Visit(request, service, person, set_cookie=fresh)


def page_route(fn: Any, *, login: bool = True) -> Any:
    """A page handler: the visit made, a refusal rendered as a page (never a trace)."""

    async def endpoint(request: Request) -> Response:
        from starlette.responses import RedirectResponse

        try:
            visit = visit_of(request)
            if login and visit.person is None:
                if request.method != "GET":
                    raise Refused(401, "log in first: your session has ended or never began")
                return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
            response: Response = await fn(visit)
            return response
        except Refused as exc:
            v = Visit(request, service_of(request), None)
            try:
                v = visit_of(request)
            except Refused:
                pass
            return v.page("error.html", exc.status, message=exc.message, code=exc.status)

    return endpoint


# ------------------------------------------------------------------ writes


async def form_of(visit: Visit, role: str | tuple[str, ...]) -> dict[str, str]:
    """The posted form, once every check a write needs has passed (see the module)."""
    request = visit.request
    origin = request.headers.getlist("origin")
    if len(origin) != 1:
        raise Refused(403, "refused: a console form is posted by a browser, which names its Origin")
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise Refused(403, "refused: this form was posted from another site")
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != FORM:
        raise Refused(415, f"refused: a console form is sent as {FORM}")
    raw = await visit.service.body(request)
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=100)  # fmt: skip
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "refused: the form is not UTF-8 form data") from None
    form: dict[str, str] = {}
    for k, v in pairs:
        if k in form:
            raise Refused(400, f"refused: the form field {k!r} was sent twice")
        form[k] = v
    person = visit.person
    sessions = visit.service.sessions
    if person is None or sessions is None:
        raise Refused(401, "log in first: your session has ended or never began")
    if not sessions.csrf_ok(person, form.get("csrf")):
        raise Refused(403, "refused: the form's CSRF token is missing or stale; reload the page")
    roles = (role,) if isinstance(role, str) else role
    if not any(person.may(r) for r in roles):
        raise Refused(403, f"refused: {person.name} may not do this (needs the "
                           f"{' or '.join(roles)} role; you have {person.roles})")  # fmt: skip
    return form


def raw_action_id(request: Request) -> str:
    """The id of ``/ui/actions/{id}``, percent-decoded exactly once from the raw path."""
    from urllib.parse import unquote_to_bytes

    raw = request.scope.get("raw_path")
    head = f"{PREFIX}/actions/"
    text = raw.decode("latin-1").split("?", 1)[0] if raw else request.url.path
    if not text.startswith(head) or "/" in text[len(head) :] or len(text) == len(head):
        raise Refused(404, "no such page; an action id's '/' is written %2F")
    try:
        value = unquote_to_bytes(text[len(head) :]).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(422, "the action id in the path is not percent-encoded UTF-8") from None
    if not value or len(value) > MAX_ID:  # any id the ledger holds can be looked at
        raise Refused(422, f"the action id in the path is empty or longer than {MAX_ID} characters")
    return value


def redirect(url: str) -> Response:
    from starlette.responses import RedirectResponse

    return RedirectResponse(url, status_code=303, headers=HEADERS)


# ------------------------------------------------------------------ login


async def login_page(visit: Visit) -> Response:
    if visit.request.method == "GET":
        if visit.person is not None:
            return redirect(f"{PREFIX}/")
        return visit.page("login.html", nav="login", nonce=_nonce(visit), name="")
    return await _login(visit)


def _nonce(visit: Visit) -> str:
    sessions = visit.service.sessions
    if sessions is None or sessions.key is None:
        return ""
    return sessions.seal({"login": int(time.time()) + 900})


async def _login(visit: Visit) -> Response:
    from starlette.responses import Response as Plain

    sessions = visit.service.sessions
    if sessions is None or sessions.key is None:
        raise Refused(503, "the console has no signing key: set [serve.ui] session_secret "
                           "or an API token (docs/console.md)")  # fmt: skip
    request = visit.request
    if len(request.headers.getlist("origin")) != 1:
        raise Refused(403, "refused: a console form is posted by a browser, which names its Origin")
    raw = await visit.service.body(request)
    form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    nonce = sessions.unseal(form.get("nonce", ""))
    if not nonce or not isinstance(nonce.get("login"), int) or nonce["login"] < time.time():
        raise Refused(403, "refused: the login form is stale; reload the page")
    name = form.get("name", "").strip() or None
    if name is not None and name_problem(name):
        return visit.page("login.html", 422, nav="login", nonce=_nonce(visit), name=name,
                          error=f"Your name: {name_problem(name)}.")  # fmt: skip
    person = sessions.login(form.get("token", "").strip(), name)
    if person is None:
        visit.service.emit("login", level="warning", refused="the token is not valid")
        return visit.page("login.html", 401, nav="login", nonce=_nonce(visit), name=name or "",
                          error="That token is not valid.")  # fmt: skip
    visit.service.emit("login", actor=person.actor)
    response: Plain = redirect(f"{PREFIX}/")
    set_session(visit, response, person)
    return response


async def logout(visit: Visit) -> Response:
    await form_of(visit, "read")
    response = redirect(f"{PREFIX}/login")
    response.delete_cookie(COOKIE, path=f"{PREFIX}/", httponly=True, samesite="strict")
    return response


# ------------------------------------------------------------------ the queue


@dataclass(frozen=True)
class Filter:
    """The queue's filters, as the page's query string holds them."""

    values: dict[str, str]

    @classmethod
    def of(cls, source: Any) -> Filter:
        return cls(
            {k: str(source.get(k)).strip() for k in FILTERS if str(source.get(k) or "").strip()}
        )

    def query(self, **extra: str) -> str:
        return urlencode({**self.values, **extra})

    def selection(self, s: Session, now: Any) -> Any:
        """The ledger's ``Selection``, as ``settled queue`` makes it from these options
        (an unknown name, status, delivery or sort is a ``SettledError``)."""
        from ..cli.common import parse_duration
        from ..cli.listing import parse_statuses
        from ..cli.queue_cmd import parse_deliveries, parse_match, parse_sort
        from ..clock import plus, to_text
        from ..storage.base import Selection
        from .api import _check_names

        v = self.values
        provider, operation = v.get("provider"), v.get("operation")
        _check_names(s, provider, operation)

        def ago(raw: str | None) -> str | None:
            return None if raw is None else to_text(plus(now, -parse_duration(raw)))

        return Selection(
            statuses=parse_statuses(v.get("status", "DENIED_UNRESOLVED")),
            provider=provider, operation=operation,
            created_before=ago(v.get("older_than")), created_after=ago(v.get("since")),
            also_contradicted="status" not in v,
            delivery=parse_deliveries(v["delivery"]) if "delivery" in v else None,
            match=parse_match(v["match"]) if "match" in v else None,
            sort=parse_sort(v.get("sort", "created_at")), reverse=v.get("reverse") == "1",
        )  # fmt: skip


async def queue(visit: Visit) -> Response:
    from ..cli.common import STATUSES
    from ..cli.queue_cmd import DELIVERIES
    from ..cli.stats_cmd import summarise
    from ..clock import to_text
    from ..storage.query import SORT_FIELDS

    filt = Filter.of(visit.request.query_params)

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        out: dict[str, Any] = {"now": now, "rows": [], "total": 0, "error": ""}
        names = set(ledger.names()) | _configured(s)
        out["names_p"] = sorted({p for p, _ in names})
        out["names_o"] = sorted({o for _, o in names})
        try:
            sel = filt.selection(s, now)
        except SettledError as exc:
            out["error"] = str(exc)
            sel = None
        out["stats"] = summarise(ledger.stats(_everything(), now=to_text(now), by="operation"),
                                 "operation")  # fmt: skip
        if sel is not None:
            rows = ledger.records(replace(sel, limit=QUEUE_LIMIT))
            out["total"] = ledger.count(sel) if len(rows) >= QUEUE_LIMIT else len(rows)
            out["rows"] = [(r, next_in_words(r, now)) for r in rows]
        return out

    data = await visit.run(work)
    error = data.pop("error")
    return visit.page(
        "queue.html", 422 if error else 200, nav="queue", filter=filt, error=error,
        statuses=STATUSES, deliveries=DELIVERIES, sorts=SORT_FIELDS, dos=DOS,
        shown_limit=QUEUE_LIMIT, **data,
    )  # fmt: skip


def _everything() -> Any:
    from ..storage.base import Selection

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


# ------------------------------------------------------------------ one action

# The CLI's ``next`` (its short form, with ages) in the console's words: a person here
# presses a button rather than typing a command.
CONSOLE_NEXT = {
    "settled retry": "a retry (the Retry button)",
    "settled reconcile": "a check with the provider (Check now)",
    "confirm/dispatch": "a confirmation (Confirm and send), or its dispatch",
    "needs a person": "a person's verdict (Give your verdict)",
}


def next_in_words(rec: Any, now: Any) -> str:
    """What settles ``rec`` next, as ``settled queue`` says it, with the console's
    buttons for the commands it names."""
    from ..cli.common import next_step

    short = next_step(rec, now)
    return CONSOLE_NEXT.get(short, short)


def allowed(rec: Any, now: Any) -> dict[str, Any]:
    """The verdicts the core would take on this record now (none is taken here)."""
    from ..cli.common import queryable
    from ..dispatch import retry_problem
    from ..policy import recheck_needed, resolution
    from ..reconcile import why_unchecked

    def may_resolve(applied: bool) -> bool:
        return resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None

    return {
        "resolve_applied": may_resolve(True),
        "resolve_not_applied": may_resolve(False),
        "recheck_first": not recheck_needed(rec, rec.declared),
        "confirm": str(rec.status) == "PENDING",
        "retry": not retry_problem(rec),
        "retry_why": retry_problem(rec),
        "reconcile": queryable(rec) and not why_unchecked(rec, now),
    }


async def action(visit: Visit) -> Response:
    aid = raw_action_id(visit.request)
    if visit.request.method == "POST":
        return await verdict(visit, aid)
    did = visit.request.query_params.get("did", "")
    visit.notice = DONE.get(did, "")
    return await _action_page(visit, aid)


async def _action_page(visit: Visit, aid: str, status: int = 200, error: str = "") -> Response:
    from ..cli.common import config_secrets, redact_params
    from ..cli.listing import event_detail
    from .api import config_changes

    secrets = [*config_secrets(visit.service.config), *visit.service.tokens.secrets]

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = ledger.get(aid)
        now = ledger.clock(anchor=False).now()
        events = ledger.events(aid)
        timeline = [(e, event_detail(e)) for e in events]
        touched = [(e, d) for e, d in timeline if str(e.kind) in ("reconciled", "callback",
                   "unresolved", "late_outcome", "note") or "check" in d]  # fmt: skip
        return {
            "rec": rec, "now": now, "timeline": timeline, "touched": touched,
            "params": redact_params(rec.params, secrets), "next": next_in_words(rec, now),
            "changes": config_changes(s, rec), "waiting": ledger.pending_callbacks(rec),
            "may": allowed(rec, now),
        }  # fmt: skip

    data = await visit.run(work)
    return visit.page("action.html", status, nav="queue", error=error, **data)


async def verdict(visit: Visit, aid: str) -> Response:
    """One verdict on one action, through the core; then back to its page."""
    from ..errors import EffectVisible, NotFound

    form = await form_of(visit, "read")
    do = form.get("do", "")
    person = visit.person
    assert person is not None
    roles = ("dispatch", "operate") if do == "confirm" else ("operate",)
    if not any(person.may(r) for r in roles):
        raise Refused(403, f"refused: {person.name} may not do this (needs the "
                           f"{' or '.join(roles)} role; you have {person.roles})")  # fmt: skip
    recheck = form.get("no_recheck") != "1"

    def work(s: Session) -> str:
        from ..resolve import resolve as do_resolve

        ledger = s.ledger()
        if do == "resolve":
            applied = {"applied": True, "not_applied": False}.get(form.get("verdict", ""))
            if applied is None:
                raise Refused(422, "say what happened: applied or not applied")
            reason = form.get("reason", "").strip()
            if not reason:
                raise Refused(422, "a reason is required: say how you know")
            do_resolve(ledger, aid, applied=applied, reason=reason, by=person.by,
                       now=ledger.clock().now(), evidence=form.get("evidence", "").strip() or None,
                       object_id=form.get("object_id", "").strip() or None,
                       registry=s.registry(), recheck=recheck)  # fmt: skip
            return "resolved"
        if do == "confirm":
            report = s.dispatcher(person.actor).confirm(aid)
            if str(report.outcome) == "not_found":
                raise NotFound(f"no action {aid!r}")
            return f"confirm-{report.outcome}"
        if do == "retry":
            s.dispatcher(person.actor).retry(aid, recheck=recheck)
            return "retried"
        if do == "reconcile":
            s.reconciler(actor=person.actor).run_ids([aid])
            return "reconciled"
        raise Refused(422, "unknown verdict")

    try:
        did = await visit.service.run(work)
    except EffectVisible as exc:  # rule 14: the world answered first; the record settled by it
        return await _action_page(visit, aid, 409, f"Refused: {exc}")
    except SettledError as exc:
        visit.service.emit_error(exc, visit.request)
        if isinstance(exc, NotFound):
            raise Refused(404, str(exc)) from None
        return await _action_page(visit, aid, 409 if not _is_input(exc) else 422,
                                  f"Refused: {exc}")  # fmt: skip
    return redirect(f"{aid_url(aid)}?did={did}")


def _is_input(exc: Exception) -> bool:
    from ..errors import InvalidInput

    return isinstance(exc, InvalidInput)


# ------------------------------------------------------------------ bulk


@dataclass
class Bulk:
    """A verdict on everything a filter selects: the targets and what each becomes."""

    do: str
    recheck: bool
    targets: list[Any]
    becomes: dict[str, str]
    total: int

    @property
    def ids(self) -> list[str]:
        return [t.action_id for t in self.targets if not t.skip]


def plan_bulk(s: Session, filt: Filter, do: str, recheck: bool) -> Bulk:
    """The CLI's plan for this verdict on the filter's selection (``select.plan``'s
    rules: each record with why it is left alone, oldest first)."""
    from ..cli.select import Target
    from ..cli.verdicts import _becomes, _next_attempt, _resolvable, _retryable
    from ..reconcile import why_unchecked

    if do not in DOS:
        raise Refused(422, f"choose what to do: {', '.join(DOS)}")
    ledger = s.ledger()
    now = ledger.clock(anchor=False).now()
    sel = filt.selection(s, now)
    rows = ledger.records(replace(sel, limit=MAX_BULK + 1))
    if len(rows) > MAX_BULK:
        raise Refused(422, f"the filter selects more than {MAX_BULK} actions: narrow it")
    why: Callable[[Any], str]
    becomes: Callable[[Any], str]
    if do.startswith("resolve"):
        applied = do == "resolve_applied"
        why, becomes = (lambda r: _resolvable(r, applied, now)), _becomes(applied, recheck)
    elif do == "retry":
        why, becomes = _retryable, _next_attempt(recheck)
    else:
        why, becomes = (lambda r: str(why_unchecked(r, now))), (lambda t: "checked now")
    targets = [Target(r.action_id, r, why(r)) for r in rows]
    return Bulk(do, recheck, targets, {t.action_id: becomes(t) for t in targets if not t.skip},
                len(rows))  # fmt: skip


async def bulk(visit: Visit) -> Response:
    if visit.request.method == "GET":
        return await _bulk_preview(visit, Filter.of(visit.request.query_params),
                                   visit.request.query_params.get("do", ""),
                                   visit.request.query_params.get("no_recheck") != "1")  # fmt: skip
    return await _bulk_run(visit)


async def _bulk_preview(visit: Visit, filt: Filter, do: str, recheck: bool, status: int = 200,
                        error: str = "", form: dict[str, str] | None = None) -> Response:  # fmt: skip
    assert visit.person is not None
    sessions = visit.service.sessions
    assert sessions is not None
    plan = await visit.run(lambda s: (plan_bulk(s, filt, do, recheck),
                                      s.ledger().clock(anchor=False).now()))  # fmt: skip
    b, now = plan
    return visit.page(
        "bulk.html", status, nav="queue", filter=filt, bulk=b, now=now, dos=DOS, error=error,
        digest=sessions.preview_digest(visit.person, b.ids), form=form or {},
        writable=visit.person.may("operate"),
    )  # fmt: skip


async def _bulk_run(visit: Visit) -> Response:
    form = await form_of(visit, "operate")
    person, sessions = visit.person, visit.service.sessions
    assert person is not None and sessions is not None
    filt = Filter.of(form)
    do, recheck = form.get("do", ""), form.get("no_recheck") != "1"
    reason = form.get("reason", "").strip()
    if do.startswith("resolve") and not reason:
        return await _bulk_preview(visit, filt, do, recheck, 422,
                                   "A reason is required: say how you know.", form)  # fmt: skip

    def work(s: Session) -> Any:
        b = plan_bulk(s, filt, do, recheck)
        if sessions.preview_digest(person, b.ids) != form.get("digest"):
            return b, None
        if form.get("typed", "").strip() != str(len(b.ids)):
            return b, "typed"
        return b, _act(s, b, person, form)

    b, results = await visit.run(work)
    if results is None:
        return await _bulk_preview(visit, filt, do, recheck, 409, "The selection changed since "
                                   "your preview: nothing was done. Review it again.", form)  # fmt: skip
    if results == "typed":
        return await _bulk_preview(visit, filt, do, recheck, 422, f"Type {len(b.ids)} (the number "
                                   "of actions) to confirm: nothing was done.", form)  # fmt: skip
    visit.service.emit("bulk", actor=person.actor, do=do, count=len(b.ids))
    return visit.page("bulk_done.html", nav="queue", bulk=b, results=results, filter=filt, dos=DOS)


def _act(s: Session, b: Bulk, person: Person, form: dict[str, str]) -> list[tuple[str, str, str]]:
    """The verdict on each planned record, one checked move each: (id, status, note)."""
    from ..cli.verdicts import _record

    ledger = s.ledger()
    out: list[tuple[str, str, str]] = []
    if b.do.startswith("resolve"):
        verdict = {"applied": b.do == "resolve_applied", "reason": form.get("reason", "").strip(),
                   "by": person.by, "evidence": form.get("evidence", "").strip() or None,
                   "object_id": None, "now": ledger.clock().now(), "registry": s.registry(),
                   "recheck": b.recheck}  # fmt: skip
        _code, done = _record(ledger, b.targets, verdict, bar=False)
        for t in done:
            status = str(t.record.status) if t.record is not None else "-"
            out.append((t.action_id, status, t.skip or "recorded"))
        return out
    for t in b.targets:
        if t.skip:
            out.append((t.action_id, str(t.record.status), t.skip))
    if b.do == "retry":
        d = s.dispatcher(person.actor)
        providers = sorted({t.record.provider for t in b.targets if not t.skip})
        threads = {p: s.send_concurrency(p) for p in providers}
        for r in d.retry_many(b.ids, recheck=b.recheck, concurrency=threads):
            rec = r.report.record if r.report is not None else None
            if rec is not None:
                out.append((rec.action_id, str(rec.status), f"attempt {rec.attempt}"))
            else:
                now = ledger.find(str(r.action_id))
                out.append((str(r.action_id), str(now.status) if now else "-", r.problem))
        return out
    if b.ids:
        s.reconciler(actor=person.actor).run_ids(b.ids)
    for aid in b.ids:
        rec = ledger.get(aid)
        out.append((aid, str(rec.status), rec.reason or ""))
    return out


# ------------------------------------------------------------------ providers and stats


async def providers(visit: Visit) -> Response:
    from ..audit import audit

    def work(s: Session) -> dict[str, Any]:
        reg = s.registry()
        reg.load_all()
        specs = {(n, o): spec for n in reg.names()
                 for o, spec in reg.provider(n).operations().items()}  # fmt: skip
        report = audit(s.ledger(), specs, s.config().callbacks)
        return {"ops": report.operations, "kept": report.callbacks, "debt": report.debt,
                "callbacks": s.config().callbacks}  # fmt: skip

    return visit.page("providers.html", nav="providers", **(await visit.run(work)))


async def stats(visit: Visit) -> Response:
    from ..cli.stats_cmd import OPEN, summarise
    from ..clock import plus, to_text
    from ..storage.base import Selection

    windows = (("last hour", 3600.0), ("last day", 86400.0), ("last week", 7 * 86400.0))

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        data = summarise(ledger.stats(Selection(), now=to_text(now), by="provider"), "provider")
        over: list[tuple[str, list[int]]] = []
        for g in data["groups"]:
            counts = []
            for _label, secs in windows:
                sel = Selection(statuses=["DENIED_UNRESOLVED"], provider=g["key"],
                                created_after=to_text(plus(now, -secs)))  # fmt: skip
                counts.append(ledger.count(sel))
            over.append((g["key"], counts))
        return {"data": data, "over": over, "windows": [w for w, _ in windows], "open": OPEN,
                "now": now}  # fmt: skip

    return visit.page("stats.html", nav="stats", **(await visit.run(work)))


# ------------------------------------------------------------------ static files


async def static(request: Request) -> Response:
    from starlette.responses import Response as Plain

    name = request.path_params["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        raise Problem(404, "no such file")
    headers = {**HEADERS, "Cache-Control": "max-age=300"}
    return Plain(path.read_bytes(), media_type=STATIC_TYPES[path.suffix], headers=headers)


def routes() -> list[Any]:
    from starlette.routing import Route

    async def home(request: Request) -> Response:
        return redirect(f"{PREFIX}/")

    return [
        Route(PREFIX, home, methods=["GET"]),
        Route(f"{PREFIX}/", page_route(queue), methods=["GET"]),
        Route(f"{PREFIX}/login", page_route(login_page, login=False), methods=["GET", "POST"]),
        Route(f"{PREFIX}/logout", page_route(logout), methods=["POST"]),
        Route(f"{PREFIX}/actions/{{id:path}}", page_route(action), methods=["GET", "POST"]),
        Route(f"{PREFIX}/bulk", page_route(bulk), methods=["GET", "POST"]),
        Route(f"{PREFIX}/providers", page_route(providers), methods=["GET"]),
        Route(f"{PREFIX}/stats", page_route(stats), methods=["GET"]),
        Route(f"{PREFIX}/static/{{name}}", static, methods=["GET"]),
    ]


__all__ = ["DOS", "MAX_BULK", "Filter", "allowed", "plan_bulk", "routes"]
