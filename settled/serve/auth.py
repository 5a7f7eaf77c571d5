"""Who may call, and from where: bearer tokens with roles, and the Host and Origin checks.

Tokens (``[serve.tokens.NAME]``) are read from the environment when the service starts;
a presented token is compared with every configured one in constant time (its SHA-256
digest against theirs, ``hmac.compare_digest``, no early exit), so neither a match nor
its position leaks through timing. A token is taken from ``Authorization: Bearer``
only; the service never echoes, logs or stores one.

Roles: ``read`` (GET), ``dispatch`` (POST /actions, confirm), ``operate`` (confirm,
resolve, retry, reconcile); ``dispatch`` and ``operate`` include ``read``. A call acts
as ``api:NAME`` (the token's name) in the ledger's events.

Every route a browser can reach is checked for its ``Host`` (a DNS-rebinding page
names its own host: 421) and, for a write, its ``Origin`` (a page on another origin:
403). Same origin means the scheme the request arrived with (``X-Forwarded-Proto``
from a reverse proxy on this host) and its ``Host``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import checks
from ..address import is_loopback, is_wildcard
from ..config import ROLES, Config
from ..errors import ConfigError
from ..model import MAX_NAME, VIA, name_problem

MIN_SECRET = 16  # characters: `openssl rand -hex 32` gives 64
INCLUDES = {"read": {"read"}, "dispatch": {"read", "dispatch"}, "operate": {"read", "operate"}}
REALM = 'Bearer realm="settled"'


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the token's name and what its roles allow."""

    token: str
    allowed: frozenset[str]

    @property
    def actor(self) -> str:
        """Who this caller is in the ledger's events."""
        return f"api:{self.token}"

    def may(self, role: str) -> bool:
        return role in self.allowed


@dataclass(frozen=True)
class _Token:
    name: str
    digest: bytes
    allowed: frozenset[str]


class Tokens:
    """The configured API tokens, by digest."""

    def __init__(self, tokens: Iterable[tuple[str, str, Iterable[str]]] = ()) -> None:
        self._tokens: list[_Token] = []
        self.secrets: list[str] = []  # for the redactor: never logged or shown
        for name, secret, roles in tokens:
            allowed: set[str] = set()
            for role in roles:
                allowed |= INCLUDES[role]
            self._tokens.append(_Token(name, _digest(secret), frozenset(allowed)))
            self.secrets.append(secret)

    @classmethod
    def from_config(cls, cfg: Config, env: Mapping[str, str] | None = None) -> Tokens:
        """``[serve.tokens.NAME]`` with each ``${VAR}`` read from the environment now:
        an unset, short or shared secret stops the service at start."""
        env = os.environ if env is None else env
        out: list[tuple[str, str, tuple[str, ...]]] = []
        seen: dict[str, str] = {}
        for name, tok in cfg.serve.tokens.items():
            key = cfg.where(f"serve.tokens.{name}.secret")
            secret, _ = checks.expand_env(key, tok.secret, env)
            if len(secret) < MIN_SECRET:
                raise ConfigError(
                    f"{key}: the token must be at least {MIN_SECRET} characters (its environment "
                    "variable holds fewer); make one with `openssl rand -hex 32`"
                )
            if secret in seen:
                raise ConfigError(
                    f"{key}: the same secret as serve.tokens.{seen[secret]}; give every token "
                    "its own (the token names who acted)"
                )
            seen[secret] = name
            assert all(r in ROLES for r in tok.roles)
            out.append((name, secret, tok.roles))
        return cls(out)

    def __len__(self) -> int:
        return len(self._tokens)

    def named(self, name: str) -> tuple[Caller, bytes] | None:
        """The caller of the token called ``name`` and its secret's digest (for a
        console session that names its token), or None when there is none."""
        for tok in self._tokens:
            if tok.name == name:
                return Caller(tok.name, tok.allowed), tok.digest
        return None

    def digest_of(self, presented: str) -> bytes:
        return _digest(presented)

    def identify(self, presented: str) -> Caller | None:
        """The caller whose token this is, or None. Compares with every token."""
        digest = _digest(presented)
        found: _Token | None = None
        for tok in self._tokens:
            if hmac.compare_digest(digest, tok.digest) and found is None:
                found = tok
        return Caller(found.name, found.allowed) if found is not None else None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def bearer(values: list[str]) -> tuple[str | None, str]:
    """The token of an ``Authorization: Bearer`` header, or (None, why not)."""
    if not values:
        return None, "no token: send Authorization: Bearer TOKEN"
    if len(values) > 1:
        return None, "more than one Authorization header"
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None, "the Authorization header must be Bearer TOKEN"
    return token, ""


# ------------------------------------------------------------------ Host and Origin

DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header as (lower-case name, port or None); None when malformed."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@?# \\"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(":")
        if ":" in port:
            return None
    if port and not port.isdigit():
        return None
    return name, (int(port) if port else None)


class Guard:
    """The Host names this service answers to, and same-origin for writes.

    ``port`` is the bound port. Loopback listens answer to ``127.0.0.1``, ``localhost``
    and ``[::1]`` on that port; a specific address answers to itself; every listen
    answers to the ``[serve] hosts`` names (any port: a reverse proxy in front)."""

    def __init__(self, host: str, port: int, extra: Iterable[str] = ()) -> None:
        self.port = port
        self.exact: set[tuple[str, int | None]] = set()
        names = set()
        if is_loopback(host):
            names |= {"127.0.0.1", "localhost", "[::1]"}
        if not is_wildcard(host):
            names.add(f"[{host.lower()}]" if ":" in host else host.lower())
        for n in names:
            self.exact.add((n, port))
        self.named = {h.lower() for h in extra}

    def host_ok(self, value: str | None) -> bool:
        if value is None:
            return False
        parsed = split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        if name in self.named or name.rstrip(".") in self.named:
            return True
        if port is None:  # an HTTP/1.0-style Host without the port: only on port 80
            port = 80
        return (name, port) in self.exact

    def allowed_hosts(self) -> list[str]:
        """For the MCP SDK's own DNS-rebinding guard, in its notation."""
        out = [f"{n}:{p}" for n, p in sorted(self.exact, key=str)]
        out += sorted(self.named) + [f"{n}:*" for n in sorted(self.named)]
        return out

    def allowed_origins(self) -> list[str]:
        hosts = [h for h in self.allowed_hosts() if not h.endswith(":*")]
        out = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
        return out + [
            f"{scheme}://{n}:*" for n in sorted(self.named) for scheme in ("http", "https")
        ]

    @staticmethod
    def same_origin(origin: str, scheme: str, host: str) -> bool:
        """``Origin`` names the scheme and host this request came to (default ports
        elided on both sides), as a browser computes it."""
        o_scheme, sep, o_host = origin.strip().lower().partition("://")
        if not sep or o_scheme not in DEFAULT_PORTS or scheme not in DEFAULT_PORTS:
            return False
        a, b = split_host(o_host), split_host(host)
        if a is None or b is None:
            return False
        return o_scheme == scheme and _norm(a, o_scheme) == _norm(b, scheme)


def _norm(parsed: tuple[str, int | None], scheme: str) -> tuple[str, int]:
    name, port = parsed
    return name.rstrip("."), port if port is not None else DEFAULT_PORTS[scheme]


__all__ = [
    "INCLUDES",
    "MAX_NAME",
    "MIN_SECRET",
    "REALM",
    "VIA",
    "Caller",
    "Guard",
    "Tokens",
    "bearer",
    "name_problem",
    "split_host",
]
