"""``slack``: Slack's signed requests (the Events API, interactivity).

``X-Slack-Signature: v0=<hex>``: HMAC-SHA256 of ``v0:{X-Slack-Request-Timestamp}:{body}``
with the app's signing secret; the timestamp is judged against ``tolerance``. The
event id is the body's ``event_id`` (an Events API retry keeps it), unless the config
names another field. Interactivity posts a form whose ``payload`` field is the JSON.

When Slack verifies a Request URL it posts ``{"type": "url_verification",
"challenge": …}``, signed like any event: once the signature holds, the challenge is
answered (``{"challenge": …}``) and nothing is recorded. A challenge that is not short
printable text is not echoed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .scheme import (
    BAD,
    Message,
    Scheme,
    Signed,
    hmac_sha256,
    json_object,
    listed,
    same,
    token,
    whole,
)


@dataclass(frozen=True)
class Slack(Scheme):
    name = "slack"
    signs = "HMAC-SHA256 of v0:{timestamp}:{body}"
    timestamped = True
    event_field = "/event_id"
    form_payload = "payload"

    def required_headers(self) -> tuple[str, ...]:
        return ("x-slack-signature", "x-slack-request-timestamp")

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        stamp = message.header("x-slack-request-timestamp")
        offered = listed(message.header("x-slack-signature"), "v0")
        if not whole(stamp) or not offered:
            raise BAD
        base = b"v0:" + stamp.encode() + b":" + message.body
        for key in keys:
            expected = hmac_sha256(key, base).hex()
            if any(same(expected, o) for o in offered):
                return Signed(timestamp=int(stamp))
        raise BAD

    def handshake(self, message: Message) -> dict[str, Any] | None:
        if b"url_verification" not in message.body:  # the common case, without parsing
            return None
        doc = json_object(message.body)
        if doc is None or doc.get("type") != "url_verification":
            return None
        challenge = token(doc.get("challenge"))
        return {"challenge": challenge} if challenge is not None else None

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        stamp = str(int(now))
        mac = hmac_sha256(secret.encode(), b"v0:" + stamp.encode() + b":" + message.body)
        return message.with_headers(
            **{"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": "v0=" + mac.hex()}
        )


__all__ = ["Slack"]
