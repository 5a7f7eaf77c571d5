"""``/ui/``: the console, pages rendered on the server from the same core as the CLI.

Routes (every one answers HTML with ``rendering.HEADERS``):

    GET  /ui/                 the queue: the CLI's filters and sort, counts by cause
    GET  /ui/actions/{id}     one action: what it was, where it stands, its timeline
    POST /ui/actions/{id}     a verdict on it (``do`` = resolve, confirm, retry, reconcile)
    GET  /ui/bulk             the preview of a verdict on everything a filter selects
    POST /ui/bulk             that verdict, on exactly the records the preview showed
    GET  /ui/providers        each operation's declaration, callbacks and audit debt
    GET  /ui/stats            counts, ages and reasons
    GET  /ui/audit            who did what (``settled log``)
    GET  /ui/export           the queue's current filter as CSV or JSON (``format``)
    GET  /ui/login, POST /ui/login, POST /ui/logout   (throttled: ``settled.serve.logins``)
    GET  /ui/static/{name}    the console's own stylesheet and script

A GET never changes anything. A POST needs a session (``settled.serve.sessions``), an
``Origin`` of this service, the form's CSRF token, and the role: ``operate`` for
verdicts, ``dispatch`` or ``operate`` to confirm. A refused POST changes nothing.

Each page is one module with its template (``queue_page``, ``action_page``,
``bulk_page``, ``providers_page``, ``stats_page``, ``audit_page``, ``export_page``,
``login_page``), routed here (``routes``); what the pages share is ``page_kit`` (the
visit, the checks of a form, the queue's filter) and ``rendering`` (the Jinja2
environment and the headers). No rule lives here: a verdict is
``settled.resolve.resolve`` (rule 14's check first), a retry the dispatcher's, a bulk
preview ``settled.advice`` (``resolvable``, ``retryable``, ``verdict_becomes``, as the
CLI's), the queue's selection ``settled.selection`` (as ``settled queue``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..problems import Problem
from . import (
    action_page,
    audit_page,
    bulk_page,
    export_page,
    login_page,
    providers_page,
    queue_page,
    stats_page,
)
from .page_kit import Refused, Visit, page_route, redirect
from .rendering import HEADERS, PREFIX, STATIC

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


# The pages, each with its routes (``ROUTES``), in matching order.
PAGES = (
    queue_page,
    login_page,
    action_page,
    bulk_page,
    providers_page,
    stats_page,
    audit_page,
    export_page,
)


def routes() -> list[Any]:
    """The console's routes under ``/ui``: each page's from the module that renders it
    (so no page module imports another), then the static files and, last, any other
    path, answered as a console page."""
    from starlette.routing import Route

    async def home(request: Any) -> Any:
        return redirect(f"{PREFIX}/")

    return [
        Route(PREFIX, home, methods=["GET"]),
        *(r.route() for m in PAGES for r in m.ROUTES),
        Route(f"{PREFIX}/static/{{name}}", static, methods=["GET"]),
        Route(f"{PREFIX}/{{rest:path}}", page_route(unknown, login=False)),
    ]


async def unknown(visit: Visit) -> Response:
    """Any other path under ``/ui/``: a console page that says so (not the API's JSON)."""
    raise Refused(404, "There is no such page in the console.")


async def static(request: Request) -> Response:
    from starlette.responses import Response as Plain

    name = request.path_params["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES or not path.is_file():
        raise Problem(404, "no such file")
    headers = {**HEADERS, "Cache-Control": "max-age=300"}
    return Plain(path.read_bytes(), media_type=STATIC_TYPES[path.suffix], headers=headers)


__all__ = ["PAGES", "routes"]
