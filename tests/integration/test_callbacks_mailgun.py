"""The ``mailgun`` scheme: the signature inside the body, as Mailgun's "Securing
webhooks" documents it (HMAC-SHA256, hex, of timestamp + token with the webhook
signing key), computed here independently of settled's code, in the JSON body of
today's webhooks and the form of the legacy ones. The token is the event id: a token is
taken once, so a replay, or another body under a token already seen, is a duplicate
that changes nothing. The signature does not cover the body, and ``providers audit``
says so (weaker). Through the core, on both backends."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from hookkit import T0, callbacks_config, hooks, sent, snapshot

from settled.errors import ConfigError
from settled.model import Status
from settled.storage import Ledger

KEY = "key-6f2c1e0d9b8a7f6e5d4c3b2a19080706"  # a webhook signing key (made up)
TOKEN = "a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0"  # the docs' example token
TABLE: dict[str, Any] = {
    "scheme": "mailgun",
    "secret": "${MAILGUN_WEBHOOK_SIGNING_KEY}",
    "names": "reconciliation_key",
    "key": "/event-data/user-variables/settled_key",
    "status": "/event-data/event",
    "applied": ["delivered"],
    "not_applied": ["rejected"],
    "delivered": ["accepted"],
}
ENV = {"MAILGUN_WEBHOOK_SIGNING_KEY": KEY}
JSON = {"Content-Type": "application/json"}


def signature(timestamp: str, token: str, key: str = KEY) -> dict[str, str]:
    """As Mailgun's docs compute it."""
    digest = hmac.new(key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()
    return {"timestamp": timestamp, "token": token, "signature": digest}


def webhook(
    settled_key: str, event: str, *, token: str = TOKEN, offset: int = 0, key: str = KEY
) -> bytes:
    stamp = str(int((T0 + timedelta(seconds=offset)).timestamp()))
    return json.dumps(
        {
            "signature": signature(stamp, token, key),
            "event-data": {
                "event": event,
                "id": "CPgfbmQMTCKtHW6uIWtuVe",
                "severity": "permanent",
                "user-variables": {"settled_key": settled_key},
            },
        }
    ).encode()


def test_mailgun_json_webhooks_settle_and_refuse(ledger: Ledger) -> None:
    rec = sent(ledger, object_id="20260101.1@mg.example.com")
    key = rec.reconciliation_key
    assert key
    h, _ = hooks(ledger, ENV, **TABLE)
    before = snapshot(ledger, "a-1")
    unsigned = json.loads(webhook(key, "delivered"))
    del unsigned["signature"]
    refused = [
        h.handle("p", "POST", JSON, webhook(key, "delivered", key="key-wrong")),
        h.handle("p", "POST", JSON, webhook(key, "delivered", offset=-301)),
        h.handle("p", "POST", JSON, webhook(key, "delivered", offset=301)),
        h.handle("p", "POST", JSON, json.dumps(unsigned).encode()),
        h.handle("p", "POST", JSON, b"{not json"),
        h.handle("p", "POST", JSON, b'{"signature": "d2271d12"}'),
    ]
    assert [(a.status, a.reason) for a in refused] == [
        (401, "bad_signature"),
        (401, "stale"),
        (401, "stale"),
        (401, "bad_signature"),
        (401, "bad_signature"),
        (401, "bad_signature"),
    ]
    assert snapshot(ledger, "a-1") == before
    got = h.handle("p", "POST", JSON, webhook(key, "delivered", offset=300))
    assert (got.status, got.reason) == (200, "matched")
    assert ledger.get("a-1").status is Status.CONFIRMED
    assert ledger.events("a-1")[-1].detail["event_id"] == TOKEN  # the token is the event id


def test_a_token_is_taken_once_whatever_body_comes_with_it(ledger: Ledger) -> None:
    """The signature covers the timestamp and the token, not the body: another body
    under a token already taken verifies, and is a duplicate that moves nothing."""
    rec = sent(ledger, object_id=None)
    key = rec.reconciliation_key
    assert key
    h, _ = hooks(ledger, ENV, **TABLE)
    assert h.handle("p", "POST", JSON, webhook(key, "accepted")).reason == "matched"
    before = snapshot(ledger, "a-1")
    swapped = webhook(key, "rejected")  # the same token and timestamp, another event
    got = h.handle("p", "POST", JSON, swapped)
    assert (got.status, got.reason) == (200, "duplicate")
    assert snapshot(ledger, "a-1") == before
    # a new delivery (Mailgun signs each anew) is another callback
    fresh = webhook(key, "delivered", token="0f1e2d3c4b5a69788796a5b4c3d2e1f0")
    assert h.handle("p", "POST", JSON, fresh).reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_mailgun_legacy_form_webhooks(ledger: Ledger) -> None:
    sent(ledger, object_id="<20260101.1@mg.example.com>")
    table = {**TABLE, "names": "provider_object_id", "key": "Message-Id", "status": "event"}
    h, _ = hooks(ledger, ENV, **table)
    stamp = str(int(T0.timestamp()))
    fields = {
        "event": "delivered",
        "Message-Id": "<20260101.1@mg.example.com>",
        "recipient": "alice@example.com",
        **signature(stamp, TOKEN),
    }
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = {**fields, "signature": "0" * 64}
    assert h.handle("p", "POST", form, urlencode(wrong).encode()).status == 401
    assert h.handle("p", "POST", form, urlencode(fields).encode()).reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


@pytest.mark.ledger_free
def test_mailgun_is_named_weaker_and_keeps_its_token_as_the_event_id() -> None:
    cb = callbacks_config(**TABLE)["p"]
    assert cb.weaker and "not the body" in cb.weakness
    assert "weaker" in cb.describe()
    with pytest.raises(ConfigError, match="the mailgun event id is the signature's token"):
        callbacks_config(**{**TABLE, "event_id": "/event-data/id"})
    assert callbacks_config(**{**TABLE, "tolerance": 900})["p"].tolerance == 900
