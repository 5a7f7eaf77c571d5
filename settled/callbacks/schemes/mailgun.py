"""``mailgun``: Mailgun's webhooks, whose signature is inside the body.

A JSON body carries ``"signature": {"timestamp", "token", "signature"}`` beside its
``event-data``; a form (the legacy webhooks) carries the three as fields. The
signature is HMAC-SHA256, hex, of ``timestamp + token`` with the webhook signing key;
the timestamp is judged against ``tolerance``, and the token is the event id, so a
token is taken once: a replay is a duplicate that changes nothing. The config may not
name another event id: the token is what makes a captured signature useless a second
time.

Reading the three values is part of the signature check (as Twilio's form pairs are),
bounded as every body read is. The signature does not cover the body itself, so
``providers audit`` calls this scheme weaker: a body changed in transit, under a
token not yet seen, would verify. Mailgun signs each delivery anew, so a retry of one
event comes with another token and is recorded as a second callback saying the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from .scheme import BAD, Message, Scheme, Signed, hmac_sha256, json_object, same, token, whole

FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Mailgun(Scheme):
    name = "mailgun"
    signs = "HMAC-SHA256 of {timestamp}{token}, both in the body, not the body itself"
    timestamped = True
    weaker = (
        "its signature covers a timestamp and a one-time token, not the body: a body "
        "changed in transit would verify; receive it over TLS only"
    )

    @property
    def own_event_id(self) -> str:
        return "the signature's token"

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        stamp, tok, offered = _signature(message)
        if not whole(stamp) or tok is None or not offered:
            raise BAD
        signed = (stamp + tok).encode()
        for key in keys:
            if same(hmac_sha256(key, signed).hex(), offered.lower()):
                return Signed(event_id=tok, timestamp=int(stamp))
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        stamp = str(int(now))
        sig = {
            "timestamp": stamp,
            "token": event_id,
            "signature": hmac_sha256(secret.encode(), (stamp + event_id).encode()).hex(),
        }
        if message.content_type == FORM:
            body = message.body + b"&" + urlencode(sig).encode()
        else:
            doc = json_object(message.body)
            if doc is None:
                raise ValueError("a mailgun callback is a JSON object or a form")
            body = json.dumps({**doc, "signature": sig}).encode()
        return Message(body, message.headers, message.query)


def _signature(message: Message) -> tuple[str, str | None, str]:
    """The body's timestamp, token and signature ("" or None where absent)."""
    if message.content_type == FORM:
        try:
            pairs = parse_qsl(message.body.decode("utf-8"), keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            raise BAD from None
        fields: dict[str, str] = {}
        for k, v in pairs:
            fields.setdefault(k, v)
        found: Any = fields
    else:
        doc = json_object(message.body)
        found = doc.get("signature") if doc is not None else None
        if not isinstance(found, dict):
            raise BAD
    stamp = found.get("timestamp")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        stamp = str(stamp)
    offered = found.get("signature")
    return (
        stamp if isinstance(stamp, str) else "",
        token(found.get("token")),
        offered if isinstance(offered, str) else "",
    )


__all__ = ["Mailgun"]
