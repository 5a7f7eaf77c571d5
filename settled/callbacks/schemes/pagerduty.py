"""``pagerduty``: PagerDuty's v3 webhook subscriptions.

``X-PagerDuty-Signature: v1=<hex>[,v1=<hex>…]``: HMAC-SHA256, hex, of the body with
the subscription's secret; PagerDuty lists one ``v1`` per active secret while one is
rotated, and any may match. No timestamp is signed, so a replay is caught by the event
id: the body's ``event.id``, unless the config names another field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scheme import BAD, Message, Scheme, Signed, hmac_sha256, listed, same


@dataclass(frozen=True)
class PagerDuty(Scheme):
    name = "pagerduty"
    signs = "HMAC-SHA256 of the body"
    event_field = "/event/id"

    def required_headers(self) -> tuple[str, ...]:
        return ("x-pagerduty-signature",)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        offered = listed(message.header("x-pagerduty-signature"), "v1")
        if not offered:
            raise BAD
        for key in keys:
            expected = hmac_sha256(key, message.body).hex()
            if any(same(expected, o.lower()) for o in offered):
                return Signed()
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        mac = hmac_sha256(secret.encode(), message.body).hex()
        return message.with_headers(**{"X-PagerDuty-Signature": f"v1={mac}"})


__all__ = ["PagerDuty"]
