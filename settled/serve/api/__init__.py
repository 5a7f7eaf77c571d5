"""``/api/v1``: JSON for apps. Each route parses, calls the core in a worker thread with a
pooled session, and renders the record as the CLI's ``--json`` does; no rule lives here.

The route table is ``ENDPOINTS``, here: the OpenAPI description's own route and each
resource module's (``action_routes``, ``verdict_routes``, ``event_routes``,
``stats_routes``), in the description's order. Each entry's
:class:`~settled.serve.api.openapi.Operation` is its entry in the OpenAPI description,
and its role is checked before it runs (``endpoint``); a new route is one ``Endpoint``
in its resource's module.
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
``operator:BY via api:TOKEN`` when ``by`` is given, else of ``operator:api:TOKEN``: the
surface is the token's, made here; ``by`` only names the person the token vouches for,
is kept apart in the event (``person``, ``via``) and never holds `` via `` (422).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import action_routes, event_routes, stats_routes, verdict_routes
from .endpoint import Call, Endpoint, respond
from .openapi import Operation, document

if TYPE_CHECKING:
    from starlette.responses import Response

DOC_MAX_AGE = 300  # s a client may cache the OpenAPI description (it changes with a release)


async def openapi_json(call: Call) -> Response:
    # the one answer of the API without a record: a client may keep it for a while
    return respond(DOCUMENT, headers={"Cache-Control": f"public, max-age={DOC_MAX_AGE}"})


# The resources, each with its routes (``ENDPOINTS``), in the description's order.
RESOURCES = (action_routes, verdict_routes, event_routes, stats_routes)

ENDPOINTS: list[Endpoint] = [
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
    *(e for m in RESOURCES for e in m.ENDPOINTS),
]

DOCUMENT = document(e.op for e in ENDPOINTS)


def routes() -> list[Any]:
    """The API's routes (Starlette), in the table's order; a path that two routes
    share (``/actions``) gets one route per method."""
    from starlette.routing import Route

    return [Route(e.route_path, e.__call__, methods=[e.op.method]) for e in ENDPOINTS]


__all__ = ["DOCUMENT", "ENDPOINTS", "RESOURCES", "routes"]
