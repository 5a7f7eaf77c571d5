"""``github``: GitHub's webhook deliveries.

``X-Hub-Signature-256: sha256=<hex>``: HMAC-SHA256 of the body. No timestamp is
signed, so a replay is caught by the event id alone: ``X-GitHub-Delivery``, which a
redelivery keeps. That header is not covered by the signature: a captured body sent
again under another id is recorded as another callback saying what GitHub said, never
anything else. JSON and form (``payload=``) deliveries are both read. GitHub holds one
secret per hook; several configured secrets let the receiver accept both while it is
changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scheme import BAD, Message, Scheme, Signed, hmac_sha256, same


@dataclass(frozen=True)
class GitHub(Scheme):
    name = "github"
    signs = "HMAC-SHA256 of the body"
    form_payload = "payload"

    @property
    def own_event_id(self) -> str:
        return "the X-GitHub-Delivery header"

    def required_headers(self) -> tuple[str, ...]:
        return ("x-hub-signature-256", "x-github-delivery")

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        offered = message.header("x-hub-signature-256")
        delivery = message.header("x-github-delivery")
        if not delivery:
            raise BAD
        for key in keys:
            if same("sha256=" + hmac_sha256(key, message.body).hex(), offered):
                return Signed(event_id=delivery)
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        mac = hmac_sha256(secret.encode(), message.body).hex()
        return message.with_headers(
            **{"X-Hub-Signature-256": f"sha256={mac}", "X-GitHub-Delivery": event_id}
        )


__all__ = ["GitHub"]
