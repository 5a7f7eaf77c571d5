"""``/ui/login`` and ``/ui/logout``: a token (and a name) for a signed session, each
login form's nonce taken once, wrong tokens throttled per address and per name
(``settled.serve.logins``).
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from ..auth import name_problem
from ..logins import keys_for
from ..sessions import COOKIE
from .page_kit import (
    PageRoute,
    Refused,
    Visit,
    form_of,
    redirect,
    safe_next,
    set_session,
)
from .rendering import PREFIX

if TYPE_CHECKING:
    from starlette.responses import Response


NONCE_TTL = 900  # s a login form may wait before it is sent (its nonce is taken once)


async def login_page(visit: Visit) -> Response:
    if visit.request.method == "GET":
        after = safe_next(visit.request.query_params.get("next")) or ""
        if visit.person is not None:
            return redirect(after or f"{PREFIX}/")
        return visit.page("login.html", nav="login", nonce=_nonce(visit), name="", next=after)
    return await _login(visit)


def _nonce(visit: Visit) -> str:
    """The login form's nonce: signed, with its expiry and an id, taken once."""
    sessions = visit.service.sessions
    if sessions is None or sessions.key is None:
        return ""
    return sessions.seal({"login": int(time.time()) + NONCE_TTL, "id": secrets.token_hex(12)})


def _throttled(visit: Visit, wait: int, name: str | None, after: str = "") -> Response:
    """429: too many wrong tokens from this address or for this name; the token sent
    was not looked at."""
    visit.service.emit("login", level="warning", refused=f"throttled for {wait} s")
    response = visit.page(
        "login.html",
        429,
        nav="login",
        nonce=_nonce(visit),
        name=name or "",
        next=after,
        error=f"Too many wrong tokens from your address or for this name: try again in {wait} s.",
    )
    response.headers["Retry-After"] = str(wait)
    return response


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
    raw = await visit.service.body(request, authenticated=False)
    form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    after = safe_next(form.get("next")) or ""
    nonce = sessions.unseal(form.get("nonce", ""))
    now = time.time()
    if (
        not nonce
        or not isinstance(nonce.get("login"), int)
        or not isinstance(nonce.get("id"), str)
        or nonce["login"] < now
    ):
        raise Refused(403, "refused: the login form is stale; reload the page")
    logins = visit.service.logins
    if not logins.take(nonce["id"], nonce["login"], now):
        raise Refused(403, "refused: this login form was sent already; reload the page")
    name = form.get("name", "").strip() or None
    # the address a trusted proxy reports (uvicorn's proxy headers), else the peer's
    keys = keys_for(request.client.host if request.client else None, name)
    wait = logins.wait(keys)
    if wait:
        return _throttled(visit, wait, name, after)
    if name is not None and name_problem(name):
        return visit.page(
            "login.html",
            422,
            nav="login",
            nonce=_nonce(visit),
            name=name,
            next=after,
            error=f"Your name: {name_problem(name)}.",
        )
    person = sessions.login(form.get("token", "").strip(), name)
    if person is None:
        logins.failed(keys)
        visit.service.emit("login", level="warning", refused="the token is not valid")
        return visit.page(
            "login.html",
            401,
            nav="login",
            nonce=_nonce(visit),
            name=name or "",
            next=after,
            error="That token is not valid.",
        )
    logins.succeeded(keys)
    visit.service.emit("login", actor=person.actor)
    response: Plain = redirect(after or f"{PREFIX}/")
    set_session(visit, response, person)
    return response


async def logout(visit: Visit) -> Response:
    await form_of(visit, "read")
    response = redirect(f"{PREFIX}/login")
    response.delete_cookie(COOKIE, path=f"{PREFIX}/", httponly=True, samesite="strict")
    return response


ROUTES = (
    PageRoute("/login", login_page, ("GET", "POST"), login=False),
    PageRoute("/logout", logout, ("POST",)),
)

__all__ = ["ROUTES", "login_page", "logout"]
