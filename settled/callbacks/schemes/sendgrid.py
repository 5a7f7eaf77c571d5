"""``sendgrid``: SendGrid's signed Event Webhook.

``X-Twilio-Email-Event-Webhook-Signature``: base64 of an ECDSA P-256 signature (DER)
over ``timestamp + body``, SHA-256, where the timestamp is
``X-Twilio-Email-Event-Webhook-Timestamp`` (judged against ``tolerance``). The key is
public: ``public_key`` in the config, base64 DER as SendGrid's settings show it (or
``public_keys``, a list, while one is replaced); no secret is read. Verified with the
``cryptography`` package (``settled[callbacks]``), loaded when a process that receives
callbacks starts. A batch's events each carry their id, ``sg_event_id``, unless the
config names another field.

The signer (for the simulator and the tests) takes the private key: base64 DER
(PKCS#8 or SEC 1) or PEM.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from ...errors import ConfigError, MissingExtra
from .scheme import BAD, INSTALL, Fail, Message, Scheme, Signed, whole

# A P-256 public key as SubjectPublicKeyInfo DER: this prefix (id-ecPublicKey,
# prime256v1, a BIT STRING of 66 bytes), then the uncompressed point (04 || X || Y).
_P256_SPKI = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")
_P256_LENGTH = len(_P256_SPKI) + 65
MAX_SIGNATURE = 200  # characters of the header: a DER P-256 signature is at most 72 bytes


@dataclass(frozen=True)
class SendGrid(Scheme):
    name = "sendgrid"
    options = ("public_key", "public_keys")
    signs = "ECDSA P-256 (SHA-256) of {timestamp}{body}"
    takes_secret = False
    timestamped = True
    event_field = "/sg_event_id"
    public_keys: tuple[str, ...] = ()

    @classmethod
    def parse(cls, table: Mapping[str, Any], fail: Fail) -> Self:
        if "public_key" in table and "public_keys" in table:
            raise fail("public_keys", "give public_key or public_keys, not both")
        if "public_keys" in table:
            raw = table["public_keys"]
            if not isinstance(raw, list) or not raw:
                raise fail("public_keys", "must be a non-empty list of base64 public keys")
            name, given = "public_keys", raw
        elif "public_key" in table:
            name, given = "public_key", [table["public_key"]]
        else:
            raise fail(
                "public_key",
                "missing: the verification key from SendGrid's Event Webhook settings "
                '(base64), e.g. public_key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE…"',
            )
        keys = tuple(_public_key(fail, name, k) for k in given)
        return cls(public_keys=keys)

    def required_headers(self) -> tuple[str, ...]:
        return (
            "x-twilio-email-event-webhook-signature",
            "x-twilio-email-event-webhook-timestamp",
        )

    def keys(self, secrets: Sequence[str], where: str) -> tuple[Any, ...]:
        return tuple(_verifier(base64.b64decode(k), where) for k in self.public_keys)

    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        stamp = message.header("x-twilio-email-event-webhook-timestamp")
        header = message.header("x-twilio-email-event-webhook-signature")
        if not whole(stamp) or not header or len(header) > MAX_SIGNATURE:
            raise BAD
        try:
            signature = base64.b64decode(header, validate=True)
        except (binascii.Error, ValueError):
            raise BAD from None
        signed = stamp.encode() + message.body
        if not any(check(signature, signed) for check in keys):
            raise BAD
        return Signed(timestamp=int(stamp))

    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        ec, hashes, _, serialization = _crypto("the sendgrid signer")
        if "-----BEGIN" in secret:
            private = serialization.load_pem_private_key(secret.encode(), password=None)
        else:
            private = serialization.load_der_private_key(base64.b64decode(secret), password=None)
        stamp = str(int(now))
        sig = private.sign(stamp.encode() + message.body, ec.ECDSA(hashes.SHA256()))
        return message.with_headers(
            **{
                "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(sig).decode(),
                "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
            }
        )


def _public_key(fail: Fail, name: str, raw: Any) -> str:
    """One key as written: base64 (PEM armour and whitespace allowed) of a P-256 key."""
    text = raw if isinstance(raw, str) else ""
    lines = [ln.strip() for ln in text.strip().splitlines() if not ln.startswith("-----")]
    compact = "".join("".join(lines).split())
    try:
        der = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    if len(der) != _P256_LENGTH or not der.startswith(_P256_SPKI) or der[len(_P256_SPKI)] != 4:
        raise fail(
            name,
            "not a P-256 public key in base64 (DER), as SendGrid's Event Webhook settings "
            'show it: "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE…"',
        )
    return compact


def _verifier(der: bytes, where: str) -> Callable[[bytes, bytes], bool]:
    """A check of (signature, signed bytes) against one public key."""
    ec, hashes, invalid, serialization = _crypto(f'{where}: scheme = "sendgrid"')
    try:
        key = serialization.load_der_public_key(der)
    except ValueError:
        raise ConfigError(f"{where}.public_key: not a point on P-256") from None

    def check(signature: bytes, signed: bytes) -> bool:
        try:
            key.verify(signature, signed, ec.ECDSA(hashes.SHA256()))
        except invalid:
            return False
        return True

    return check


def _crypto(what: str) -> tuple[Any, Any, Any, Any]:
    """cryptography's ECDSA parts, imported where a key is made (the extra is needed
    only where callbacks are received)."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise MissingExtra(f"{what} needs the cryptography package: {INSTALL}") from None
    return ec, hashes, InvalidSignature, serialization


__all__ = ["SendGrid"]
