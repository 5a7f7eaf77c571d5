"""The ``pagerduty`` scheme as PagerDuty's v3 webhooks document it: ``X-PagerDuty-Signature``
lists ``v1=`` HMAC-SHA256 hex digests of the body, one per active secret, any of which
may match (computed here independently of settled's code); the event id is the body's
``event.id``, so a redelivery is a duplicate. Through the core, on both backends."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from hookkit import callbacks_config, hooks, sent, snapshot

from settled.model import Status
from settled.storage import Ledger

SECRET = "pd-webhook-secret-new"
OLD = "pd-webhook-secret-old"
TABLE: dict[str, Any] = {
    "scheme": "pagerduty",
    "secret": "${PAGERDUTY_WEBHOOK_SECRET}",
    "names": "provider_object_id",
    "key": "/event/data/id",  # the incident's id
    "status": "/event/event_type",
    "applied": ["incident.triggered"],
    "not_applied": ["incident.resolved"],
}
ENV = {"PAGERDUTY_WEBHOOK_SECRET": SECRET}


def v1(body: bytes, secret: str) -> str:
    return "v1=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def incident(event_id: str, incident_id: str, kind: str = "incident.triggered") -> bytes:
    """The shape of PagerDuty's v3 webhook payload."""
    return json.dumps(
        {
            "event": {
                "id": event_id,
                "event_type": kind,
                "resource_type": "incident",
                "occurred_at": "2026-01-01T00:00:00.000Z",
                "data": {"id": incident_id, "type": "incident", "status": "triggered"},
            }
        }
    ).encode()


def test_pagerduty_signatures_one_of_several_is_enough(ledger: Ledger) -> None:
    sent(ledger, object_id="PGR0VU2")
    h, _ = hooks(ledger, ENV, **TABLE)
    payload = incident("01DEN1HNLBC1VITLJUOEEHP1AC", "PGR0VU2")
    ctype = {"Content-Type": "application/json"}
    before = snapshot(ledger, "a-1")
    refused = [
        h.handle("p", "POST", {**ctype, "X-PagerDuty-Signature": v1(payload, OLD)}, payload),
        h.handle(
            "p", "POST", {**ctype, "X-PagerDuty-Signature": v1(payload, SECRET)}, payload + b" "
        ),
        h.handle(
            "p",
            "POST",
            {**ctype, "X-PagerDuty-Signature": v1(payload, SECRET).replace("v1=", "v2=")},
            payload,
        ),
        h.handle("p", "POST", ctype, payload),
    ]
    assert [(a.status, a.reason) for a in refused] == [(401, "bad_signature")] * 4
    assert snapshot(ledger, "a-1") == before
    # during a rotation PagerDuty signs with the old and the new secret
    both = f"{v1(payload, OLD)}, {v1(payload, SECRET)},v2=ignored"
    got = h.handle("p", "POST", {**ctype, "X-PagerDuty-Signature": both}, payload)
    assert (got.status, got.reason) == (200, "matched")
    assert ledger.get("a-1").status is Status.CONFIRMED
    assert ledger.events("a-1")[-1].detail["event_id"] == "01DEN1HNLBC1VITLJUOEEHP1AC"
    redelivered = {**ctype, "X-PagerDuty-Signature": v1(payload, SECRET)}
    assert h.handle("p", "POST", redelivered, payload).reason == "duplicate"


@pytest.mark.ledger_free
def test_pagerduty_upper_case_hex_and_its_event_id_field() -> None:
    from settled.callbacks.schemes import Message
    from settled.callbacks.schemes.pagerduty import PagerDuty

    payload = incident("e-1", "P1")
    upper = v1(payload, SECRET).upper().replace("V1=", "v1=")
    signed = PagerDuty().verify(
        (SECRET.encode(),), Message(payload, {"x-pagerduty-signature": upper})
    )
    assert signed.event_id is None  # the event id is in the body, read with the events
    assert callbacks_config(**TABLE)["p"].event_id.text == "/event/id"
