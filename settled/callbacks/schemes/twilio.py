"""``twilio``: Twilio's status callbacks and webhooks.

``X-Twilio-Signature``: base64 HMAC-SHA1 with the auth token (HMAC-SHA256 where
``X-Twilio-Webhooks-Signature-Settings`` says so) of the URL Twilio called followed by
each form parameter's name and value, sorted; with and without the default port, as
Twilio's own validator accepts. The URL is the config's ``url`` (the hook's public URL
as Twilio has it) plus the query string as received: settled never trusts ``Host`` or
``X-Forwarded-*`` for it. A JSON body is signed through ``bodySHA256`` in the query
string. Reading the form pairs is part of the signature, not of the body's meaning.

Twilio signs the URL, so a key may be read from its query string (``key = "?NAME"``).
It has no event id: the message id and its status together stand for one. An account
has a primary and a secondary auth token: configure both (``secrets``) while one is
promoted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...checks import has_control
from .scheme import BAD, Fail, Message, Scheme, Signed, same


@dataclass(frozen=True)
class Twilio(Scheme):
    name = "twilio"
    options = ("url",)
    signs = "HMAC-SHA1 of the URL and the sorted form fields"
    signs_url = True
    form = True
    url: str = ""

    @classmethod
    def parse(cls, table: Mapping[str, Any], fail: Fail) -> Self:
        raw = table.get("url")
        if (
            not isinstance(raw, str)
            or not raw.startswith(("https://", "http://"))
            or has_control(raw)
        ):
            raise fail(
                "url",
                "missing: Twilio signs the URL it calls, so give the hook's public URL as Twilio "
                'has it, e.g. url = "https://hooks.example.com/hooks/sms" (no query string)',
            )
        if "?" in raw or "#" in raw:
            raise fail(
                "url", "must not hold a query string: the one each callback comes with is added"
            )
        return cls(url=raw)

    @property
    def own_event_id(self) -> str:
        return "the message id and status together"

    def required_headers(self) -> tuple[str, ...]:
        return ("x-twilio-signature",)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        offered = message.header("x-twilio-signature")
        algorithm = _algorithm(message.header("x-twilio-webhooks-signature-settings"))
        if not offered or algorithm is None:
            raise BAD
        url = self.url + (f"?{message.query}" if message.query else "")
        params = _signed_params(message)
        for candidate in _with_and_without_port(url):
            for key in keys:
                if same(_signature(key, candidate, params, algorithm), offered):
                    return Signed()
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        query = message.query
        params: list[tuple[str, str]] = []
        if message.content_type == "application/x-www-form-urlencoded":
            params = parse_qsl(message.body.decode(), keep_blank_values=True)
        else:
            digest = hashlib.sha256(message.body).hexdigest()
            query = "&".join(q for q in (query, urlencode({"bodySHA256": digest})) if q)
        full = url + (f"?{query}" if query else "")
        sig = _signature(secret.encode(), full, params, hashlib.sha1)
        return Message(message.body, {**message.headers, "X-Twilio-Signature": sig}, query)


def _algorithm(settings: str) -> Callable[[], Any] | None:
    """The HMAC's hash: SHA-1 unless the settings header names another; None for one
    settled does not know."""
    algorithm: Callable[[], Any] = hashlib.sha1
    for part in settings.split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() == "algorithm":
            named = value.strip().upper()
            if named == "HMAC_SHA256":
                algorithm = hashlib.sha256
            elif named != "HMAC_SHA1":
                return None
    return algorithm


def _signed_params(message: Message) -> list[tuple[str, str]]:
    """The form pairs the signature covers; none for a JSON body, whose hash in the
    query string (``bodySHA256``) must match it."""
    qs = dict(parse_qsl(message.query, keep_blank_values=True))
    if "bodySHA256" in qs:
        if not same(hashlib.sha256(message.body).hexdigest(), qs["bodySHA256"]):
            raise BAD
        return []
    try:
        return parse_qsl(message.body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        raise BAD from None


def _signature(
    key: bytes, url: str, params: list[tuple[str, str]], algorithm: Callable[[], Any]
) -> str:
    """Twilio's: the URL, then each distinct parameter name in order with each of its
    distinct values in order."""
    by_name: dict[str, set[str]] = {}
    for name, value in params:
        by_name.setdefault(name, set()).add(value)
    text = url + "".join(n + v for n in sorted(by_name) for v in sorted(by_name[n]))
    mac = hmac.new(key, text.encode(), algorithm)
    return base64.b64encode(mac.digest()).decode()


def _with_and_without_port(url: str) -> list[str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    without = urlunsplit(parts._replace(netloc=shown))
    with_port = urlunsplit(parts._replace(netloc=f"{shown}:{parts.port or default}"))
    return list(dict.fromkeys([url, without, with_port]))


__all__ = ["Twilio"]
