"""``[providers.NAME.callbacks]``: how a provider's signed callbacks are verified and
read (rule 16; docs/callbacks.md). Checked when settled.toml is loaded, whatever the
provider's type, with every message naming the key and the fix; the ``secret`` is a
``${VAR}`` reference read from the environment only when a process that receives
callbacks starts (``resolve_secret``), never stored.

Where a value is read (``key``, ``status``, ``event_id``): a JSON pointer (``"/data/id"``)
or a field name (``"MessageSid"``: a form field, or a top-level JSON member). For the
``twilio`` scheme, whose signature covers the URL, ``key`` may also be ``"?NAME"``: a
parameter of the query string the callback was sent to (a per-message status-callback
URL that carries settled's key).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import ENV_REF, expand_env, has_control, number
from ..errors import ConfigError
from ..model import CALLBACK_NAMES
from ..providers._shape import Pointer

SCHEMES = ("standard-webhooks", "stripe", "github", "twilio", "hmac-sha256", "token")
# Schemes that sign a timestamp (checked against ``tolerance``), and those with an event
# id of their own (``event_id`` is theirs, never configured).
TIMESTAMPED = frozenset({"standard-webhooks", "stripe"})
OWN_EVENT_ID = {
    "standard-webhooks": "the webhook-id header",
    "stripe": "the event's id",
    "github": "the X-GitHub-Delivery header",
    "twilio": "the message id and status together",
}
KEYS = (
    "scheme",
    "secret",
    "tolerance",
    "event_id",
    "names",
    "key",
    "status",
    "applied",
    "not_applied",
    "delivered",
    "list",
    "url",
    "header",
    "encoding",
    "prefix",
    "username",
    "pending_expiry",
)
ONLY = {  # keys that belong to one scheme
    "url": "twilio",
    "header": "hmac-sha256",
    "encoding": "hmac-sha256",
    "prefix": "hmac-sha256",
    "username": "token",
}
DEFAULT_TOLERANCE = 300.0  # s, both directions
DEFAULT_PENDING_EXPIRY = 7 * 86400.0  # s a kept callback waits for its record
_HEADER = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_QUERY_NAME = re.compile(r"^\?[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Field:
    """Where one value is read: a JSON pointer into the event (``pointer``), or a
    parameter of the query string (``query``, twilio only)."""

    text: str
    pointer: Pointer | None = None
    query: str | None = None


@dataclass(frozen=True)
class CallbackConfig:
    """One provider's callbacks, checked. ``secret`` is the ``${VAR}`` text."""

    provider: str
    scheme: str
    secret: str
    names: str
    key: Field
    status: Field
    applied: tuple[Any, ...] = ()
    not_applied: tuple[Any, ...] = ()
    delivered: tuple[Any, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE
    event_id: Field | None = None
    items: Pointer | None = None
    url: str | None = None
    header: str | None = None
    encoding: str = "hex"
    prefix: str = ""
    username: str | None = None
    pending_expiry: float = DEFAULT_PENDING_EXPIRY
    source: str = "config"

    @property
    def where(self) -> str:
        return f"{self.source}: providers.{self.provider}.callbacks"

    @property
    def weaker(self) -> bool:
        """The ``token`` scheme signs nothing: a shared secret proves the sender knows
        it, not that the body is the one it sent."""
        return self.scheme == "token"

    def describe(self) -> str:
        """In words, for ``providers audit``."""
        lists = ", ".join(
            f"{name} {list(values)}"
            for name, values in (
                ("applied", self.applied),
                ("not_applied", self.not_applied),
                ("delivered", self.delivered),
            )
            if values
        )
        how = (
            "a shared token (signs nothing: weaker)" if self.weaker else f"{self.scheme} signature"
        )
        return f"{how}; names {self.names} at {self.key.text}; {self.status.text} in {lists}"


def parse(provider: str, table: Any, *, source: str = "config") -> CallbackConfig:
    """``[providers.PROVIDER.callbacks]``, checked section by section (the scheme and
    its secret, how an event is read, the scheme's own options); a ``ConfigError``
    names the file, the key and the fix."""
    where = f"{source}: providers.{provider}.callbacks"

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}.{key}: {problem}" if key else f"{where}: {problem}")

    if not isinstance(table, Mapping):
        return _not_a_table(where)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key; remove it or use one of {', '.join(KEYS)}")
    scheme = table.get("scheme")
    if scheme not in SCHEMES:
        raise fail(
            "scheme",
            f"{'missing' if scheme is None else repr(scheme) + ' is not a scheme'}; use one "
            f'of {", ".join(SCHEMES)}, e.g. scheme = "standard-webhooks"',
        )
    for only, owner in ONLY.items():
        if only in table and scheme != owner:
            raise fail(only, f"applies to scheme = {owner!r} only; remove it")
    options: dict[str, Any] = {"secret": _secret(fail, table.get("secret"))}
    if "tolerance" in table:
        if scheme not in TIMESTAMPED:
            raise fail("tolerance", f"the {scheme} scheme signs no timestamp; remove it")
        options["tolerance"] = _seconds(f"{where}.tolerance", table["tolerance"])
    if "pending_expiry" in table:
        options["pending_expiry"] = _seconds(f"{where}.pending_expiry", table["pending_expiry"])
    options.update(_reading(fail, table, scheme))
    options.update(_scheme_options(fail, table, scheme))
    return CallbackConfig(provider=provider, scheme=scheme, source=source, **options)


def _reading(fail: Any, table: Mapping[str, Any], scheme: str) -> dict[str, Any]:
    """How an event is read: the record field it names and where, its status and the
    values that mean something, its event id, and where a batch's events are."""
    names = table.get("names")
    if names not in CALLBACK_NAMES:
        raise fail(
            "names",
            f"{'missing' if names is None else repr(names) + ' is not a record field'}; the "
            f"field the callback names its action by: one of {', '.join(CALLBACK_NAMES)}",
        )
    if "key" not in table:
        raise fail("key", 'missing; where the callback names the action, e.g. key = "/data/id"')
    if "status" not in table:
        raise fail(
            "status", 'missing; where the callback says what happened, e.g. status = "/status"'
        )
    out: dict[str, Any] = {
        "names": names,
        "key": _field(fail, "key", table["key"], query_ok=scheme == "twilio"),
        "status": _field(fail, "status", table["status"], query_ok=False),
    }
    if "event_id" in table:
        if scheme in OWN_EVENT_ID:
            raise fail("event_id", f"the {scheme} event id is {OWN_EVENT_ID[scheme]}; remove it")
        out["event_id"] = _field(fail, "event_id", table["event_id"], query_ok=False)
    lists = {
        k: _values(fail, k, table[k]) for k in ("applied", "not_applied", "delivered") if k in table
    }
    if not lists:
        raise fail(
            "applied",
            'missing: name the values that prove the effect, e.g. applied = ["delivered"]',
        )
    seen: dict[str, str] = {}
    for name, values in lists.items():
        for v in values:
            other = seen.setdefault(repr(v), name)
            if other != name:
                raise fail(name, f"{v!r} is in both {other} and {name}; keep it in one")
    out.update(lists)
    if "list" in table:
        raw = table["list"]
        items = Pointer.parse(raw) if isinstance(raw, str) and raw.startswith("/") else None
        if items is None:
            raise fail(
                "list", 'must be a JSON pointer to the array of events, e.g. list = "/events"'
            )
        out["items"] = items
    return out


def _scheme_options(fail: Any, table: Mapping[str, Any], scheme: str) -> dict[str, Any]:
    """The keys one scheme takes: twilio's public ``url``; hmac-sha256's ``header``,
    ``encoding`` and ``prefix``; the token scheme's optional ``username``."""
    out: dict[str, Any] = {}
    if scheme == "twilio":
        out["url"] = _url(fail, table.get("url"))
    if scheme == "hmac-sha256":
        header = table.get("header")
        if not isinstance(header, str) or not _HEADER.match(header):
            raise fail("header", 'missing or not a header name; e.g. header = "X-Signature"')
        encoding = table.get("encoding", "hex")
        if encoding not in ("hex", "base64"):
            raise fail("encoding", f'{encoding!r}: use "hex" or "base64"')
        prefix = table.get("prefix", "")
        if not isinstance(prefix, str) or has_control(prefix):
            raise fail("prefix", 'must be a one-line string, e.g. prefix = "sha256="')
        out.update(header=header, encoding=encoding, prefix=prefix)
    username = table.get("username")
    if username is not None:
        if not isinstance(username, str) or not username or ":" in username:
            raise fail("username", "must be a non-empty string without ':' (HTTP Basic)")
        out["username"] = username
    return out


def _not_a_table(where: str) -> CallbackConfig:
    raise ConfigError(
        f'{where}: must be a table: [providers.NAME.callbacks] with scheme = "...", '
        'secret = "${VAR}", names, key, status and applied'
    )


def _secret(fail: Any, raw: Any) -> str:
    if raw is None:
        raise fail("secret", 'missing; set secret = "${HOOK_SECRET}" (read from the environment)')
    if not isinstance(raw, str) or not ENV_REF.search(raw):
        raise fail(
            "secret",
            'must name an environment variable, e.g. secret = "${HOOK_SECRET}": a secret is '
            "read at run time, never written in the config file",
        )
    if "${" in ENV_REF.sub("", raw):
        raise fail("secret", "has a malformed ${...}; write ${NAME} with letters, digits and _")
    return raw


def _seconds(key: str, value: Any) -> float:
    return number(key, value, positive=True)


def _field(fail: Any, key: str, raw: Any, *, query_ok: bool) -> Field:
    if not isinstance(raw, str) or not raw or has_control(raw):
        raise fail(key, 'must be a JSON pointer ("/data/id") or a field name ("MessageSid")')
    if raw.startswith("?"):
        if not query_ok:
            raise fail(
                key,
                "a query-string parameter is read only where the URL is signed (scheme = "
                '"twilio"); use a JSON pointer or a field name',
            )
        if not _QUERY_NAME.match(raw):
            raise fail(key, f"{raw!r}: write ?NAME with letters, digits, _, . and -")
        return Field(raw, query=raw[1:])
    if raw.startswith("/"):
        ptr = Pointer.parse(raw)
        if ptr is None or not ptr.tokens:
            raise fail(key, f"{raw!r} is not a JSON pointer (RFC 6901: /field, ~0 for ~, ~1 for /)")
        return Field(raw, pointer=ptr)
    return Field(raw, pointer=Pointer("/" + raw.replace("~", "~0").replace("/", "~1"), (raw,)))


def _values(fail: Any, key: str, value: Any) -> tuple[Any, ...]:
    ok = isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value)
    if not ok or not value:
        raise fail(key, f'must be a non-empty list of values, e.g. {key} = ["delivered"]')
    return tuple(value)


def _url(fail: Any, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.startswith(("https://", "http://")) or has_control(raw):
        raise fail(
            "url",
            "missing: Twilio signs the URL it calls, so give the hook's public URL as Twilio "
            'has it, e.g. url = "https://hooks.example.com/hooks/sms" (no query string)',
        )
    if "?" in raw or "#" in raw:
        raise fail("url", "must not hold a query string: the one each callback comes with is added")
    return raw


def resolve_secret(cfg: CallbackConfig, env: Mapping[str, str]) -> str:
    """The secret, read from ``env`` now (a ``ConfigError`` naming the variable, never
    the value, when it is unset or empty)."""
    value, _ = expand_env(f"{cfg.where}.secret", cfg.secret, env)
    if not value:
        raise ConfigError(f"{cfg.where}.secret: is empty; set the variable it names")
    return value


__all__ = ["SCHEMES", "CallbackConfig", "Field", "parse", "resolve_secret"]
