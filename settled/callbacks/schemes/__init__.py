"""The callback signing schemes, by name (docs/callbacks.md). Each is one class in one
module, behind the protocol in ``scheme.py``; a new scheme is a new module and one
line in ``SCHEMES``."""

from __future__ import annotations

from collections.abc import Mapping

from .github import GitHub
from .hmac_sha256 import HmacSha256
from .mailgun import Mailgun
from .pagerduty import PagerDuty
from .scheme import BAD, STALE, Message, Refused, Scheme, Signed
from .sendgrid import SendGrid
from .shared_token import Token
from .shopify import Shopify
from .slack import Slack
from .standard_webhooks import StandardWebhooks
from .stripe import Stripe
from .twilio import Twilio

SCHEMES: Mapping[str, type[Scheme]] = {
    s.name: s
    for s in (
        StandardWebhooks,
        Stripe,
        GitHub,
        Twilio,
        HmacSha256,
        Token,
        Slack,
        Mailgun,
        SendGrid,
        PagerDuty,
        Shopify,
    )
}

__all__ = ["BAD", "SCHEMES", "STALE", "Message", "Refused", "Scheme", "Signed"]
