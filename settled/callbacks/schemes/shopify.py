"""``shopify``: Shopify's webhooks.

``X-Shopify-Hmac-Sha256``: base64 HMAC-SHA256 of the body with the app's client
secret. No timestamp is signed. The event id is ``X-Shopify-Event-Id``: Shopify's
"Ignore duplicate webhooks" names it as the id whose repetition marks a duplicate, and
its delivery reference gives it to every delivery one merchant action produced, so a
retry, and the same event delivered to a second subscription, are each taken once
(``X-Shopify-Webhook-Id`` names one delivery, and is not read). That header is not
covered by the signature: a captured body sent again under another id is recorded as
another callback saying what Shopify said, never anything else. Rotating the client
secret: configure the old and the new (``secrets``) until every webhook is signed with
the new one.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scheme import BAD, Message, Scheme, Signed, hmac_sha256, same, token

EVENT_ID = "X-Shopify-Event-Id"


@dataclass(frozen=True)
class Shopify(Scheme):
    name = "shopify"
    signs = "HMAC-SHA256 of the body"

    @property
    def own_event_id(self) -> str:
        return f"the {EVENT_ID} header"

    def required_headers(self) -> tuple[str, ...]:
        return ("x-shopify-hmac-sha256", EVENT_ID.lower())

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        event_id = token(message.header(EVENT_ID))
        try:
            given = base64.b64decode(message.header("x-shopify-hmac-sha256"), validate=True)
        except (binascii.Error, ValueError):
            raise BAD from None
        if event_id is None or not given:
            raise BAD
        if not any(same(hmac_sha256(key, message.body), given) for key in keys):
            raise BAD
        return Signed(event_id=event_id)

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        mac = base64.b64encode(hmac_sha256(secret.encode(), message.body)).decode()
        return message.with_headers(**{"X-Shopify-Hmac-Sha256": mac, EVENT_ID: event_id})


__all__ = ["Shopify"]
