"""The event id in a header: Shopify's webhooks (``X-Shopify-Hmac-Sha256``, base64
HMAC-SHA256 of the body, computed here independently of settled's code, and
``X-Shopify-Event-Id``, the id Shopify's docs name for telling duplicates), and the
generic ``hmac-sha256`` scheme's ``event_id_header``. A request without its id header
is refused before its body is read; a retry under the same id, and the same event
delivered to a second subscription, are duplicates. Through the core, on both
backends."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest
from hookkit import callbacks_config, hooks, sent, snapshot

from settled.callbacks.verify import required_headers
from settled.errors import ConfigError
from settled.model import Status
from settled.storage import Ledger

SECRET = "shpss_0123456789abcdef0123456789abcdef"
TABLE: dict[str, Any] = {
    "scheme": "shopify",
    "secret": "${SHOPIFY_CLIENT_SECRET}",
    "names": "provider_object_id",
    "key": "/id",  # the order's id, from the reply that created it
    "status": "/financial_status",
    "applied": ["paid"],
    "not_applied": ["voided"],
}
ENV = {"SHOPIFY_CLIENT_SECRET": SECRET, "HM": "hm-secret"}


def shopify(
    body: bytes, event_id: str, secret: str = SECRET, *, delivery: str = "d-1"
) -> dict[str, str]:
    """The headers Shopify's delivery reference lists (X-Shopify-Webhook-Id names the
    delivery, X-Shopify-Event-Id the event)."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return {
        "X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode(),
        "X-Shopify-Event-Id": event_id,
        "X-Shopify-Webhook-Id": delivery,
        "X-Shopify-Topic": "orders/paid",
        "Content-Type": "application/json",
    }


def test_shopify_webhooks_settle_refuse_and_dedupe_by_the_header(ledger: Ledger) -> None:
    sent(ledger, object_id="820982911946154508")
    h, _ = hooks(ledger, ENV, **TABLE)
    order = json.dumps({"id": 820982911946154508, "financial_status": "paid"}).encode()
    good = shopify(order, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
    hexed = hmac.new(SECRET.encode(), order, hashlib.sha256).hexdigest()
    before = snapshot(ledger, "a-1")
    no_id = {k: v for k, v in good.items() if k != "X-Shopify-Event-Id"}
    refused = [
        h.handle("p", "POST", shopify(order, "w-1", secret="other"), order),
        h.handle("p", "POST", good, order.replace(b"paid", b"void")),
        h.handle("p", "POST", {**good, "X-Shopify-Hmac-Sha256": hexed}, order),
        h.handle("p", "POST", no_id, order),
    ]
    assert [(a.status, a.reason) for a in refused] == [(401, "bad_signature")] * 4
    assert h.before_body("p", "POST", no_id) is not None  # refused without its body
    assert snapshot(ledger, "a-1") == before
    got = h.handle("p", "POST", good, order)
    assert (got.status, got.reason) == (200, "matched")  # a numeric id is read as text
    assert ledger.get("a-1").status is Status.CONFIRMED
    event = ledger.events("a-1")[-1]
    assert event.detail["event_id"] == "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    assert h.handle("p", "POST", good, order).reason == "duplicate"  # a retry keeps the id
    # the same event delivered to another subscription: another delivery, one event
    again = shopify(order, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043", delivery="d-2")
    assert h.handle("p", "POST", again, order).reason == "duplicate"


HMAC = {
    "scheme": "hmac-sha256",
    "secret": "${HM}",
    "header": "X-Signature",
    "event_id_header": "X-Event-Id",
    "names": "provider_object_id",
    "key": "/id",
    "status": "/event",
    "applied": ["delivered"],
}


def test_hmac_sha256_takes_its_event_id_from_a_header(ledger: Ledger) -> None:
    sent(ledger, object_id="m-1")
    h, _ = hooks(ledger, ENV, **HMAC)
    payload = json.dumps({"id": "m-1", "event": "delivered"}).encode()
    sig = hmac.new(b"hm-secret", payload, hashlib.sha256).hexdigest()
    headers = {"X-Signature": sig, "X-Event-Id": "evt-42", "Content-Type": "application/json"}
    assert h.handle("p", "POST", {**headers, "X-Event-Id": ""}, payload).status == 401
    assert h.handle("p", "POST", {**headers, "X-Event-Id": "x" * 301}, payload).status == 401
    assert h.handle("p", "POST", headers, payload).reason == "matched"
    assert ledger.events("a-1")[-1].detail["event_id"] == "evt-42"
    assert h.handle("p", "POST", headers, payload).reason == "duplicate"
    cfg = callbacks_config(**HMAC)["p"]
    assert required_headers(cfg) == ("x-signature", "x-event-id")
    with pytest.raises(ConfigError, match=r"callbacks\.event_id: the event id is the X-Event-Id"):
        callbacks_config(**{**HMAC, "event_id": "/eid"})
    with pytest.raises(ConfigError, match=r"callbacks\.event_id_header: not a header name"):
        callbacks_config(**{**HMAC, "event_id_header": "X Event"})
    with pytest.raises(ConfigError, match="applies to scheme = 'hmac-sha256' only"):
        callbacks_config(**{**TABLE, "event_id_header": "X-Event-Id"})


@pytest.mark.ledger_free
def test_required_headers_name_what_each_scheme_needs() -> None:
    """What a server may refuse before reading a body: the signature's headers where a
    scheme has them; none where the signature is in the body or the URL."""
    assert required_headers(callbacks_config(**TABLE)["p"]) == (
        "x-shopify-hmac-sha256",
        "x-shopify-event-id",
    )
    mailgun = {**TABLE, "scheme": "mailgun", "key": "/k", "status": "/s"}
    token = {**TABLE, "scheme": "token"}
    assert required_headers(callbacks_config(**mailgun)["p"]) == ()
    assert required_headers(callbacks_config(**token)["p"]) == ()
