"""The ``slack`` scheme against Slack's own: the published example of "Verifying requests
from Slack" (signing secret, timestamp, slash-command body and signature), and
signatures made by ``slack_sdk``'s ``SignatureVerifier``, which also accepts what
settled accepts. The ``url_verification`` challenge is answered only once its
signature holds, and records nothing; a retry keeps its ``event_id`` and is a
duplicate. Through the core, on both backends."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from hookkit import T0, hooks, sent, snapshot

from settled.errors import ConfigError
from settled.model import Status
from settled.storage import Ledger

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # Slack's documented example secret
TABLE: dict[str, Any] = {
    "scheme": "slack",
    "secret": "${SLACK_SIGNING_SECRET}",
    "names": "provider_object_id",
    "key": "/event/ts",  # the message's ts, which chat.postMessage's reply gives
    "status": "/event/type",
    "applied": ["message"],
    "not_applied": ["message_deleted"],
}
ENV = {"SLACK_SIGNING_SECRET": SECRET}


class Clock:
    """slack_sdk's clock, pinned (its verifier reads the wall clock by default)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> float:
        return self.at.timestamp()


def slack_headers(body: bytes, *, at: datetime = T0, secret: str = SECRET) -> dict[str, str]:
    from slack_sdk.signature import SignatureVerifier

    stamp = str(int(at.timestamp()))
    sig = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    assert sig is not None
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": sig,
        "Content-Type": "application/json",
    }


def event(ts: str, kind: str = "message", event_id: str = "Ev1") -> bytes:
    return json.dumps(
        {
            "type": "event_callback",
            "event_id": event_id,
            "event_time": 1767225600,
            "event": {"type": kind, "channel": "C1", "ts": ts, "text": "hello"},
        }
    ).encode()


def test_slack_published_example_verifies(ledger: Ledger) -> None:
    """docs.slack.dev's example, byte for byte; settled's signer makes the same."""
    from settled.callbacks.schemes import Message
    from settled.callbacks.schemes.slack import Slack

    stamp = 1531420618
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
        b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
        b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
        b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
        b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    published = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    signed = Slack().sign(SECRET, Message(body), url="", now=stamp, event_id="")
    assert signed.headers["X-Slack-Signature"] == published
    h, _ = hooks(ledger, ENV, now=datetime.fromtimestamp(stamp, UTC), **TABLE)
    headers = {
        "X-Slack-Request-Timestamp": str(stamp),
        "X-Slack-Signature": published,
        "Content-Type": "application/x-www-form-urlencoded",
    }
    got = h.handle("p", "POST", headers, body)
    assert (got.status, got.reason) == (200, "ignored")  # signed; a slash command names nothing
    tampered = h.handle("p", "POST", headers, body.replace(b"foobar", b"foobaz"))
    assert (tampered.status, tampered.reason) == (401, "bad_signature")


def test_slack_sdk_signatures_settle_and_refuse(ledger: Ledger) -> None:
    from slack_sdk.signature import SignatureVerifier

    sent(ledger, object_id="1767225600.000100")
    h, _ = hooks(ledger, ENV, **TABLE)
    payload = event("1767225600.000100")
    headers = slack_headers(payload)
    # the SDK accepts what settled accepts
    assert SignatureVerifier(SECRET, Clock(T0)).is_valid_request(payload, headers)  # type: ignore[arg-type]
    before = snapshot(ledger, "a-1")
    refused = [
        h.handle("p", "POST", slack_headers(payload, secret="another-secret"), payload),
        h.handle("p", "POST", headers, payload.replace(b"hello", b"hellO")),
        h.handle("p", "POST", slack_headers(payload, at=T0 - timedelta(seconds=301)), payload),
        h.handle("p", "POST", slack_headers(payload, at=T0 + timedelta(seconds=301)), payload),
        h.handle("p", "POST", {**headers, "X-Slack-Signature": "v1=" + "0" * 64}, payload),
        h.handle("p", "POST", {**headers, "X-Slack-Request-Timestamp": "soon"}, payload),
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
    assert ledger.events("a-1")[-1].detail["event_id"] == "Ev1"
    # Slack retries an unanswered event with the same event_id, signed anew
    retry = {**slack_headers(payload, at=T0 + timedelta(seconds=60)), "X-Slack-Retry-Num": "1"}
    assert h.handle("p", "POST", retry, payload).reason == "duplicate"


def test_the_url_verification_challenge_is_answered_only_when_signed(ledger: Ledger) -> None:
    sent(ledger, object_id="1767225600.000100")
    h, _ = hooks(ledger, ENV, **TABLE)
    challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    body = json.dumps(
        {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge, "type": "url_verification"}
    ).encode()
    before = snapshot(ledger, "a-1")
    unsigned = h.handle("p", "POST", {"Content-Type": "application/json"}, body)
    forged = h.handle("p", "POST", slack_headers(body, secret="not-the-secret"), body)
    assert [(a.status, a.body) for a in (unsigned, forged)] == [
        (401, {"error": "unauthorized"})
    ] * 2
    got = h.handle("p", "POST", slack_headers(body), body)
    assert (got.status, got.reason, got.body) == (200, "challenge", {"challenge": challenge})
    assert json.loads(got.content()) == {"challenge": challenge}
    assert snapshot(ledger, "a-1") == before  # nothing recorded, not even a callback row
    odd = json.dumps({"type": "url_verification", "challenge": "x\n" * 300}).encode()
    assert h.handle("p", "POST", slack_headers(odd), odd).reason == "ignored"  # never echoed


def test_interactivity_posts_a_form_whose_payload_is_the_json(ledger: Ledger) -> None:
    sent(ledger, object_id="1767225600.000200")
    h, _ = hooks(ledger, ENV, **TABLE)
    inner = json.loads(event("1767225600.000200", event_id="Ev2"))
    form = urlencode({"payload": json.dumps(inner)}).encode()
    headers = {
        **slack_headers(form),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    assert h.handle("p", "POST", headers, form).reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


@pytest.mark.ledger_free
def test_slack_takes_a_tolerance_and_another_event_id_field() -> None:
    from hookkit import callbacks_config

    cb = callbacks_config(**{**TABLE, "tolerance": 60, "event_id": "/event/client_msg_id"})["p"]
    assert cb.tolerance == 60 and cb.event_id is not None
    assert cb.event_id.text == "/event/client_msg_id"
    assert callbacks_config(**TABLE)["p"].event_id.text == "/event_id"  # Slack's own field
    with pytest.raises(ConfigError, match=r"callbacks\.url: applies to scheme = 'twilio' only"):
        callbacks_config(**{**TABLE, "url": "https://h.example/hooks/slack"})
