"""A provider's callbacks verified: its scheme's signature check (``settled.callbacks
.schemes``, one class per scheme) over the raw body bytes exactly as received and
before anything reads the body, with its secrets read once, then the signed timestamp
judged against ``tolerance`` by the ledger's clock (rule 12): fresh when
``|now - t| <= tolerance``, in both directions (some SDKs accept any future time: this
does not). Each check returns what the signature vouches for (``Signed``) or raises
``Refused``; the reason tells ``bad_signature`` from ``stale``, and the sender learns
nothing more.

``required_headers(cfg)`` names the headers without which a request is refused before
its body is read, so that a server can refuse an unsigned upload without taking it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from .schemes import BAD, STALE, Message, Refused, Signed
from .schemes.scheme import INSTALL
from .settings import CallbackConfig


def required_headers(cfg: CallbackConfig) -> tuple[str, ...]:
    """The lower-case header names whose absence refuses a request to ``cfg``'s hook
    with 401 before its body is read (none for a scheme whose signature is in the body
    or the query string)."""
    return cfg.signing.required_headers()


class Verifier:
    """One provider's check, with its key material made once from its secrets (read by
    ``config.resolve_secrets``; one secret may be given as a string)."""

    def __init__(self, cfg: CallbackConfig, secrets: str | Sequence[str]) -> None:
        self.cfg = cfg
        self.scheme = cfg.signing
        self.required = self.scheme.required_headers()
        given = (secrets,) if isinstance(secrets, str) else tuple(secrets)
        self._keys = self.scheme.keys(given, cfg.where)

    def missing(self, headers: Mapping[str, str]) -> bool:
        """Whether a required header is absent or empty (``headers`` lower-case)."""
        return any(not headers.get(name) for name in self.required)

    def check(self, headers: Mapping[str, str], body: bytes, query: str, now: datetime) -> Signed:
        """Verify one request (``headers`` with lower-case names); raises ``Refused``."""
        if self.missing(headers):
            raise BAD
        signed = self.scheme.verify(self._keys, Message(body, headers, query))
        if signed.timestamp is not None and (
            abs(now.timestamp() - signed.timestamp) > self.cfg.tolerance
        ):
            raise STALE
        return signed

    def handshake(
        self, headers: Mapping[str, str], body: bytes, query: str
    ) -> dict[str, object] | None:
        """The scheme's answer to a verified handshake (Slack's challenge), or None."""
        return self.scheme.handshake(Message(body, headers, query))


__all__ = ["INSTALL", "Refused", "Signed", "Verifier", "required_headers"]
