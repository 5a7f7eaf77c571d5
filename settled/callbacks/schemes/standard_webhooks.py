"""``standard-webhooks``: the Standard Webhooks specification, followed by many senders.

``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (space-separated
``v1,<base64>``, any of which may match: the sender lists one per active secret). The
expected signature of ``{id}.{timestamp}.{body}`` is made by the reference
``standardwebhooks`` package (``settled[callbacks]``); its own check is not used,
because it reads the wall clock and allows a fixed 5 minutes. The event id is
``webhook-id``. The signer is the spec's HMAC, written here with the standard library,
so the simulator needs no package (and the tests hold it to the reference's output).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...errors import ConfigError, MissingExtra
from .scheme import BAD, INSTALL, MAX_SIGNATURES, Message, Scheme, Signed, hmac_sha256, same, whole


@dataclass(frozen=True)
class StandardWebhooks(Scheme):
    name = "standard-webhooks"
    signs = "HMAC-SHA256 of {webhook-id}.{webhook-timestamp}.{body}"
    timestamped = True

    @property
    def own_event_id(self) -> str:
        return "the webhook-id header"

    def required_headers(self) -> tuple[str, ...]:
        return ("webhook-id", "webhook-timestamp", "webhook-signature")

    def key(self, secret: str, where: str) -> Any:
        try:  # the extra is needed only where callbacks are received
            from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook
        except ImportError:
            raise MissingExtra(
                f'{where}: scheme = "standard-webhooks" needs the standardwebhooks package: '
                f"{INSTALL}"
            ) from None
        try:
            return Webhook(secret)
        except (binascii.Error, ValueError, RuntimeError, EmptyWebhookSecretError) as exc:
            raise ConfigError(
                f"{where}.secret: not a standard-webhooks secret (whsec_ followed by base64): "
                f"{type(exc).__name__}"
            ) from None

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        msg_id = message.header("webhook-id")
        stamp = message.header("webhook-timestamp")
        sigs = message.header("webhook-signature")
        if not msg_id or not sigs or not whole(stamp):
            raise BAD
        try:
            text = message.body.decode("utf-8")  # every standard-webhooks library signs text
        except UnicodeDecodeError:
            raise BAD from None
        when = datetime.fromtimestamp(int(stamp), tz=UTC)
        offered = [_v1(s) for s in sigs.split(" ")[:MAX_SIGNATURES]]
        for webhook in keys:
            expected = base64.b64decode(webhook.sign(msg_id, when, text).split(",", 1)[1])
            if any(o is not None and same(expected, o) for o in offered):
                return Signed(event_id=msg_id, timestamp=int(stamp))
        raise BAD

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        stamp = str(int(now))
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        mac = hmac_sha256(key, f"{event_id}.{stamp}.".encode() + message.body)
        return message.with_headers(
            **{
                "webhook-id": event_id,
                "webhook-timestamp": stamp,
                "webhook-signature": "v1," + base64.b64encode(mac).decode(),
            }
        )


def _v1(offered: str) -> bytes | None:
    version, sep, sig = offered.partition(",")
    if not sep or version != "v1":
        return None
    try:
        return base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        return None


__all__ = ["StandardWebhooks"]
