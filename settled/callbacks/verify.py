"""Signature checks, one per scheme, over the raw body bytes exactly as received and
before anything reads the body (rule 16). Each returns what the signature vouches for
(``Signed``: the scheme's own event id, when it has one) or raises ``Refused``.

- ``standard-webhooks``: ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``
  (space-separated ``v1,<base64>``, any of which may match: secret rotation); the
  expected signature is made by the ``standardwebhooks`` package (``settled[callbacks]``),
  over ``{id}.{timestamp}.{body}``; the package's own check is not used, because it
  reads the wall clock and allows a fixed 5 minutes.
- ``stripe``: ``Stripe-Signature: t=…,v1=…[,v1=…]``: HMAC-SHA256 (hex) of ``{t}.{body}``
  with the endpoint secret; every ``v1`` is tried.
- ``github``: ``X-Hub-Signature-256: sha256=<hex>``: HMAC-SHA256 of the body; no
  timestamp (replays are caught by the ``X-GitHub-Delivery`` id).
- ``twilio``: ``X-Twilio-Signature``: base64 HMAC-SHA1 (or SHA-256 where
  ``X-Twilio-Webhooks-Signature-Settings`` says so) of the public URL (config ``url``
  plus the query string as received) followed by each form parameter's name and value,
  sorted; with and without the default port, as Twilio's own validator does. A JSON
  body is signed through ``bodySHA256`` in the query string. Reading the form pairs
  is part of the signature, not of the body's meaning.
- ``hmac-sha256``: HMAC-SHA256 of the body in ``header``, hex or base64, after ``prefix``.
- ``token``: the secret as the ``token`` query parameter or as the password of HTTP
  Basic auth. It signs nothing: weaker, and ``providers audit`` says so.

A timestamp is fresh when ``|now - t| <= tolerance``, in both directions. Every
comparison of a secret-derived value is ``hmac.compare_digest``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..errors import ConfigError, MissingExtra
from .config import CallbackConfig

INSTALL = "pip install 'settled[callbacks]'"
MAX_SIGNATURES = 16  # signatures one header may carry (rotation needs two or three)


class Refused(Exception):
    """A callback refused before its body was read: the HTTP status and the reason
    code (``bad_signature``, ``stale``). The sender learns nothing more."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


BAD = Refused(401, "bad_signature")
STALE = Refused(401, "stale")


@dataclass(frozen=True)
class Signed:
    """What a verified signature vouches for beyond the body."""

    event_id: str | None = None  # the scheme's own id (webhook-id, X-GitHub-Delivery)


class Verifier:
    """One provider's check, with its secret read once (``resolve_secret``)."""

    def __init__(self, cfg: CallbackConfig, secret: str) -> None:
        self.cfg = cfg
        self.secret = secret
        self._std: Any = None
        if cfg.scheme == "standard-webhooks":
            self._std = _standard_webhook(cfg, secret)

    def check(self, headers: Mapping[str, str], body: bytes, query: str, now: datetime) -> Signed:
        scheme = self.cfg.scheme
        if scheme == "standard-webhooks":
            return self._standard(headers, body, now)
        if scheme == "stripe":
            return self._stripe(headers, body, now)
        if scheme == "github":
            return self._github(headers, body)
        if scheme == "twilio":
            return self._twilio(headers, body, query)
        if scheme == "hmac-sha256":
            return self._hmac(headers, body)
        return self._token(headers, query)

    # -- schemes --------------------------------------------------------------------------

    def _standard(self, headers: Mapping[str, str], body: bytes, now: datetime) -> Signed:
        msg_id = headers.get("webhook-id", "")
        stamp = headers.get("webhook-timestamp", "")
        sigs = headers.get("webhook-signature", "")
        if not msg_id or not sigs or not _whole(stamp):
            raise BAD
        try:
            text = body.decode("utf-8")  # every standard-webhooks library signs text
        except UnicodeDecodeError:
            raise BAD from None
        when = datetime.fromtimestamp(int(stamp), tz=UTC)
        signed = self._std.sign(msg_id, when, text)
        expected = base64.b64decode(signed.split(",", 1)[1])
        offered = sigs.split(" ")[:MAX_SIGNATURES]
        if not any(_matches_v1(expected, s) for s in offered):
            raise BAD
        self._fresh(int(stamp), now)
        return Signed(event_id=msg_id)

    def _stripe(self, headers: Mapping[str, str], body: bytes, now: datetime) -> Signed:
        header = headers.get("stripe-signature", "")
        stamp = ""
        offered: list[str] = []
        for part in header.split(",")[: MAX_SIGNATURES * 2]:
            name, sep, value = part.strip().partition("=")
            if not sep:
                continue
            if name == "t":
                stamp = value
            elif name == "v1":
                offered.append(value)
        if not _whole(stamp) or not offered:
            raise BAD
        mac = hmac.new(self.secret.encode(), stamp.encode() + b"." + body, hashlib.sha256)
        expected = mac.hexdigest()
        if not any(
            hmac.compare_digest(expected, v.encode("ascii", "replace").decode()) for v in offered
        ):
            raise BAD
        self._fresh(int(stamp), now)
        return Signed()

    def _github(self, headers: Mapping[str, str], body: bytes) -> Signed:
        offered = headers.get("x-hub-signature-256", "")
        delivery = headers.get("x-github-delivery", "")
        expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if not delivery or not hmac.compare_digest(expected.encode(), offered.encode()):
            raise BAD
        return Signed(event_id=delivery)

    def _twilio(self, headers: Mapping[str, str], body: bytes, query: str) -> Signed:
        offered = headers.get("x-twilio-signature", "")
        settings = headers.get("x-twilio-webhooks-signature-settings", "")
        algorithm: Callable[[], Any] = hashlib.sha1
        for part in settings.split(","):
            name, sep, value = part.partition("=")
            if sep and name.strip() == "algorithm":
                if value.strip().upper() == "HMAC_SHA256":
                    algorithm = hashlib.sha256
                elif value.strip().upper() != "HMAC_SHA1":
                    raise BAD
        if not offered:
            raise BAD
        assert self.cfg.url is not None
        url = self.cfg.url + (f"?{query}" if query else "")
        params: list[tuple[str, str]] = []
        qs = dict(parse_qsl(query, keep_blank_values=True))
        if "bodySHA256" in qs:
            digest = hashlib.sha256(body).hexdigest()
            if not hmac.compare_digest(
                digest.encode(), qs["bodySHA256"].encode("utf-8", "replace")
            ):
                raise BAD
        else:
            try:
                params = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
            except (UnicodeDecodeError, ValueError):
                raise BAD from None
        for candidate in _with_and_without_port(url):
            expected = _twilio_signature(self.secret, candidate, params, algorithm)
            if hmac.compare_digest(expected.encode(), offered.encode("utf-8", "replace")):
                return Signed()
        raise BAD

    def _hmac(self, headers: Mapping[str, str], body: bytes) -> Signed:
        assert self.cfg.header is not None
        offered = headers.get(self.cfg.header.lower(), "")
        if not offered.startswith(self.cfg.prefix):
            raise BAD
        offered = offered[len(self.cfg.prefix) :].strip()
        digest = hmac.new(self.secret.encode(), body, hashlib.sha256).digest()
        if self.cfg.encoding == "hex":
            ok = hmac.compare_digest(
                digest.hex().encode(), offered.lower().encode("utf-8", "replace")
            )
        else:
            try:
                given = base64.b64decode(offered, validate=True)
            except (binascii.Error, ValueError):
                raise BAD from None
            ok = hmac.compare_digest(digest, given)
        if not ok:
            raise BAD
        return Signed()

    def _token(self, headers: Mapping[str, str], query: str) -> Signed:
        wanted = self.secret.encode()
        given = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "token"]
        auth = headers.get("authorization", "")
        scheme, _, cred = auth.partition(" ")
        if scheme.lower() == "basic" and cred:
            try:
                user, sep, password = (
                    base64.b64decode(cred.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, ValueError):
                raise BAD from None
            if sep and (
                self.cfg.username is None
                or hmac.compare_digest(user.encode(), self.cfg.username.encode())
            ):
                given.append(password)
        if not any(hmac.compare_digest(wanted, g.encode("utf-8", "replace")) for g in given):
            raise BAD
        return Signed()

    def _fresh(self, stamp: int, now: datetime) -> None:
        if abs(now.timestamp() - stamp) > self.cfg.tolerance:
            raise STALE


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 12


def _matches_v1(expected: bytes, offered: str) -> bool:
    version, sep, sig = offered.partition(",")
    if not sep or version != "v1":
        return False
    try:
        given = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(expected, given)


def _twilio_signature(
    token: str, url: str, params: list[tuple[str, str]], algorithm: Callable[[], Any]
) -> str:
    """Twilio's: the URL, then each distinct parameter name in order with each of its
    distinct values in order."""
    by_name: dict[str, set[str]] = {}
    for name, value in params:
        by_name.setdefault(name, set()).add(value)
    text = url + "".join(n + v for n in sorted(by_name) for v in sorted(by_name[n]))
    mac = hmac.new(token.encode(), text.encode(), algorithm)
    return base64.b64encode(mac.digest()).decode()


def _with_and_without_port(url: str) -> list[str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    without = urlunsplit(parts._replace(netloc=shown))
    with_port = urlunsplit(parts._replace(netloc=f"{shown}:{parts.port or default}"))
    return list(dict.fromkeys([url, without, with_port]))


def _standard_webhook(cfg: CallbackConfig, secret: str) -> Any:
    try:
        from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook
    except ImportError:
        raise MissingExtra(
            f'{cfg.where}: scheme = "standard-webhooks" needs the standardwebhooks package: '
            f"{INSTALL}"
        ) from None
    try:
        return Webhook(secret)
    except (binascii.Error, ValueError, RuntimeError, EmptyWebhookSecretError) as exc:
        raise ConfigError(
            f"{cfg.where}.secret: not a standard-webhooks secret (whsec_ followed by base64): "
            f"{type(exc).__name__}"
        ) from None


__all__ = ["INSTALL", "Refused", "Signed", "Verifier"]
