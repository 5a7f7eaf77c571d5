"""The ``sendgrid`` scheme against SendGrid's own: the test vector its libraries share
(public key, payload, signature, timestamp, and the "bad key" beside it), and
signatures checked by the ``sendgrid`` package's ``EventWebhook`` helper, which also
accepts what settled's signer makes. ECDSA P-256 over timestamp + body, verified with
``cryptography``; the key is public and lives in the config, checked when it loads.
Through the core, on both backends."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hookkit import T0, callbacks_config, hooks, p256, sent, snapshot

from settled.callbacks.schemes import Message
from settled.callbacks.schemes.sendgrid import SendGrid
from settled.errors import ConfigError
from settled.model import Status
from settled.storage import Ledger

# SendGrid's published vector (sendgrid-python, -nodejs, -ruby, -go, -java, -php tests)
PUBLIC_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7"
    "yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="
)
BAD_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8RE"
    "ntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA=="
)
SIGNATURE = (
    "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWY"
    "NH2j/0="
)
TIMESTAMP = "1588788367"
PAYLOAD = b'{"category":"example_payload","event":"test_event","message_id":"message_id"}'

TABLE: dict[str, Any] = {
    "scheme": "sendgrid",
    "public_key": PUBLIC_KEY,
    "names": "provider_object_id",
    "key": "/sg_message_id",
    "status": "/event",
    "applied": ["delivered"],
    "not_applied": ["bounce", "dropped"],
    "delivered": ["processed", "deferred"],
}
SIG = "X-Twilio-Email-Event-Webhook-Signature"
STAMP = "X-Twilio-Email-Event-Webhook-Timestamp"


def vector_headers(**over: str) -> dict[str, str]:
    return {SIG: SIGNATURE, STAMP: TIMESTAMP, "Content-Type": "application/json", **over}


def test_sendgrid_published_vector(ledger: Ledger) -> None:
    from sendgrid.helpers.eventwebhook import EventWebhook

    ew = EventWebhook(PUBLIC_KEY)
    assert ew.verify_signature(PAYLOAD.decode(), SIGNATURE, TIMESTAMP)  # SendGrid's own check
    sent(ledger, object_id="message_id")
    table = {
        **TABLE,
        "key": "/message_id",
        "event_id": "/category",  # the vector's event carries no sg_event_id
        "applied": ["test_event"],
    }
    h, _ = hooks(ledger, {}, now=datetime.fromtimestamp(int(TIMESTAMP), UTC), **table)
    before = snapshot(ledger, "a-1")
    refused = [
        h.handle("p", "POST", vector_headers(), b'{"category":"example_payload"}'),
        h.handle("p", "POST", vector_headers(**{STAMP: "1388788367"}), PAYLOAD),
        h.handle("p", "POST", vector_headers(**{SIG: SIGNATURE[:-8] + "AAAAAAA="}), PAYLOAD),
        h.handle("p", "POST", vector_headers(**{SIG: "not base64!"}), PAYLOAD),
        h.handle("p", "POST", vector_headers(**{SIG: base64.b64encode(b"x").decode()}), PAYLOAD),
    ]
    assert [(a.status, a.reason) for a in refused] == [(401, "bad_signature")] * 5
    h_bad, _ = hooks(
        ledger,
        {},
        now=datetime.fromtimestamp(int(TIMESTAMP), UTC),
        **{**table, "public_key": BAD_KEY},
    )
    assert h_bad.handle("p", "POST", vector_headers(), PAYLOAD).status == 401
    assert snapshot(ledger, "a-1") == before
    got = h.handle("p", "POST", vector_headers(), PAYLOAD)
    assert (got.status, got.reason) == (200, "matched")
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_a_batch_signed_as_sendgrid_signs_is_read_event_by_event(ledger: Ledger) -> None:
    from sendgrid.helpers.eventwebhook import EventWebhook

    private, public = p256()
    sent(ledger, "a-1", object_id="sg-1")
    sent(ledger, "a-2", object_id="sg-2")
    h, _ = hooks(ledger, {}, **{**TABLE, "public_key": public})
    batch = json.dumps(
        [
            {"sg_message_id": "sg-1", "event": "processed", "sg_event_id": "e-1"},
            {"sg_message_id": "sg-1", "event": "delivered", "sg_event_id": "e-2"},
            {"sg_message_id": "sg-2", "event": "bounce", "sg_event_id": "e-3"},
            {"sg_message_id": "sg-2", "event": "open"},  # no id of its own: malformed
        ]
    ).encode()
    signed = SendGrid(public_keys=(public,)).sign(
        private,
        Message(batch, {"Content-Type": "application/json"}),
        url="",
        now=T0.timestamp(),
        event_id="",
    )
    headers = dict(signed.headers)
    # SendGrid's own helper accepts what settled's signer made
    assert EventWebhook(public).verify_signature(batch.decode(), headers[SIG], headers[STAMP])
    before = snapshot(ledger, "a-1", "a-2")
    stale = SendGrid(public_keys=(public,)).sign(
        private,
        Message(batch),
        url="",
        now=(T0 - timedelta(seconds=301)).timestamp(),
        event_id="",
    )
    assert h.handle("p", "POST", stale.headers, batch).reason == "stale"
    assert h.handle("p", "POST", headers, batch + b" ").reason == "bad_signature"
    assert snapshot(ledger, "a-1", "a-2") == before
    got = h.handle("p", "POST", headers, batch)
    assert (got.status, got.counts) == (200, {"matched": 3, "malformed": 1})
    assert [ledger.get(a).status for a in ("a-1", "a-2")] == [Status.CONFIRMED, Status.FAILED]
    again = h.handle("p", "POST", headers, batch)
    assert again.counts == {"duplicate": 3, "malformed": 1}


BAD_TABLES = [
    ({"public_key": "not base64 at all"}, "callbacks.public_key: not a P-256 public key"),
    ({"public_key": base64.b64encode(b"\x30" * 91).decode()}, "not a P-256 public key"),
    ({"public_key": None}, "callbacks.public_key: missing: the verification key"),
    ({"public_key": None, "public_keys": []}, "callbacks.public_keys: must be a non-empty list"),
    ({"public_keys": [PUBLIC_KEY]}, "callbacks.public_keys: give public_key or public_keys"),
    ({"secret": "${SG}"}, "callbacks.secret: the sendgrid scheme verifies with a public key"),
    ({"header": "X-Sig"}, "callbacks.header: applies to scheme = 'hmac-sha256' only"),
]


@pytest.mark.ledger_free
@pytest.mark.parametrize(("change", "message"), BAD_TABLES)
def test_a_bad_sendgrid_table_is_one_line(change: dict[str, Any], message: str) -> None:
    table = {k: v for k, v in {**TABLE, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        callbacks_config(**table)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.ledger_free
def test_a_pem_key_and_a_rotation_list_load() -> None:
    pem = "-----BEGIN PUBLIC KEY-----\n" + PUBLIC_KEY + "\n-----END PUBLIC KEY-----\n"
    cb = callbacks_config(**{**TABLE, "public_key": pem})["p"]
    assert cb.signing.public_keys == (PUBLIC_KEY,) and cb.secrets == ()
    table = {k: v for k, v in TABLE.items() if k != "public_key"}
    cb = callbacks_config(**{**table, "public_keys": [BAD_KEY, PUBLIC_KEY]})["p"]
    assert cb.signing.public_keys == (BAD_KEY, PUBLIC_KEY)
    assert cb.event_id is not None and cb.event_id.text == "/sg_event_id"
