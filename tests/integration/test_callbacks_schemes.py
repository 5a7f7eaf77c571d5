"""Each signature scheme against what the sender's own library (or its spec's vector)
makes: the right secret passes; a wrong secret, a tampered body, a stale or future
timestamp and missing headers are 401 and change nothing; a replayed event id and a
duplicate delivery are 2xx and change nothing. The core is called directly, on both
backends."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from hookkit import (
    STD_SECRET,
    T0,
    TWILIO_URL,
    body,
    github_headers,
    hmac_headers,
    hooks,
    sent,
    snapshot,
    std_headers,
    stripe_headers,
    twilio_request,
)

from settled.model import Status
from settled.storage import Ledger

STD = {
    "scheme": "standard-webhooks",
    "secret": "${STD}",
    "names": "provider_object_id",
    "key": "/data/id",
    "status": "/data/status",
    "applied": ["delivered"],
    "not_applied": ["failed"],
    "delivered": ["sent"],
}
ENV = {
    "STD": STD_SECRET,
    "STRIPE": "whsec_test_secret_123",
    "GH": "It's a Secret to Everybody",
    "TW": "twilio-auth-token",
    "HM": "hmac-secret",
    "TOK": "tok-3f9a",
}


# -- standard webhooks -------------------------------------------------------------------------


def test_standard_webhooks_spec_vector_verifies(ledger: Ledger) -> None:
    """The spec's published vector (standard-webhooks README): its signature is what the
    package makes, and a body signed so is accepted."""
    ts = datetime.fromtimestamp(1614265330, UTC)
    payload = b'{"test": 2432232314}'
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        "content-type": "application/json",
    }
    assert (
        std_headers(payload, msg_id="msg_p5jXN8AQM9LWM0D4loKWxJek", ts=ts)["webhook-signature"]
        == headers["webhook-signature"]
    )
    h, _ = hooks(ledger, ENV, now=ts, **STD)
    got = h.handle("p", "POST", headers, payload)
    assert (got.status, got.reason) == (200, "ignored")  # signed; it names no action of ours
    tampered = h.handle("p", "POST", headers, b'{"test": 2432232315}')
    assert (tampered.status, tampered.reason, tampered.body) == (
        401,
        "bad_signature",
        {"error": "unauthorized"},
    )


def test_standard_webhooks_settles_and_refuses(ledger: Ledger) -> None:
    sent(ledger, object_id="msg-9")
    h, clock = hooks(ledger, ENV, **STD)
    good = body(type="message.status", data={"id": "msg-9", "status": "delivered"})
    before = snapshot(ledger, "a-1")
    refused = [
        h.handle(
            "p",
            "POST",
            std_headers(good, secret="whsec_" + base64.b64encode(b"other").decode()),
            good,
        ),
        h.handle("p", "POST", std_headers(good), good.replace(b"delivered", b"delivereD")),
        h.handle("p", "POST", std_headers(good, ts=T0 - timedelta(seconds=301)), good),
        h.handle("p", "POST", std_headers(good, ts=T0 + timedelta(seconds=301)), good),
        h.handle(
            "p", "POST", {k: v for k, v in std_headers(good).items() if k != "webhook-id"}, good
        ),
        h.handle("p", "POST", {"content-type": "application/json"}, good),
        h.handle("p", "POST", {**std_headers(good), "webhook-timestamp": "soon"}, good),
        h.handle("p", "POST", {**std_headers(good), "webhook-signature": "v1,!!!notbase64"}, good),
    ]
    assert [(a.status, a.reason) for a in refused] == [
        (401, "bad_signature"),
        (401, "bad_signature"),
        (401, "stale"),
        (401, "stale"),
        (401, "bad_signature"),
        (401, "bad_signature"),
        (401, "bad_signature"),
        (401, "bad_signature"),
    ]
    assert all(a.body == {"error": "unauthorized"} for a in refused)
    assert snapshot(ledger, "a-1") == before
    # exactly at the tolerance, in both directions, is fresh
    edge = h.handle("p", "POST", std_headers(good, ts=T0 + timedelta(seconds=300)), good)
    assert (edge.status, edge.reason) == (200, "matched")
    rec = ledger.get("a-1")
    assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:p"
    again = h.handle("p", "POST", std_headers(good, ts=T0 - timedelta(seconds=300)), good)
    assert (again.status, again.reason) == (200, "duplicate")  # the same webhook-id
    clock.advance(5)
    assert len(ledger.events("a-1")) == 4  # recorded, claimed, outcome, callback


def test_standard_webhooks_several_signatures_one_is_enough(ledger: Ledger) -> None:
    """Secret rotation: the header lists several; a v2 and a wrong v1 are skipped."""
    sent(ledger, object_id="msg-9")
    h, _ = hooks(ledger, ENV, **STD)
    good = body(data={"id": "msg-9", "status": "delivered"})
    right = std_headers(good)["webhook-signature"]
    wrong = "v1," + base64.b64encode(b"x" * 32).decode()
    headers = {**std_headers(good), "webhook-signature": f"v2,abc {wrong} {right}"}
    assert h.handle("p", "POST", headers, good).reason == "matched"


def test_a_replayed_event_id_with_another_body_changes_nothing(ledger: Ledger) -> None:
    """An event id is recorded once: a second event under the same id, even properly
    signed and saying something else, is a duplicate (2xx) and moves nothing."""
    sent(ledger, object_id="msg-9")
    h, _ = hooks(ledger, ENV, **STD)
    first = body(data={"id": "msg-9", "status": "sent"})
    assert h.handle("p", "POST", std_headers(first, msg_id="evt-1"), first).reason == "matched"
    before = snapshot(ledger, "a-1")
    other = body(data={"id": "msg-9", "status": "failed"})
    got = h.handle("p", "POST", std_headers(other, msg_id="evt-1"), other)
    assert (got.status, got.reason) == (200, "duplicate")
    assert snapshot(ledger, "a-1") == before


def test_standard_webhooks_needs_a_secret_it_can_read(ledger: Ledger) -> None:
    from settled.errors import ConfigError

    with pytest.raises(ConfigError, match=r"callbacks\.secret: not a standard-webhooks secret"):
        hooks(ledger, {"STD": "whsec_***not base64***"}, **STD)
    with pytest.raises(ConfigError, match="environment variable STD is not set"):
        hooks(ledger, {}, **STD)


# -- stripe ------------------------------------------------------------------------------------

STRIPE = {
    "scheme": "stripe",
    "secret": "${STRIPE}",
    "names": "provider_object_id",
    "key": "/data/object/id",
    "status": "/data/object/status",
    "applied": ["succeeded"],
    "not_applied": ["failed", "canceled"],
}


def stripe_event(eid: str, refund: str, status: str) -> bytes:
    return json.dumps(
        {
            "id": eid,
            "object": "event",
            "type": "refund.updated",
            "data": {"object": {"id": refund, "object": "refund", "status": status}},
        }
    ).encode()


def test_stripe_signatures_from_the_sdk(ledger: Ledger) -> None:
    import stripe

    sent(ledger, object_id="re_1")
    h, _ = hooks(ledger, ENV, **STRIPE)
    payload = stripe_event("evt_1", "re_1", "succeeded")
    headers = stripe_headers(payload, ENV["STRIPE"])
    # the SDK itself accepts what we accept
    assert stripe.WebhookSignature.verify_header(
        payload.decode(), headers["Stripe-Signature"], ENV["STRIPE"], tolerance=None
    )
    before = snapshot(ledger, "a-1")
    refused = [
        h.handle("p", "POST", stripe_headers(payload, "whsec_wrong"), payload),
        h.handle("p", "POST", headers, payload.replace(b"succeeded", b"succeedeD")),
        h.handle(
            "p",
            "POST",
            stripe_headers(payload, ENV["STRIPE"], ts=T0 - timedelta(seconds=301)),
            payload,
        ),
        h.handle(
            "p",
            "POST",
            stripe_headers(payload, ENV["STRIPE"], ts=T0 + timedelta(seconds=301)),
            payload,
        ),
        h.handle("p", "POST", {"Content-Type": "application/json"}, payload),
        h.handle("p", "POST", {"Stripe-Signature": "v1=abc"}, payload),
    ]
    assert [(a.status, a.reason) for a in refused] == [
        (401, "bad_signature"),
        (401, "bad_signature"),
        (401, "stale"),
        (401, "stale"),
        (401, "bad_signature"),
        (401, "bad_signature"),
    ]
    assert snapshot(ledger, "a-1") == before
    got = h.handle("p", "POST", headers, payload)
    assert (got.status, got.reason) == (200, "matched")
    assert ledger.get("a-1").status is Status.CONFIRMED
    dup = h.handle(
        "p", "POST", stripe_headers(payload, ENV["STRIPE"], ts=T0 + timedelta(seconds=60)), payload
    )
    assert dup.reason == "duplicate"  # Stripe retries the same event: its id is the dedupe


def test_stripe_rotated_secrets_list_several_v1(ledger: Ledger) -> None:
    sent(ledger, object_id="re_1")
    h, _ = hooks(ledger, ENV, **STRIPE)
    payload = stripe_event("evt_2", "re_1", "failed")
    old = stripe_headers(payload, "whsec_old")["Stripe-Signature"]
    new = stripe_headers(payload, ENV["STRIPE"])["Stripe-Signature"]
    both = f"{old},v1={new.split('v1=')[1]},v0=deadbeef"
    got = h.handle(
        "p", "POST", {"Stripe-Signature": both, "Content-Type": "application/json"}, payload
    )
    assert got.reason == "matched"
    assert ledger.get("a-1").status is Status.FAILED


def test_a_stripe_event_without_its_id_is_malformed(ledger: Ledger) -> None:
    sent(ledger, object_id="re_1")
    h, _ = hooks(ledger, ENV, **STRIPE)
    payload = json.dumps({"data": {"object": {"id": "re_1", "status": "succeeded"}}}).encode()
    got = h.handle("p", "POST", stripe_headers(payload, ENV["STRIPE"]), payload)
    assert (got.status, got.counts) == (200, {"malformed": 1})
    assert ledger.get("a-1").status is Status.AWAITING_VERIFICATION


# -- github ------------------------------------------------------------------------------------

GITHUB = {
    "scheme": "github",
    "secret": "${GH}",
    "names": "action_id",
    "key": "/settled_action",
    "status": "/action",
    "applied": ["completed"],
}


def test_github_documented_vector(ledger: Ledger) -> None:
    """GitHub's docs: secret "It's a Secret to Everybody", payload "Hello, World!"."""
    h, _ = hooks(ledger, ENV, **GITHUB)
    sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    headers = {
        "X-Hub-Signature-256": sig,
        "X-GitHub-Delivery": "72d3162e",
        "Content-Type": "application/json",
    }
    got = h.handle("p", "POST", headers, b"Hello, World!")
    assert (got.status, got.reason) == (400, "malformed")  # signed, and not JSON
    wrong = h.handle(
        "p", "POST", {**headers, "X-Hub-Signature-256": sig[:-1] + "f"}, b"Hello, World!"
    )
    assert (wrong.status, wrong.reason) == (401, "bad_signature")
    no_delivery = h.handle(
        "p",
        "POST",
        {k: v for k, v in headers.items() if k != "X-GitHub-Delivery"},
        b"Hello, World!",
    )
    assert no_delivery.status == 401


def test_github_json_and_form_deliveries(ledger: Ledger) -> None:
    sent(ledger, "a-1", object_id=None)
    sent(ledger, "a-2", object_id=None)
    h, _ = hooks(ledger, ENV, **GITHUB)
    one = body(action="completed", settled_action="a-1")
    assert h.handle("p", "POST", github_headers(one, ENV["GH"], "d-1"), one).reason == "matched"
    form = urlencode(
        {"payload": json.dumps({"action": "completed", "settled_action": "a-2"})}
    ).encode()
    headers = {
        **github_headers(form, ENV["GH"], "d-2"),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    assert h.handle("p", "POST", headers, form).reason == "matched"
    assert [ledger.get(a).status for a in ("a-1", "a-2")] == [Status.CONFIRMED] * 2
    assert h.handle("p", "POST", github_headers(one, ENV["GH"], "d-1"), one).reason == "duplicate"


# -- twilio ------------------------------------------------------------------------------------

TWILIO = {
    "scheme": "twilio",
    "secret": "${TW}",
    "url": TWILIO_URL,
    "names": "provider_object_id",
    "key": "MessageSid",
    "status": "MessageStatus",
    "applied": ["delivered", "read"],
    "not_applied": ["undelivered", "failed"],
    "delivered": ["sent"],
}


def status(sid: str, value: str) -> dict[str, str]:
    return {
        "MessageSid": sid,
        "SmsSid": sid,
        "MessageStatus": value,
        "AccountSid": "AC1",
        "To": "+15558675310",
        "From": "+15017122661",
        "ApiVersion": "2010-04-01",
    }


def test_twilio_signatures_from_the_sdk(ledger: Ledger) -> None:
    sent(ledger, object_id="SM1")
    h, _ = hooks(ledger, ENV, **TWILIO)
    headers, payload = twilio_request(status("SM1", "sent"), ENV["TW"])
    before = snapshot(ledger, "a-1")
    wrong, _ = twilio_request(status("SM1", "sent"), "other-token")
    other_url, _ = twilio_request(status("SM1", "sent"), ENV["TW"], url=TWILIO_URL + "x")
    refused = [
        h.handle("p", "POST", wrong, payload),
        h.handle("p", "POST", headers, payload.replace(b"sent", b"delivered")),
        h.handle("p", "POST", other_url, payload),
        h.handle("p", "POST", {"Content-Type": "application/x-www-form-urlencoded"}, payload),
        h.handle("p", "POST", headers, payload, query="extra=1"),  # the URL is signed too
    ]
    assert [(a.status, a.reason) for a in refused] == [(401, "bad_signature")] * 5
    assert snapshot(ledger, "a-1") == before
    assert h.handle("p", "POST", headers, payload).reason == "matched"
    rec = ledger.get("a-1")
    assert rec.status is Status.AWAITING_VERIFICATION and rec.delivery.value == "DELIVERED"
    assert h.handle("p", "POST", headers, payload).reason == "duplicate"  # SID + status
    headers, payload = twilio_request(status("SM1", "delivered"), ENV["TW"])
    assert h.handle("p", "POST", headers, payload).reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_twilio_port_variants_and_sha256(ledger: Ledger) -> None:
    """Twilio may sign the URL with or without its default port; a SharedKey signs with
    HMAC-SHA256, named in X-Twilio-Webhooks-Signature-Settings."""
    from twilio.request_validator import RequestValidator

    sent(ledger, object_id="SM1")
    sent(ledger, "a-2", object_id="SM2")
    h, _ = hooks(ledger, ENV, **TWILIO)
    params = status("SM1", "delivered")
    sig = RequestValidator(ENV["TW"]).compute_signature(
        "https://hooks.example.com:443/hooks/sms", params
    )
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    got = h.handle("p", "POST", {**form, "X-Twilio-Signature": sig}, urlencode(params).encode())
    assert got.reason == "matched"
    params = status("SM2", "undelivered")
    sig = RequestValidator(ENV["TW"]).compute_signature(TWILIO_URL, params, "HMAC_SHA256")
    headers = {
        **form,
        "X-Twilio-Signature": sig,
        "X-Twilio-Webhooks-Signature-Settings": "key=ks_1,algorithm=HMAC_SHA256",
    }
    assert h.handle("p", "POST", headers, urlencode(params).encode()).reason == "matched"
    assert ledger.get("a-2").status is Status.FAILED
    odd = {**headers, "X-Twilio-Webhooks-Signature-Settings": "algorithm=HMAC_MD5"}
    assert h.handle("p", "POST", odd, urlencode(params).encode()).status == 401


def test_twilio_key_from_the_signed_query_string(ledger: Ledger) -> None:
    """A per-message StatusCallback URL can carry settled's key; Twilio signs that URL,
    so the key may be read from it: a lost reply's message is still matched."""
    rec = sent(ledger, object_id=None)  # the reply (and its SID) never arrived
    assert rec.reconciliation_key
    table = {**TWILIO, "names": "reconciliation_key", "key": "?key"}
    h, _ = hooks(ledger, ENV, **table)
    query = urlencode({"key": rec.reconciliation_key})
    headers, payload = twilio_request(status("SM7", "delivered"), ENV["TW"], query=query)
    got = h.handle("p", "POST", headers, payload, query=query)
    assert got.reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_twilio_json_body_signed_by_its_hash(ledger: Ledger) -> None:
    import hashlib

    from twilio.request_validator import RequestValidator

    sent(ledger, object_id="SM1")
    h, _ = hooks(ledger, ENV, **TWILIO)
    payload = json.dumps({"MessageSid": "SM1", "MessageStatus": "delivered"}).encode()
    query = "bodySHA256=" + hashlib.sha256(payload).hexdigest()
    sig = RequestValidator(ENV["TW"]).compute_signature(f"{TWILIO_URL}?{query}", {})
    headers = {"X-Twilio-Signature": sig, "Content-Type": "application/json"}
    assert h.handle("p", "POST", headers, payload + b" ", query=query).status == 401
    assert h.handle("p", "POST", headers, payload, query=query).reason == "matched"


# -- hmac-sha256 and token ---------------------------------------------------------------------


@pytest.mark.parametrize(("encoding", "prefix"), [("hex", "sha256="), ("base64", "")])
def test_hmac_sha256(ledger: Ledger, encoding: str, prefix: str) -> None:
    sent(ledger, object_id="m-1")
    table = {
        "scheme": "hmac-sha256",
        "secret": "${HM}",
        "header": "X-Signature",
        "encoding": encoding,
        "prefix": prefix,
        "names": "provider_object_id",
        "key": "/id",
        "status": "/event",
        "event_id": "/event_id",
        "applied": ["delivered"],
        "not_applied": ["bounced"],
    }
    h, _ = hooks(ledger, ENV, **table)
    payload = body(id="m-1", event="delivered", event_id="e-1")
    good = hmac_headers(payload, ENV["HM"], prefix=prefix, encoding=encoding)
    before = snapshot(ledger, "a-1")
    for bad in (
        hmac_headers(payload, "nope", prefix=prefix, encoding=encoding),
        {"Content-Type": "application/json"},
        {**good, "X-Signature": "md5=" + good["X-Signature"]}
        if prefix
        else {**good, "X-Signature": "***"},
    ):
        assert h.handle("p", "POST", bad, payload).status == 401
    assert h.handle("p", "POST", good, payload + b"\n").status == 401  # the bytes as sent
    assert snapshot(ledger, "a-1") == before
    assert h.handle("p", "POST", good, payload).reason == "matched"
    assert h.handle("p", "POST", good, payload).reason == "duplicate"


def test_token_scheme_in_the_query_or_basic_auth(ledger: Ledger) -> None:
    sent(ledger, "a-1", object_id="pm-1")
    sent(ledger, "a-2", object_id="pm-2")
    table = {
        "scheme": "token",
        "secret": "${TOK}",
        "names": "provider_object_id",
        "key": "MessageID",
        "status": "RecordType",
        "applied": ["Delivery"],
        "not_applied": ["Bounce"],
    }
    h, _ = hooks(ledger, ENV, **table)
    one = body(MessageID="pm-1", RecordType="Delivery")
    ctype = {"Content-Type": "application/json"}
    assert h.handle("p", "POST", ctype, one, query="token=wrong").status == 401
    assert h.handle("p", "POST", ctype, one).status == 401
    assert h.handle("p", "POST", ctype, one, query="token=tok-3f9a").reason == "matched"
    basic = base64.b64encode(b"postmark:tok-3f9a").decode()
    two = body(MessageID="pm-2", RecordType="Bounce")
    assert (
        h.handle("p", "POST", {**ctype, "Authorization": f"Basic {basic}"}, two).reason == "matched"
    )
    assert [ledger.get(a).status for a in ("a-1", "a-2")] == [Status.CONFIRMED, Status.FAILED]
    wrong = base64.b64encode(b"postmark:nope").decode()
    assert h.handle("p", "POST", {**ctype, "Authorization": f"Basic {wrong}"}, two).status == 401
