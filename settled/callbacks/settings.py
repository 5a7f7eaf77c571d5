"""``[providers.NAME.callbacks]``: how a provider's signed callbacks are verified and
read (rule 16; docs/callbacks.md). Checked when settled.toml is loaded, whatever the
provider's type, with every message naming the key and the fix. The keys every table
shares are checked here; each scheme checks its own (``settled.callbacks.schemes``),
and says whether it signs a timestamp, has an event id of its own and signs the URL.
The ``secret`` (or ``secrets``, several during a rotation) is a ``${VAR}`` reference
read from the environment only when a process that receives callbacks starts
(``resolve_secrets``), never stored.

Where a value is read (``key``, ``status``, ``event_id``): a JSON pointer (``"/data/id"``)
or a field name (``"MessageSid"``: a form field, or a top-level JSON member). For a
scheme whose signature covers the URL (``twilio``), ``key`` may also be ``"?NAME"``: a
parameter of the query string the callback was sent to (a per-message status-callback
URL that carries settled's key).

What an event means (``applied``, ``not_applied``, ``delivered``) is a predicate in the
http provider's grammar (``settled.providers._predicate``, docs/providers.md
"Predicates"): a list of values read at ``status``, as before, or conditions on any of
the event's fields, ``all`` and ``any``, so that Mailgun's permanent failure can be
told from a temporary one. An event has no HTTP status, so ``http_status`` is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import ENV_REF, expand_env, has_control, number
from ..errors import ConfigError
from ..model import CALLBACK_NAMES
from ..providers._predicate import Path, Predicate, overlap
from ..providers._predicate import parse as parse_predicate
from ..providers._shape import Pointer
from .schemes import SCHEMES as REGISTRY
from .schemes import Scheme

SCHEMES = tuple(REGISTRY)
COMMON = (
    "scheme",
    "secret",
    "secrets",
    "tolerance",
    "event_id",
    "names",
    "key",
    "status",
    "applied",
    "not_applied",
    "delivered",
    "list",
    "pending_expiry",
)
# every key a table may hold: the common ones, then each scheme's own
KEYS = tuple(dict.fromkeys([*COMMON, *(k for s in REGISTRY.values() for k in s.options)]))
ONLY = {  # a scheme's own key -> the schemes that take it
    k: tuple(n for n, s in REGISTRY.items() if k in s.options) for k in KEYS if k not in COMMON
}
MEANINGS = ("applied", "not_applied", "delivered")  # in the order an event is read
DEFAULT_TOLERANCE = 300.0  # s, both directions
DEFAULT_PENDING_EXPIRY = 7 * 86400.0  # s a kept callback waits for its record
_QUERY_NAME = re.compile(r"^\?[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Field:
    """Where one value is read: a JSON pointer into the event (``pointer``), or a
    parameter of the query string (``query``, for a scheme that signs the URL)."""

    text: str
    pointer: Pointer | None = None
    query: str | None = None


@dataclass(frozen=True)
class CallbackConfig:
    """One provider's callbacks, checked. ``secrets`` are the ``${VAR}`` texts (one,
    or several while a secret is rotated); ``signing`` is the scheme with its options;
    ``applied``, ``not_applied`` and ``delivered`` are the predicates declared (at
    least one), each over one event."""

    provider: str
    scheme: str
    signing: Scheme
    secrets: tuple[str, ...]
    names: str
    key: Field
    status: Field
    applied: Predicate | None = None
    not_applied: Predicate | None = None
    delivered: Predicate | None = None
    tolerance: float = DEFAULT_TOLERANCE
    event_id: Field | None = None
    items: Pointer | None = None
    pending_expiry: float = DEFAULT_PENDING_EXPIRY
    source: str = "config"

    @property
    def where(self) -> str:
        return f"{self.source}: providers.{self.provider}.callbacks"

    @property
    def secret(self) -> str:
        """The first secret's ``${VAR}`` text ("" for a scheme that takes none)."""
        return self.secrets[0] if self.secrets else ""

    @property
    def weaker(self) -> bool:
        """Whether the scheme proves less than that the body is the one sent (the
        ``token`` scheme signs nothing; ``mailgun`` signs a token, not the body)."""
        return bool(self.signing.weaker)

    @property
    def weakness(self) -> str:
        """Why it is weaker, in words ("" when it is not)."""
        return self.signing.weaker

    def predicates(self) -> list[tuple[str, Predicate]]:
        """``(name, predicate)`` for each of ``applied``, ``not_applied`` and
        ``delivered`` declared, in that order."""
        declared = (self.applied, self.not_applied, self.delivered)
        return [(name, p) for name, p in zip(MEANINGS, declared, strict=True) if p is not None]

    def describe(self) -> str:
        """In words, for ``providers audit``."""
        read = "; ".join(f"{name} when {p.describe()}" for name, p in self.predicates())
        how = f"the {self.scheme} scheme: {self.signing.signs}{', weaker' if self.weaker else ''}"
        return f"{how}; names {self.names} at {self.key.text}; {read}"


def parse(provider: str, table: Any, *, source: str = "config") -> CallbackConfig:
    """``[providers.PROVIDER.callbacks]``, checked section by section (the scheme and
    its options, its secrets, how an event is read); a ``ConfigError`` names the file,
    the key and the fix."""
    where = f"{source}: providers.{provider}.callbacks"

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}.{key}: {problem}" if key else f"{where}: {problem}")

    if not isinstance(table, Mapping):
        return _not_a_table(where)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key; remove it or use one of {', '.join(KEYS)}")
    scheme = table.get("scheme")
    if not isinstance(scheme, str) or scheme not in REGISTRY:
        raise fail(
            "scheme",
            f"{'missing' if scheme is None else repr(scheme) + ' is not a scheme'}; use one "
            f'of {", ".join(SCHEMES)}, e.g. scheme = "standard-webhooks"',
        )
    kind = REGISTRY[scheme]
    for only, owners in ONLY.items():
        if only in table and scheme not in owners:
            named = " or ".join(f"scheme = {o!r}" for o in owners)
            raise fail(only, f"applies to {named} only; remove it")
    signing = kind.parse(table, fail)
    options: dict[str, Any] = {"signing": signing, "secrets": _secrets(fail, table, kind)}
    if "tolerance" in table:
        if not kind.timestamped:
            raise fail("tolerance", f"the {scheme} scheme signs no timestamp; remove it")
        options["tolerance"] = _seconds(f"{where}.tolerance", table["tolerance"])
    if "pending_expiry" in table:
        options["pending_expiry"] = _seconds(f"{where}.pending_expiry", table["pending_expiry"])
    options.update(_reading(fail, where, table, signing))
    return CallbackConfig(provider=provider, scheme=scheme, source=source, **options)


def _reading(fail: Any, where: str, table: Mapping[str, Any], signing: Scheme) -> dict[str, Any]:
    """How an event is read: the record field it names and where, its status and the
    predicates that say what it means, its event id, and where a batch's events are."""
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
        "key": _field(fail, "key", table["key"], query_ok=signing.signs_url),
        "status": _field(fail, "status", table["status"], query_ok=False),
    }
    if "event_id" in table:
        if signing.own_event_id:
            raise fail(
                "event_id", f"the {signing.name} event id is {signing.own_event_id}; remove it"
            )
        out["event_id"] = _field(fail, "event_id", table["event_id"], query_ok=False)
    elif signing.event_field is not None:
        out["event_id"] = _field(fail, "event_id", signing.event_field, query_ok=False)
    out.update(_meanings(fail, where, table, out["status"]))
    if "list" in table:
        raw = table["list"]
        items = Pointer.parse(raw) if isinstance(raw, str) and raw.startswith("/") else None
        if items is None:
            raise fail(
                "list", 'must be a JSON pointer to the array of events, e.g. list = "/events"'
            )
        out["items"] = items
    return out


def _meanings(
    fail: Any, where: str, table: Mapping[str, Any], status: Field
) -> dict[str, Predicate]:
    """``applied``, ``not_applied`` and ``delivered``, each a predicate in the http
    provider's grammar, a bare list read at ``status``; a value two bare lists both
    hold is refused (the one overlap seen without an event)."""
    at = Path(status.text, status.pointer)
    found = {
        name: parse_predicate(f"{where}.{name}", table[name], at, http=False)
        for name in MEANINGS
        if name in table
    }
    if not found:
        raise fail(
            "applied",
            'missing: name what proves the effect, e.g. applied = ["delivered"] (values at '
            'status) or applied = { path = "/event", is = "delivered" }',
        )
    named = list(found.items())
    for i, (name, pred) in enumerate(named):
        for other, earlier in named[:i]:
            both = overlap(earlier, pred)
            if both is not None:
                raise fail(name, f"{both} is in both {other} and {name}; keep it in one")
    return found


def _not_a_table(where: str) -> CallbackConfig:
    raise ConfigError(
        f'{where}: must be a table: [providers.NAME.callbacks] with scheme = "...", '
        'secret = "${VAR}", names, key, status and applied'
    )


def _secrets(fail: Any, table: Mapping[str, Any], kind: type[Scheme]) -> tuple[str, ...]:
    """``secret``, or ``secrets`` (several, any of which may have signed: a rotation),
    each a ``${VAR}``; none for a scheme that verifies with a public key."""
    if not kind.takes_secret:
        for key in ("secret", "secrets"):
            if key in table:
                raise fail(
                    key,
                    f"the {kind.name} scheme verifies with a public key, not a secret; "
                    f"remove it (see {', '.join(kind.options)})",
                )
        return ()
    if "secret" in table and "secrets" in table:
        raise fail("secrets", "give secret or secrets, not both")
    if "secrets" in table:
        raw = table["secrets"]
        if not isinstance(raw, list) or not raw or len(raw) > 8:
            raise fail(
                "secrets",
                'must be a list of one to eight ${VAR}s, e.g. secrets = ["${OLD}", "${NEW}"]',
            )
        return tuple(_secret(fail, f"secrets[{i}]", v) for i, v in enumerate(raw))
    return (_secret(fail, "secret", table.get("secret")),)


def _secret(fail: Any, key: str, raw: Any) -> str:
    if raw is None:
        raise fail(key, 'missing; set secret = "${HOOK_SECRET}" (read from the environment)')
    if not isinstance(raw, str) or not ENV_REF.search(raw):
        raise fail(
            key,
            'must name an environment variable, e.g. secret = "${HOOK_SECRET}": a secret is '
            "read at run time, never written in the config file",
        )
    if "${" in ENV_REF.sub("", raw):
        raise fail(key, "has a malformed ${...}; write ${NAME} with letters, digits and _")
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
                f"{' or '.join(repr(n) for n, c in REGISTRY.items() if c.signs_url)}); use a "
                "JSON pointer or a field name",
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


def resolve_secrets(cfg: CallbackConfig, env: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret, read from ``env`` now (a ``ConfigError`` naming the variable, never
    the value, when one is unset or empty)."""
    out = []
    for i, text in enumerate(cfg.secrets):
        key = f"{cfg.where}.secret" if len(cfg.secrets) == 1 else f"{cfg.where}.secrets[{i}]"
        value, _ = expand_env(key, text, env)
        if not value:
            raise ConfigError(f"{key}: is empty; set the variable it names")
        out.append(value)
    return tuple(out)


def resolve_secret(cfg: CallbackConfig, env: Mapping[str, str]) -> str:
    """The first secret, read from ``env`` now (see ``resolve_secrets``)."""
    return resolve_secrets(cfg, env)[0]


__all__ = ["SCHEMES", "CallbackConfig", "Field", "parse", "resolve_secret", "resolve_secrets"]
