"""``stripe``: Stripe's webhook events.

``Stripe-Signature: t=…,v1=…[,v1=…]``: HMAC-SHA256, hex, of ``{t}.{body}`` with the
endpoint's ``whsec_`` secret (used as it is, not decoded). Stripe lists one ``v1`` per
active secret while one is rolled, so every ``v1`` is tried, with every configured
secret. The event id is the event's own ``id``, in the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scheme import BAD, Message, Scheme, Signed, hmac_sha256, listed, same, whole


@dataclass(frozen=True)
class Stripe(Scheme):
    name = "stripe"
    signs = "HMAC-SHA256 of {t}.{body}"
    timestamped = True
    event_field = "/id"

    @property
    def own_event_id(self) -> str:
        return "the event's id"

    def required_headers(self) -> tuple[str, ...]:
        return ("stripe-signature",)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        header = message.header("stripe-signature")
        stamps = listed(header, "t")
        offered = listed(header, "v1")
        if len(stamps) != 1 or not whole(stamps[0]) or not offered:
            raise BAD
        signed = stamps[0].encode() + b"." + message.body
        for key in keys:
            expected = hmac_sha256(key, signed).hex()
            if any(same(expected, v) for v in offered):
                return Signed(timestamp=int(stamps[0]))
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        stamp = str(int(now))
        mac = hmac_sha256(secret.encode(), stamp.encode() + b"." + message.body).hex()
        return message.with_headers(**{"Stripe-Signature": f"t={stamp},v1={mac}"})


__all__ = ["Stripe"]
