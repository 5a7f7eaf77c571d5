"""Helpers for the callback tests: a provider's callbacks config, records sent by hand
(claimed, then answered), requests signed the way each sender signs them, and a
snapshot of everything a refused callback must leave as it was."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from settled import config, policy
from settled.callbacks import Hooks
from settled.clock import FakeClock, to_text
from settled.model import ActionRecord, Declared, Status, Tier
from settled.providers.base import Wire, WireResult
from settled.storage import Ledger

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TWILIO_URL = "https://hooks.example.com/hooks/sms"


def callbacks_config(provider: str = "p", **table: Any) -> Any:
    """``Config.callbacks`` for one provider whose ``[providers.P.callbacks]`` is ``table``."""
    cfg = config.from_dict(
        {
            "providers": {
                provider: {"type": "sim", "base_url": "http://127.0.0.1:9", "callbacks": table}
            }
        },
        source="settled.toml",
    )
    return cfg.callbacks


def hooks(
    ledger: Ledger,
    env: dict[str, str],
    *,
    now: datetime = T0,
    max_body: int = 1024 * 1024,
    provider: str = "p",
    **table: Any,
) -> tuple[Hooks, FakeClock]:
    clock = FakeClock(now)
    return Hooks(
        ledger, callbacks_config(provider, **table), env=env, clock=clock, max_body=max_body
    ), clock


def declared(tier: Tier) -> Declared:
    return Declared(
        tier,
        consistency_window=0.0,
        queryable=tier is Tier.RECONCILABLE,
        carries_key=tier is not Tier.BLIND,
        verify_interval=1.0,
        verify_deadline=60.0,
    )


def in_flight(
    ledger: Ledger,
    aid: str = "a-1",
    *,
    tier: Tier = Tier.PARTIAL,
    provider: str = "p",
    now: datetime = T0,
) -> tuple[ActionRecord, policy.Claim]:
    """A record claimed and sent, its reply not written yet."""
    d = declared(tier)
    rec = policy.new_record(
        action_id=aid, provider=provider, operation="send", params={"n": aid}, declared=d, now=now
    )
    taken = policy.claim(rec, d, now, actor="test", grace=30.0, default_backoff=0.05)
    claimed, _ = ledger.record_and_claim(rec, actor="test", claim=taken.move)
    return claimed, taken


def answer(
    ledger: Ledger,
    rec: ActionRecord,
    taken: policy.Claim,
    *,
    object_id: str | None = "obj-1",
    verdict: policy.ReplyProof = policy.ReplyProof.ACCEPTED,
    code: int = 202,
    now: datetime = T0,
) -> ActionRecord:
    """Write the dispatcher's outcome for ``rec`` (a reply carrying ``object_id``)."""
    wire = WireResult(Wire.ANSWERED, status_code=code, object_id=object_id)
    move = policy.outcome(
        rec,
        rec.declared or declared(rec.tier),
        verdict,
        wire,
        now,
        owner=taken.owner,
        actor="test",
        tries=[],
    )
    written = ledger.move(move)
    assert written is not None
    return written


def sent(
    ledger: Ledger,
    aid: str = "a-1",
    *,
    object_id: str | None = "obj-1",
    tier: Tier = Tier.PARTIAL,
    provider: str = "p",
) -> ActionRecord:
    """A record sent and answered (AWAITING_VERIFICATION for partial/reconcilable)."""
    rec, taken = in_flight(ledger, aid, tier=tier, provider=provider)
    return answer(ledger, rec, taken, object_id=object_id)


def snapshot(ledger: Ledger, *ids: str) -> Any:
    """Everything a refused callback must leave as it was."""
    return (
        [ledger.find(a) for a in ids],
        [[e.to_json() for e in ledger.events(a)] for a in ids],
        {p: f.to_json() for p, f in ledger.callback_figures().items()},
    )


# -- signing, as each sender does ------------------------------------------------------------


def std_headers(
    body: bytes, *, msg_id: str = "msg_1", ts: datetime = T0, secret: str = STD_SECRET
) -> dict[str, str]:
    from standardwebhooks.webhooks import Webhook

    sig = Webhook(secret).sign(msg_id, ts, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(ts.timestamp())),
        "webhook-signature": sig,
        "content-type": "application/json",
    }


def stripe_headers(body: bytes, secret: str, *, ts: datetime = T0) -> dict[str, str]:
    import stripe

    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=int(ts.timestamp())
    )
    return {"Stripe-Signature": header, "Content-Type": "application/json"}


def github_headers(body: bytes, secret: str, delivery: str = "d-1") -> dict[str, str]:
    sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": sig,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "x",
        "Content-Type": "application/json",
    }


def twilio_request(
    params: dict[str, str], token: str, *, url: str = TWILIO_URL, query: str = ""
) -> tuple[dict[str, str], bytes]:
    from twilio.request_validator import RequestValidator

    full = url + (f"?{query}" if query else "")
    sig = RequestValidator(token).compute_signature(full, params)
    headers = {"X-Twilio-Signature": sig, "Content-Type": "application/x-www-form-urlencoded"}
    return headers, urlencode(params).encode()


def hmac_headers(
    body: bytes,
    secret: str,
    *,
    header: str = "X-Signature",
    prefix: str = "",
    encoding: str = "hex",
) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    text = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    return {header: prefix + text, "Content-Type": "application/json"}


def p256() -> tuple[str, str]:
    """A fresh P-256 key pair: the private key (base64 PKCS#8 DER) and the public one
    (base64 SubjectPublicKeyInfo DER, as SendGrid shows it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(private).decode(), base64.b64encode(public).decode()


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def at(ts: datetime) -> str:
    return to_text(ts)


OPEN = (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)
