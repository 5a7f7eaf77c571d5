"""``token``: a shared secret, for senders that sign nothing (Postmark, basic auth).

The secret as the ``token`` query parameter, or as the password of HTTP Basic auth
(with the config's ``username`` when it names one). It proves the sender knows the
secret, not that the body is the one it sent: ``providers audit`` calls it weaker. It
is the one place a secret may stand in a URL, and the service keeps it out of its logs.
The event id is a body field the config names (``event_id``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode

from .scheme import BAD, Fail, Message, Scheme, Signed, same


@dataclass(frozen=True)
class Token(Scheme):
    name = "token"
    options = ("username",)
    signs = "nothing: a shared token in the URL or basic auth"
    weaker = (
        "a secret in the URL or basic auth, no signature over the body; use a signing "
        "scheme if the sender has one"
    )
    username: str | None = None

    @classmethod
    def parse(cls, table: Mapping[str, Any], fail: Fail) -> Self:
        username = table.get("username")
        if username is not None and (
            not isinstance(username, str) or not username or ":" in username
        ):
            raise fail("username", "must be a non-empty string without ':' (HTTP Basic)")
        return cls(username=username)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        given = [v for k, v in parse_qsl(message.query, keep_blank_values=True) if k == "token"]
        kind, _, cred = message.header("authorization").partition(" ")
        if kind.lower() == "basic" and cred:
            try:
                user, sep, password = (
                    base64.b64decode(cred.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, ValueError):
                raise BAD from None
            if sep and (self.username is None or same(self.username, user)):
                given.append(password)
        if not any(same(key, g) for key in keys for g in given):
            raise BAD
        return Signed()

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        if self.username is not None:
            basic = base64.b64encode(f"{self.username}:{secret}".encode()).decode()
            return message.with_headers(Authorization=f"Basic {basic}")
        query = "&".join(q for q in (message.query, urlencode({"token": secret})) if q)
        return Message(message.body, message.headers, query)


__all__ = ["Token"]
