"""``hmac-sha256``: the generic HMAC sender.

HMAC-SHA256 of the body in the config's ``header``, ``hex`` (default) or ``base64``,
after an optional ``prefix`` (``sha256=``). No timestamp is signed. The event id is
a body field the config names (``event_id``), or a header (``event_id_header``, as
Shopify-like senders carry it); that header is not covered by the signature, so a
captured body sent again under another id is recorded as another callback saying the
same thing, never anything else.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from ...checks import has_control
from .scheme import BAD, Fail, Message, Scheme, Signed, hmac_sha256, same, token

HEADER = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP field name (RFC 9110 token)


@dataclass(frozen=True)
class HmacSha256(Scheme):
    name = "hmac-sha256"
    options = ("header", "encoding", "prefix", "event_id_header")
    signs = "HMAC-SHA256 of the body"
    header: str = "X-Signature"
    encoding: str = "hex"
    prefix: str = ""
    event_id_header: str | None = None

    @classmethod
    def parse(cls, table: Mapping[str, Any], fail: Fail) -> Self:
        header = table.get("header")
        if not isinstance(header, str) or not HEADER.match(header):
            raise fail("header", 'missing or not a header name; e.g. header = "X-Signature"')
        encoding = table.get("encoding", "hex")
        if encoding not in ("hex", "base64"):
            raise fail("encoding", f'{encoding!r}: use "hex" or "base64"')
        prefix = table.get("prefix", "")
        if not isinstance(prefix, str) or has_control(prefix):
            raise fail("prefix", 'must be a one-line string, e.g. prefix = "sha256="')
        id_header = table.get("event_id_header")
        if id_header is not None and (
            not isinstance(id_header, str) or not HEADER.match(id_header)
        ):
            raise fail("event_id_header", 'not a header name; e.g. event_id_header = "X-Event-Id"')
        if id_header is not None and "event_id" in table:
            raise fail(
                "event_id",
                f"the event id is the {id_header} header (event_id_header); keep one of them",
            )
        return cls(header=header, encoding=encoding, prefix=prefix, event_id_header=id_header)

    @property
    def own_event_id(self) -> str:
        return f"the {self.event_id_header} header" if self.event_id_header else ""

    def required_headers(self) -> tuple[str, ...]:
        named = (self.header, *((self.event_id_header,) if self.event_id_header else ()))
        return tuple(h.lower() for h in named)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        offered = message.header(self.header)
        if not offered.startswith(self.prefix):
            raise BAD
        offered = offered[len(self.prefix) :].strip()
        event_id = None
        if self.event_id_header is not None:
            event_id = token(message.header(self.event_id_header))
            if event_id is None:
                raise BAD
        if self.encoding == "hex":
            ok = any(same(hmac_sha256(k, message.body).hex(), offered.lower()) for k in keys)
        else:
            try:
                given = base64.b64decode(offered, validate=True)
            except (binascii.Error, ValueError):
                raise BAD from None
            ok = any(same(hmac_sha256(k, message.body), given) for k in keys)
        if not ok:
            raise BAD
        return Signed(event_id=event_id)

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        digest = hmac_sha256(secret.encode(), message.body)
        text = digest.hex() if self.encoding == "hex" else base64.b64encode(digest).decode()
        added = {self.header: self.prefix + text}
        if self.event_id_header:
            added[self.event_id_header] = event_id
        return message.with_headers(**added)


__all__ = ["HmacSha256"]
