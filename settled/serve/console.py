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

The reading pages and one action's verdicts are ``console_views``, the bulk verdicts
``console_bulk``. No rule lives here: a verdict is ``settled.resolve.resolve`` (rule 14's check first), a
retry the dispatcher's, a bulk preview the CLI's ``plan`` rules (``why_not`` and
``becomes`` of ``settled.cli.verdicts``), the queue's selection the CLI's ``queue``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from ..errors import SettledError
from .pages import HEADERS, PREFIX, STATIC, render
from .problems import Problem
from .service import Service, service_of
from .sessions import COOKIE, Person, name_problem

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response


FORM = "application/x-www-form-urlencoded"
MAX_ID = 1000  # characters of an id in a path: more than any the ledger accepts (200)
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
        raise Refused(
            503,
            "the console has no signing key: set [serve.ui] session_secret "
            "or an API token (docs/console.md)",
        )
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
        return visit.page(
            "login.html",
            422,
            nav="login",
            nonce=_nonce(visit),
            name=name,
            error=f"Your name: {name_problem(name)}.",
        )
    person = sessions.login(form.get("token", "").strip(), name)
    if person is None:
        visit.service.emit("login", level="warning", refused="the token is not valid")
        return visit.page(
            "login.html",
            401,
            nav="login",
            nonce=_nonce(visit),
            name=name or "",
            error="That token is not valid.",
        )
    visit.service.emit("login", actor=person.actor)
    response: Plain = redirect(f"{PREFIX}/")
    set_session(visit, response, person)
    return response


async def logout(visit: Visit) -> Response:
    await form_of(visit, "read")
    response = redirect(f"{PREFIX}/login")
    response.delete_cookie(COOKIE, path=f"{PREFIX}/", httponly=True, samesite="strict")
    return response


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

    from .console_bulk import bulk
    from .console_views import action, providers, queue, stats

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


__all__ = ["Refused", "Visit", "form_of", "raw_action_id", "redirect", "routes"]
