"""Errors as HTTP answers: ``application/problem+json`` (RFC 9457), converted in one place.

Every refusal the service gives is a :class:`Problem` (``type``, ``title``, ``status``,
``detail``, and ``action_id`` where one is concerned), with the CLI's meanings::

    400 malformed        the body is not JSON (or not UTF-8, or holds NaN / a lone surrogate)
    401 unauthorized     no token, a wrong one, or a token in the query string
    403 forbidden        the token lacks the role; or a cross-origin write
    404 not-found        no such action (exit 6), or no such route
    405 method-not-allowed
    409 conflict         same id with other params; a move not allowed now (exit 7)
    413 too-large        the body is over ``[serve] max_body``
    415 unsupported-media-type   a body that is not application/json
    421 misdirected      a Host header this service does not answer to
    422 invalid-input    input that can never work (exit 1's bad input)
    500 internal         a bug (one line in the log; never a traceback to the client)
    503 unavailable      the ledger is busy or unreadable; retry later

``problem_for`` maps settled's own errors (``settled.errors``) to these. Details are
one line; a ledger's location never leaves the server (it is logged there).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import (
    ConfigError,
    Conflict,
    EffectVisible,
    InvalidInput,
    LedgerBusy,
    LedgerError,
    MissingExtra,
    NotFound,
    OutcomeNotRecorded,
    SettledError,
    UnknownProvider,
)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:settled:problem:"
TITLES = {
    400: ("malformed", "Malformed request"),
    401: ("unauthorized", "Unauthorized"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    408: ("request-timeout", "Request timeout"),
    409: ("conflict", "Conflict"),
    413: ("too-large", "Request body too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    421: ("misdirected", "Misdirected request"),
    422: ("invalid-input", "Invalid input"),
    429: ("too-many-requests", "Too many requests"),
    500: ("internal", "Internal error"),
    503: ("unavailable", "Service unavailable"),
}
MAX_DETAIL = 1000


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:MAX_DETAIL]


class Problem(Exception):
    """An HTTP refusal with its problem document. ``extra`` members are added to the
    document (``action_id``); ``headers`` to the response (``WWW-Authenticate``)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = one_line(detail)
        self.headers = headers or {}
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        slug, title = TITLES.get(self.status, ("error", "Error"))
        return {
            "type": TYPE_BASE + slug,
            "title": title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }

    def body(self) -> bytes:
        return json.dumps(self.to_json(), ensure_ascii=False).encode("utf-8")

    def response(self) -> Any:
        from starlette.responses import Response

        return Response(
            self.body(), status_code=self.status, media_type=MEDIA_TYPE, headers=self.headers
        )

    async def send(self, send: Any) -> None:
        """Answer a raw ASGI request with this problem (for the middleware, which
        refuses before any route runs)."""
        body = self.body()
        headers = [
            (b"content-type", MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()),
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def problem_for(exc: SettledError, action_id: str | None = None) -> Problem:
    """settled's own error as a problem, with the CLI's meaning of each (exit codes
    6, 7 and 1 become 404, 409 and 422)."""
    if isinstance(exc, NotFound):
        what = f"no action {action_id!r}" if action_id is not None else "not found"
        return Problem(404, what, action_id=action_id)
    if isinstance(exc, EffectVisible):  # rule 14: refused, and settled by what the check saw
        status = getattr(exc.record, "status", None)
        return Problem(
            409,
            _api_words(str(exc)),
            action_id=action_id,
            record_status=str(status) if status is not None else None,
        )
    if isinstance(exc, Conflict):
        return Problem(409, _api_words(str(exc)), action_id=action_id)
    if isinstance(exc, (InvalidInput, UnknownProvider)):
        return Problem(422, _api_words(str(exc)), action_id=action_id)
    if isinstance(exc, OutcomeNotRecorded):
        return Problem(
            503,
            "the request was sent, but its outcome could not be recorded; the action stays "
            "IN_FLIGHT until its lease lapses, then reconciliation settles it: GET it later",
            action_id=exc.action_id,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, LedgerBusy):
        return Problem(
            503,
            "the ledger is busy; nothing was changed: try again",
            action_id=action_id,
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, LedgerError):
        return Problem(
            503,
            "the ledger cannot be used now; see the server's log",
            action_id=action_id,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, (ConfigError, MissingExtra)):
        return Problem(
            500, "the server's configuration cannot serve this; see its log", action_id=action_id
        )
    return Problem(500, "internal error; see the server's log", action_id=action_id)


def _api_words(message: str) -> str:
    """The core's message, with the CLI's flag names as the API's field names."""
    for flag, field in (
        ("--action-id", "action_id"),
        ("--params", "params"),
        ("--reason", "reason"),
        ("--by", "by"),
    ):
        message = message.replace(flag, field)
    return message


__all__ = ["MEDIA_TYPE", "TITLES", "TYPE_BASE", "Problem", "problem_for"]
