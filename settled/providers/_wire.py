"""What the built-in HTTP providers share on the wire: one request, put on the wire
once, reported as what happened (``base.Wire``); reply bodies read with a size cap;
and a redactor that keeps secrets out of every string a provider hands back.

Nothing here retries or decides what a reply means for an action.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from .base import Wire

MAX_BODY = 1024 * 1024
TOO_BIG = f"reply larger than {MAX_BODY} bytes, not read"

# Raised before any byte of the request left this machine.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True)
class Exchange:
    """One request's fate. ``body`` is None when no status line came back, or when
    the reply was too large or unreadable (``problem`` says which)."""

    wire: Wire
    status_code: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code <= 299


def exchange(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
    content: bytes | None = None,
    extensions: Mapping[str, Any] | None = None,
    redact: Redactor | None = None,
) -> Exchange:
    """Put one request on the wire and report what happened; never raises for
    transport trouble."""
    scrub = redact or Redactor()
    kwargs: dict[str, Any] = {"headers": dict(headers or {}), "timeout": timeout}
    if json_body is not None:
        kwargs["json"] = json_body
    elif content is not None:
        kwargs["content"] = content
    if extensions:
        kwargs["extensions"] = dict(extensions)
    try:
        with client.stream(method, url, **kwargs) as resp:
            raw, problem = read_capped(resp)
    except NOT_SENT as exc:
        # Nothing left this machine: refused, unreachable, TLS refused, no free connection.
        return Exchange(Wire.NOT_CONNECTED, problem=scrub(describe(exc)))
    except httpx.TransportError as exc:
        # Sent, or maybe sent, and no status line came back.
        return Exchange(Wire.NO_ANSWER, problem=scrub(describe(exc)))
    return Exchange(Wire.ANSWERED, resp.status_code, dict(resp.headers), raw, scrub(problem))


def read_capped(resp: httpx.Response) -> tuple[bytes | None, str]:
    """The body, or ``(None, why)`` when it is larger than MAX_BODY or unreadable.

    Stops reading at the cap, so a huge reply never sits in memory; leaving the
    ``stream`` block then closes the connection instead of draining it."""
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None, TOO_BIG
    buf = bytearray()
    try:
        for chunk in resp.iter_bytes():
            buf += chunk
            if len(buf) > MAX_BODY:
                return None, TOO_BIG
    except (httpx.TransportError, httpx.DecodingError) as exc:
        return None, f"reply body unreadable: {describe(exc)}"
    return bytes(buf), ""


def parse_json(raw: bytes) -> tuple[Any, str]:
    try:
        return json.loads(raw), ""
    except UnicodeDecodeError:
        return None, "reply body is not valid UTF-8"
    except ValueError:
        return None, "reply body is not JSON"


def describe(exc: Exception) -> str:
    """``Type: message`` for an httpx error. httpx puts no request headers in its
    messages; callers still pass the result through their ``Redactor``."""
    text = str(exc) or "no message"
    return f"{type(exc).__name__}: {text}"


def excerpt(raw: bytes, limit: int = 200) -> str:
    return raw[:limit].decode("utf-8", "replace")


class Redactor:
    """Replaces every known secret (an expanded ``${VAR}``, a password) with ``***``
    in a string, so no detail, reason or evidence a provider returns can carry one —
    not even when a server echoes a header back in an error body."""

    MASK = "***"

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, self.MASK)
        return text

    def value(self, obj: Any) -> Any:
        """The same for every string inside a JSON-like value."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, Mapping):
            return {self(str(k)): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj
