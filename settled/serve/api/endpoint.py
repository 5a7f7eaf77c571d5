"""One API request on its way (``Call``), and the route that makes it (``Endpoint``): the
caller authorized by role, the query's names and the action id of the path checked, the
body read as strict JSON and validated against the OpenAPI description's schemas; and
the answer written as the CLI's ``--json`` writes a record (``respond``). Each
resource's module lists its ``Endpoint``s; the package's route table joins them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from ... import tracing
from ...errors import SettledError
from ..auth import REALM, Caller, bearer
from ..problems import Problem, problem_for
from ..service import Service, service_of
from .openapi import API_PREFIX, Operation, Validators, document
from .parsing import check_id

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ...session import Session

JSON_TYPES = ("application/json",)


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
        """``fn(session)`` in a worker thread; settled's own errors become problems.
        A caller's W3C ``traceparent`` is the parent of the spans ``fn`` makes
        (``settled.tracing``: the dispatch, its tries, the check before a verdict)."""
        carried = {
            k: v for k, v in self.request.headers.items() if k in ("traceparent", "tracestate")
        }
        if carried:
            inner = fn

            def fn(s: Session) -> Any:
                with tracing.continued(carried):
                    return inner(s)

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
            aid = check_id(self.action_id(request), "action id")
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


RECORD_ANSWER = (200, ("The record.", "Record"))
NOT_FOUND = {404: ("No such action.", "Problem")}
CONFLICT = {409: ("Not allowed now (the detail says why; nothing was changed).", "Problem")}

# A body is checked against the description's schemas, which no route's entry changes.
VALIDATORS = Validators(document(()))


__all__ = ["VALIDATORS", "Call", "Endpoint", "authorize", "parse_json", "respond"]
