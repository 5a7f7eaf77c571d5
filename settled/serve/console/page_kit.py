"""What every console page shares: the visit (who, and what the page is given), its
refusals in a person's words, the checks every form passes (session, Origin, CSRF
token, role), the id of an action's path decoded once, the verdicts a bulk form offers
(``DOS``), and the queue's filter, which the queue, the export and the bulk verdict all
read (``Filter``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from ...advice import next_step
from ...clock import plus, to_text
from ...errors import EffectVisible, InvalidInput, NotFound, RecheckFailed, SettledError
from ...model import Status
from ...selection import (
    parse_causes,
    parse_deliveries,
    parse_duration,
    parse_match,
    parse_search,
    parse_sort,
    parse_statuses,
)
from ...storage.ledger import Selection
from ..lookups import check_names
from ..problems import problem_for
from ..service import Service, service_of
from ..sessions import COOKIE, Person
from .rendering import HEADERS, PREFIX, render, shown

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ...session import Session

FORM = "application/x-www-form-urlencoded"
MAX_ID = 1000  # characters of an id in a path: more than any the ledger accepts (200)
DOS = {  # what a bulk verdict may do: the queue page's form offers it, the bulk page does it
    "resolve_applied": "Resolve as applied",
    "resolve_not_applied": "Resolve as not applied",
    "retry": "Retry (new attempt)",
    "reconcile": "Check with the provider now",
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

    @property
    def csrf(self) -> str:
        assert self.service.sessions is not None and self.person is not None
        return self.service.sessions.csrf(self.person)

    def page(self, template: str, status: int = 200, **context: Any) -> Response:
        from starlette.responses import HTMLResponse

        ctx = {
            "person": self.person,
            "csrf": self.csrf if self.person else "",
            "notice": self.notice,
            "error": "",
            "nav": "",
            **context,
        }
        response = HTMLResponse(render(template, ctx), status_code=status, headers=HEADERS)
        if self.set_cookie and self.person is not None:
            set_session(self, response, self.person)
        return response

    async def run(self, fn: Any, action_id: str | None = None) -> Any:
        try:
            return await self.service.run(fn)
        except SettledError as exc:
            self.service.emit_error(exc, self.request)
            raise Refused(*plain(exc, action_id)) from None


def plain(exc: SettledError, action_id: str | None = None) -> tuple[int, str]:
    """A refusal of the core in a person's words, and its status: never the ledger's
    location, a path on the server or a CLI flag (the server's log has the details)."""
    problem = problem_for(exc, None)
    if isinstance(exc, NotFound):
        which = f" {shown(action_id)!r}" if action_id is not None else " with that id"
        return 404, f"There is no action{which} in this ledger. Check the link or search the queue."
    if isinstance(exc, EffectVisible):
        return 409, (
            "The provider shows that this did happen, so your verdict was not recorded as "
            "given: the action is now settled by the provider's evidence, and your claim "
            "is kept in its history."
        )
    if isinstance(exc, RecheckFailed):
        return 409, (
            "settled asked the provider first and could not tell whether this happened, so "
            "your verdict was not recorded; your claim is kept in its history. Look at the "
            "provider's own records, then try again."
        )
    if problem.status >= 500:
        return problem.status, problem.detail
    return problem.status, str(exc)


def set_session(visit: Visit, response: Response, person: Person) -> None:
    assert visit.service.sessions is not None
    secure = visit.request.url.scheme == "https"
    response.set_cookie(
        COOKIE,
        visit.service.sessions.cookie(person),
        max_age=visit.service.sessions.ui.session_ttl,
        path=f"{PREFIX}/",
        secure=secure,
        httponly=True,
        samesite="strict",
    )


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


MAX_NEXT = 4000  # characters of a page kept through the login: a long filter fits


def safe_next(target: str | None) -> str | None:
    """``target`` when it is a page of this console: a path under ``/ui/`` on this
    site, with its query (never a scheme, a host, ``//``, a backslash, a control
    character or a dot segment, which a browser could read as another site); else
    None. What the login sends a person on to, so it is no open redirect."""
    if not target or len(target) > MAX_NEXT or not target.isprintable() or "\\" in target:
        return None
    parts = urlsplit(target)
    path = parts.path
    if parts.scheme or parts.netloc or parts.fragment or not path.startswith(f"{PREFIX}/"):
        return None
    if path.startswith("//") or any(seg in (".", "..") for seg in path.split("/")):
        return None
    if path.startswith((f"{PREFIX}/login", f"{PREFIX}/logout", f"{PREFIX}/static/")):
        return None
    return target


@dataclass(frozen=True)
class PageRoute:
    """One route of a console page: its path under ``/ui``, the handler that renders it,
    the methods it takes, and whether it needs a login. Each page's module lists its
    own (``ROUTES``); the console's route table (``PAGES``) joins them."""

    path: str
    handler: Callable[[Visit], Awaitable[Response]]
    methods: tuple[str, ...] = ("GET",)
    login: bool = True

    def route(self) -> Any:
        from starlette.routing import Route

        endpoint = page_route(self.handler, login=self.login)
        return Route(PREFIX + self.path, endpoint, methods=list(self.methods))


def page_route(fn: Any, *, login: bool = True) -> Any:
    """A page handler: the visit made, a refusal rendered as a page (never a trace)."""

    async def endpoint(request: Request) -> Response:
        from starlette.responses import RedirectResponse

        try:
            visit = visit_of(request)
            if login and visit.person is None:
                if request.method != "GET":
                    raise Refused(401, "log in first: your session has ended or never began")
                # the page asked for is kept through the login (a link sent to a colleague)
                raw = request.scope.get("raw_path") or request.url.path.encode()
                query = request.scope.get("query_string", b"")
                asked = raw.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
                target = f"{PREFIX}/login"
                if safe_next(asked) and asked != f"{PREFIX}/":
                    target += "?" + urlencode({"next": asked})
                return RedirectResponse(target, status_code=303, headers=HEADERS)
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
        pairs = parse_qsl(
            raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=100
        )
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
        raise Refused(
            403,
            f"refused: {person.name} may not do this (needs the "
            f"{' or '.join(roles)} role; you have {person.roles})",
        )
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


# What the queue lists when no status is asked for: everything that waits for a person,
# a verdict (DENIED_UNRESOLVED), a confirmation (a held action: PENDING), and every
# settled record that later evidence contradicts. ``status=contradicted``: only those.
NEEDS_A_PERSON = (str(Status.DENIED_UNRESOLVED), str(Status.PENDING))
CONTRADICTED = "contradicted"
FILTERS = (
    "status",
    "provider",
    "operation",
    "older_than",
    "since",
    "match",
    "q",
    "cause",
    "delivery",
    "sort",
    "reverse",
    "ids",  # rows picked by hand for a bulk verdict: a JSON list of ids (``Filter.picked``)
)
MAX_PICKED = 1000  # rows one hand-picked bulk verdict may name


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

    def picked(self, ids: list[str]) -> Filter:
        """This filter narrowed to the rows a person ticked (none ticked: unchanged)."""
        import json

        if not ids:
            return self
        # ASCII JSON: a hidden field of the bulk form never holds a stored character raw
        return Filter({**self.values, "ids": json.dumps(sorted(set(ids)))})

    def picked_ids(self) -> list[str] | None:
        """The ticked rows' ids, or None when no row was ticked (an ``InvalidInput``
        when the field is not a list of ids)."""
        import json

        raw = self.values.get("ids")
        if raw is None:
            return None
        try:
            ids = json.loads(raw)
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise InvalidInput("the ticked rows are not a list of action ids; tick them again")
        if len(ids) > MAX_PICKED:
            raise InvalidInput(f"more than {MAX_PICKED} rows ticked: narrow the filter instead")
        return ids

    def selection(self, s: Session, now: Any, **instead: str) -> Any:
        """The ledger's ``Selection``, as ``settled queue`` makes it from these options
        (an unknown name, status, delivery or sort is a ``SettledError``); ``instead``
        replaces some of the values (a tile's status)."""

        v = {**self.values, **instead}
        provider, operation = v.get("provider"), v.get("operation")
        check_names(s, provider, operation)

        def ago(raw: str | None) -> str | None:
            return None if raw is None else to_text(plus(now, -parse_duration(raw)))

        status = v.get("status")
        only_contradicted = status is not None and status.strip().lower() == CONTRADICTED
        if status is None:
            # a search finds a record whatever became of it: every status unless asked
            statuses: list[str] | None = parse_statuses("all") if "q" in v else list(NEEDS_A_PERSON)
        elif only_contradicted:
            statuses = None
        else:
            statuses = parse_statuses(status)
        return Selection(
            statuses=statuses,
            provider=provider,
            operation=operation,
            created_before=ago(v.get("older_than")),
            created_after=ago(v.get("since")),
            contradicted=only_contradicted,
            also_contradicted=status is None and "q" not in v,
            delivery=parse_deliveries(v["delivery"]) if "delivery" in v else None,
            match=parse_match(v["match"]) if "match" in v else None,
            search=parse_search(v["q"]) if "q" in v else None,
            causes=parse_causes(v["cause"]) if "cause" in v else None,
            ids=self.picked_ids(),
            sort=parse_sort(v.get("sort", "triage")),
            reverse=v.get("reverse") == "1",
        )


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

    short = next_step(rec, now)
    return CONSOLE_NEXT.get(short, short)


__all__ = [
    "DOS",
    "Filter",
    "PageRoute",
    "Refused",
    "Visit",
    "form_of",
    "next_in_words",
    "page_route",
    "plain",
    "raw_action_id",
    "redirect",
    "safe_next",
]
