"""Who is at the console, and that a form came from it: signed sessions and CSRF tokens.

Nothing is held in memory (several ``serve`` processes may share one ledger behind a
load balancer): a session is a cookie whose JSON payload is signed with HMAC-SHA256,
and a form's CSRF token is an HMAC of the session's id. Any process with the same key
reads both.

The key is ``[serve.ui] session_secret`` (a ``${VAR}``, at least 16 characters), or,
without it, derived from the API tokens' secrets (an HMAC over them, sorted): then a
change to any token ends every console session, which is the safe direction.

Two ways in:

- **token**: the person pastes an API token (and may give their name). The cookie names
  the token and holds a fingerprint of its secret, and the roles are read from the
  config on every request: a token removed or given a new secret ends its sessions.
- **proxy**: a request whose peer address is in ``[serve.ui] trusted_proxies`` and that
  carries ``user_header`` names its person; they have ``proxy_roles``. The header is
  ignored from any other address. The session cookie is bound to that name: every
  request must still come from a trusted proxy naming the same person.

A person acts as ``operator:NAME via ui:HOW:SID`` in the ledger's events (``HOW`` is
``token:TOKEN`` or ``proxy``; ``SID`` the session's id), so every verdict names who
gave it and in which console session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import checks
from ..config import Config
from ..errors import ConfigError
from .auth import INCLUDES, MAX_NAME, MIN_SECRET, VIA, Tokens, name_problem

COOKIE = "settled_session"


@dataclass(frozen=True)
class Person:
    """Someone logged in to the console."""

    name: str
    how: str  # "token:NAME" or "proxy"
    sid: str
    allowed: frozenset[str]
    expires: int

    def may(self, role: str) -> bool:
        return role in self.allowed

    @property
    def session(self) -> str:
        return f"ui:{self.how}:{self.sid}"

    @property
    def actor(self) -> str:
        """Who this person is in the ledger's events: ``operator:NAME via ui:HOW:SID``
        (a verdict passes ``name`` and ``session`` apart: ``by`` and ``via``)."""
        return f"operator:{self.name}{VIA}{self.session}"

    @property
    def roles(self) -> str:
        shown = [r for r in ("operate", "dispatch") if r in self.allowed]
        return ", ".join(shown) if shown else "read only"


class Sessions:
    """The console's key, its trusted proxies, and the checks of a request's session."""

    def __init__(self, key: bytes | None, tokens: Tokens, cfg: Config) -> None:
        self.key = key
        self.tokens = tokens
        self.ui = cfg.serve.ui
        self.networks = [ipaddress.ip_network(p, strict=False) for p in self.ui.trusted_proxies]
        self.proxy_allowed: frozenset[str] = frozenset().union(
            *(INCLUDES[r] for r in self.ui.proxy_roles)
        )

    @classmethod
    def from_config(
        cls, cfg: Config, tokens: Tokens, env: Mapping[str, str] | None = None
    ) -> Sessions:
        """The key read from the environment now: an unset or short secret stops the
        service at start. Without a secret and without tokens there is no key: the
        console then says how to set one, and logs nobody in."""
        env = os.environ if env is None else env
        raw = cfg.serve.ui.session_secret
        key: bytes | None = None
        if raw is not None:
            where = cfg.where("serve.ui.session_secret")
            secret, _ = checks.expand_env(where, raw, env)
            if len(secret) < MIN_SECRET:
                raise ConfigError(
                    f"{where}: the secret must be at least {MIN_SECRET} characters (its "
                    "environment variable holds fewer); make one with `openssl rand -hex 32`"
                )
            key = hashlib.sha256(b"settled-ui:" + secret.encode("utf-8", "surrogatepass")).digest()
        elif len(tokens):
            mac = hmac.new(b"settled-ui-derived", digestmod=hashlib.sha256)
            for s in sorted(tokens.secrets):
                mac.update(hashlib.sha256(s.encode("utf-8", "surrogatepass")).digest())
            key = mac.digest()
        return cls(key, tokens, cfg)

    # ------------------------------------------------------------ signing

    def _mac(self, purpose: str, data: bytes) -> bytes:
        assert self.key is not None
        return hmac.new(self.key, purpose.encode() + b"\0" + data, hashlib.sha256).digest()

    def seal(self, payload: dict[str, Any]) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{_b64(self._mac('session', body.encode()))}"

    def unseal(self, value: str) -> dict[str, Any] | None:
        if self.key is None or value.count(".") != 1 or len(value) > 4096:
            return None
        body, _, sig = value.partition(".")
        try:
            given = _unb64(sig)
            if not hmac.compare_digest(given, self._mac("session", body.encode())):
                return None
            data = json.loads(_unb64(body))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def csrf(self, person: Person) -> str:
        """The CSRF token of every form this person is shown."""
        return _b64(self._mac("csrf", person.sid.encode()))

    def csrf_ok(self, person: Person, presented: str | None) -> bool:
        if not presented or len(presented) > 200:
            return False
        return hmac.compare_digest(presented.encode("ascii", "replace"), self.csrf(person).encode())

    def preview_digest(self, person: Person, shown: Mapping[str, Any]) -> str:
        """A bulk preview's seal over everything it showed (``shown``: the verdict, its
        recheck choice, reason, evidence and object id, the filter and exactly the ids,
        in order), bound to this person's session."""
        data = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(data.encode("utf-8", "surrogatepass")).digest()
        return _b64(self._mac("preview:" + person.sid, digest))

    # ------------------------------------------------------------ who is it

    def _fingerprint(self, digest: bytes) -> str:
        return _b64(self._mac("token", digest))[:22]

    def login(self, presented: str, name: str | None, now: float | None = None) -> Person | None:
        """A new session for the holder of API token ``presented`` (None: not a token)."""
        if self.key is None:
            return None
        caller = self.tokens.identify(presented)
        if caller is None:
            return None
        return self._person(name or caller.token, f"token:{caller.token}", caller.allowed, now)

    def _person(self, name: str, how: str, allowed: frozenset[str], now: float | None) -> Person:
        now = time.time() if now is None else now
        return Person(name, how, secrets.token_hex(6), allowed, int(now) + self.ui.session_ttl)

    def cookie(self, person: Person) -> str:
        payload: dict[str, Any] = {
            "n": person.name,
            "h": person.how,
            "s": person.sid,
            "e": person.expires,
        }
        if person.how.startswith("token:"):
            found = self.tokens.named(person.how.removeprefix("token:"))
            assert found is not None
            payload["f"] = self._fingerprint(found[1])
        return self.seal(payload)

    def trusted(self, peer: str | None) -> bool:
        if not peer or not self.networks:
            return False
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)

    def proxy_name(self, peer: str | None, headers: Any) -> tuple[str | None, str]:
        """The person a trusted proxy names (None when the request is not from one, or
        names nobody), and why a name it sent is refused."""
        if not self.trusted(peer):
            return None, ""
        values = headers.getlist(self.ui.user_header)
        if not values:
            return None, ""
        if len(values) > 1:
            return None, f"more than one {self.ui.user_header} header"
        why = name_problem(values[0])
        return (None, f"{self.ui.user_header}: {why}") if why else (values[0], "")

    def person(
        self, cookie: str | None, peer: str | None, headers: Any, now: float | None = None
    ) -> tuple[Person | None, bool, str]:
        """Who this request is: (person, whether the cookie must be set anew, why a
        proxy's name was refused)."""
        if self.key is None:
            return None, False, ""
        now = time.time() if now is None else now
        data = self.unseal(cookie) if cookie else None
        proxied, why = self.proxy_name(peer, headers)
        if proxied is not None:
            if data and data.get("h") == "proxy" and data.get("n") == proxied and data["e"] > now:
                return self._restore(data, self.proxy_allowed), False, ""
            return self._person(proxied, "proxy", self.proxy_allowed, now), True, ""
        if why:
            return None, False, why
        if not data or not isinstance(data.get("e"), int) or data["e"] <= now:
            return None, False, ""
        how = str(data.get("h", ""))
        if not how.startswith("token:"):
            return None, False, ""  # a proxy's session, without its proxy
        found = self.tokens.named(how.removeprefix("token:"))
        if found is None or not hmac.compare_digest(
            str(data.get("f", "")), self._fingerprint(found[1])
        ):
            return None, False, ""  # the token is gone, or has a new secret
        return self._restore(data, found[0].allowed), False, ""

    @staticmethod
    def _restore(data: dict[str, Any], allowed: frozenset[str]) -> Person:
        return Person(str(data["n"]), str(data["h"]), str(data["s"]), allowed, int(data["e"]))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64") from exc


__all__ = ["COOKIE", "MAX_NAME", "Person", "Sessions", "name_problem"]
