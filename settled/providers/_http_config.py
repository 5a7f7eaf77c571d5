"""Reading an ``http`` provider's section of settled.toml: every key checked, with a
one-line ``ConfigError`` that names the key and the fix (docs/providers.md lists
them all). ``settled.providers.http`` builds requests and reads replies from what this
module returns; nothing here touches the network.

The checks that make a configuration honest live here, at load, so that
``settled providers check`` and every command refuse the same things:

- **Proof names the action** (rule 19): a ``full`` operation proves its effect by a
  declared predicate over its reply or by the presence of its object id, and a query
  reads this action's resource (its key or object id in the path) or picks its item
  by a match on what settled sent (the key, the object id, the action id or the
  idempotency key). A match on params alone (a recipient, an amount) is refused.
- **Only a final answer proves absence** (rule 20): ``not_found = "not_applied"``
  needs the shape of the provider's own not-found reply (``not_found_when``);
  errors that may come after the effect (``maybe_applied``) are never a rejection.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..checks import ENV_REF, expand_env, expand_url, has_control, number
from ..errors import ConfigError
from ..model import DEFAULT_CONSISTENCY_WINDOW, Tier
from . import _shape
from ._predicate import Condition, Path, Predicate, Source, overlap
from ._predicate import parse as parse_predicate
from ._shape import FORM_LISTS, Pointer, Text
from .base import OperationSpec

PROVIDER_KEYS = ("base_url", "timeout", "headers", "auth", "operations")
OPERATION_KEYS = (
    "tier",
    "title",
    "description",
    "destructive",
    "needs_confirmation",
    "params_schema",
    "consistency_window",
    "attempts",
    "backoff",
    "timeout",
    "idempotency_header",
    "idempotency_field",
    "request",
    "reconciliation_key_field",
    "reconciliation_key_param",
    "key_format",
    "object_id",
    "conflict_statuses",
    "query",
    "status",
    "applied",
    "not_applied",
    "maybe_applied",
    "not_found",
    "not_found_when",
    "verify",
)
REQUEST_KEYS = ("method", "path", "query", "headers", "body", "encoding", "form_lists")
QUERY_KEYS = (
    "method",
    "path",
    "query",
    "headers",
    "list",
    "match",
    "where",
    "object_id",
    "base_url",
    "auth",
    "status",
    "applied",
    "not_applied",
    "pages",
)
REQUEST_METHODS = ("POST", "PUT", "PATCH", "DELETE")
ENCODINGS = ("json", "form", "none")
DEFAULT_TIMEOUT = 5.0
DEFAULT_ATTEMPTS = 3
DEFAULT_VERIFY = {"interval": 2.0, "deadline": 300.0, "min_checks": 3.0}
DEFAULT_PAGES = 5
MAX_PAGES = 100
# Placeholders a request may use (the key only where the tier has one).
REQUEST_FIELDS = {"params", "idempotency_key", "action_id", "attempt"}
# What a query's match may name to tie an item to this action (rule 19).
TIES = ("reconciliation_key", "provider_object_id", "action_id", "idempotency_key")
# A "not found" that proves nothing more than "not visible yet": the default shape.
PLAIN_404 = Condition(http_status=(404,))
# Alphabets a key_format may require; a generated key is 32 lowercase hex characters,
# which each of them holds.
ALPHABETS = {
    "base32hex": "0123456789abcdefghijklmnopqrstuv",  # lowercase, as Google Calendar takes it
    "hex": "0123456789abcdef",
    "alnum": "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "url": "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-._~",
}
GENERATED_KEY_LENGTH = 32

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name
_ENV_SENTINEL = "\x00{}\x00"


@dataclass(frozen=True)
class Call:
    """One request template: the operation's send, or its query. ``base`` and
    ``fixed`` are a query's own base URL and headers (its own auth included) when it
    goes to another host; None: the provider's."""

    method: str
    path: Text
    query: Mapping[str, Any] = field(default_factory=dict)  # name -> template
    headers: Mapping[str, Any] = field(default_factory=dict)  # name -> Text
    body: Any = None  # a template; None = the params as they are
    encoding: str = "json"
    form_lists: str = "indexed"
    base: str | None = None
    fixed: Mapping[str, str] | None = None

    def refs(self, *, body: bool = True) -> set[str]:
        refs = [
            *self.path.refs,
            *_shape.refs_of(dict(self.query)),
            *_shape.refs_of(dict(self.headers)),
        ]
        if body and self.body is not None:
            refs += _shape.refs_of(self.body)
        return {r.name for r in refs}

    def uses(self, name: str) -> bool:
        return name in self.refs()


@dataclass(frozen=True)
class Pages:
    """How a list query reads its next page: a ``Link`` header's relation, a next
    page's URL read from the reply (``@odata.nextLink``), or a cursor read from the
    reply and sent back as a query parameter; at most ``max`` pages. A page without
    items is the last."""

    link: str | None = None
    url: Path | None = None
    cursor: Path | None = None
    param: str | None = None
    max: int = DEFAULT_PAGES


@dataclass(frozen=True)
class Query:
    call: Call
    items: Path | None  # where the list of candidates is (``list``)
    match: tuple[tuple[Path, Text], ...]  # each item field and the value it must equal
    status: Path | None  # where the status is read in the item (the query's or the operation's)
    applied: Predicate | None
    not_applied: Predicate | None
    pages: Pages | None = None
    where: Predicate | None = None  # which items of a list count at all (terminal events)
    object_id: Source | None = None  # where the item holds the object id (the operation's path)

    @property
    def predicate(self) -> bool:
        return self.status is not None or self.applied is not None or bool(self.match)


@dataclass(frozen=True)
class KeyFormat:
    """What a reconciliation key must look like on the wire (a client-chosen resource
    id): an alphabet and a length range."""

    alphabet: str | None
    min_length: int
    max_length: int

    def problem(self, key: str) -> str:
        """Why ``key`` does not fit ("" when it does)."""
        if not self.min_length <= len(key) <= self.max_length:
            return f"must be {self.min_length}-{self.max_length} characters long, not {len(key)}"
        if self.alphabet is not None:
            bad = sorted({ch for ch in key if ch not in ALPHABETS[self.alphabet]})
            if bad:
                return f"may hold only {self.alphabet} characters, not {''.join(bad)!r}"
        return ""

    def describe(self) -> str:
        what = f"{self.alphabet}, " if self.alphabet else ""
        return f"{what}{self.min_length}-{self.max_length} characters"


@dataclass(frozen=True)
class Operation:
    spec: OperationSpec
    request: Call
    key_field: Pointer | None
    key_param: str | None
    idempotency_header: str | None
    idempotency_field: Pointer | None
    object_id: Source | None
    query: Query | None
    status: Path | None  # the reply's status, where declared
    applied: Predicate | None  # over the send's 2xx reply
    not_applied: Predicate | None
    maybe_applied: Predicate | None  # over any reply to the send: may come after the effect
    not_found_absent: bool
    not_found_when: Predicate  # the provider's own "not found" reply to the query
    conflict: tuple[int, ...]
    key_format: KeyFormat | None


class Checker:
    """Validates one provider section; every message names the key and the fix."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.secrets: list[str] = []

    @staticmethod
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{key}: {problem}")

    def table(self, key: str, value: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(
                key, "must be a table, e.g. " + _EXAMPLES.get(key.rsplit(".", 1)[-1], "{ ... }")
            )
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise self.fail(
                f"{key}.{unknown[0]}" if key else unknown[0],
                f"unknown key; remove it or use one of {', '.join(allowed)}",
            )
        return value

    def text(self, key: str, value: Any, example: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(
                key, f"must be a non-empty string, e.g. {key.rsplit('.', 1)[-1]} = {example}"
            )
        return value

    def pointer(self, key: str, value: Any) -> Pointer:
        ptr = Pointer.parse(value) if isinstance(value, str) else None
        if ptr is None:
            raise self.fail(
                key,
                f'{value!r} is not a JSON pointer; write it as "/field" or "/outer/inner" '
                "(RFC 6901: starts with /, ~0 for ~ and ~1 for /)",
            )
        return ptr

    def expand(self, key: str, raw: Any, *, header: bool = True) -> str:
        """``${VAR}`` → the environment's value, remembered as a secret. A value that
        goes into a header as it is must be one a header can carry byte for byte
        (``header``): Latin-1 characters, no space at either end of the header."""
        value, secrets = expand_env(key, raw, self.env)
        self.secrets += secrets
        if header:
            self.latin1(key, raw)
        return value

    def latin1(self, key: str, raw: str) -> None:
        """Refuse, naming the variable (never its value), text a header cannot carry:
        a header is Latin-1 bytes, sent as they are, never re-encoded."""
        for m in ENV_REF.finditer(raw):
            if not _latin1(self.env.get(m.group(1), "")):
                raise self.fail(
                    key,
                    f"environment variable {m.group(1)} holds characters outside Latin-1, "
                    "which an HTTP header cannot carry as they are; set it to the exact "
                    "text the API expects on the wire (settled sends it unchanged)",
                )
        if not _latin1(ENV_REF.sub("", raw)):
            raise self.fail(
                key, "holds characters outside Latin-1, which an HTTP header cannot carry"
            )

    def edges(self, key: str, raw: str, value: str, *, first: bool, last: bool) -> None:
        """A header value that starts or ends with a space would arrive without it
        (HTTP strips it): refused, naming the variable that brings the space."""
        lead = first and value[:1].isspace()
        trail = last and value[-1:].isspace()
        if not (lead or trail):
            return
        edge = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", raw) if lead else None
        if trail:
            edge = re.search(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}$", raw) or edge
        where = f"environment variable {edge.group(1)}" if edge else "the configured text"
        raise self.fail(
            key,
            f"{where} puts a space at the {'start' if lead else 'end'} of the header value, "
            "which HTTP strips in transit; remove it",
        )

    def headers(self, key: str, value: Any) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise self.fail(
                key, 'must be a table, e.g. headers = { Authorization = "Bearer ${TOKEN}" }'
            )
        out: dict[str, str] = {}
        for name, raw in value.items():
            where = f"{key}.{name}"
            if not _TOKEN.match(name):
                raise self.fail(where, "is not a valid HTTP header name")
            out[name] = self.expand(where, raw)
            self.edges(where, raw, out[name], first=True, last=True)
        return out

    def auth(self, key: str, value: Any) -> dict[str, str]:
        conf = self.table(key, value, ("type", "token", "username", "password"))
        kind = conf.get("type")
        if kind == "bearer":
            if set(conf) - {"type", "token"} or "token" not in conf:
                raise self.fail(
                    key,
                    'a bearer auth takes only a token: { type = "bearer", token = "${API_TOKEN}" }',
                )
            token = self.expand(f"{key}.token", conf["token"])
            if not token:
                raise self.fail(f"{key}.token", "is empty; set the variable it names")
            self.edges(f"{key}.token", conf["token"], token, first=False, last=True)
            return {"Authorization": f"Bearer {token}"}
        if kind == "basic":
            if "token" in conf or "username" not in conf:
                raise self.fail(
                    key,
                    'a basic auth takes username and password: { type = "basic", username = "${API_USER}", '
                    'password = "${API_PASSWORD}" }',
                )
            # Basic credentials travel as the base64 of their UTF-8 bytes: any text goes.
            user = self.expand(f"{key}.username", conf["username"], header=False)
            password = self.expand(f"{key}.password", conf.get("password", ""), header=False)
            if ":" in user:
                raise self.fail(f"{key}.username", "must not contain ':' (HTTP Basic)")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.secrets.append(token)
            return {"Authorization": f"Basic {token}"}
        raise self.fail(f"{key}.type", f'{kind!r} is not an auth type; use "bearer" or "basic"')

    def values(self, key: str, value: Any) -> tuple[Any, ...]:
        ok = isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value)
        if not ok or not value:
            raise self.fail(
                key,
                f'must be a non-empty list of values, e.g. {key.rsplit(".", 1)[-1]} = ["delivered"]',
            )
        return tuple(value)

    def call(
        self,
        key: str,
        value: Any,
        methods: tuple[str, ...],
        allowed: set[str],
        keys: tuple[str, ...],
    ) -> tuple[Call, Mapping[str, Any]]:
        conf = self.table(key, value, keys)
        method = conf.get("method", methods[0])
        if not isinstance(method, str) or method.upper() not in methods:
            fix = (
                'use method = "GET" (a query must not change anything)'
                if methods == ("GET",)
                else f"use one of {', '.join(methods)}"
            )
            raise self.fail(f"{key}.method", f"{method!r} is not allowed; {fix}")
        if "path" not in conf:
            raise self.fail(f"{key}.path", 'missing; add path = "/things" (appended to base_url)')
        path = conf["path"]
        if isinstance(path, str) and "${" in path:
            raise self.fail(
                f"{key}.path",
                "a ${VAR} is read from the environment in base_url and in header values, "
                "not in a path; put the part that comes from the environment in base_url, "
                'e.g. base_url = "https://api.example.com/Accounts/${ACCOUNT_ID}"',
            )
        if not isinstance(path, str) or not path.startswith("/"):
            raise self.fail(f"{key}.path", f'{path!r} must start with "/", e.g. path = "/things"')
        if "?" in path or "#" in path:
            raise self.fail(
                f"{key}.path",
                'must not hold a query string; write query = { name = "value" } beside path',
            )
        path_t = _shape.parse_text(f"{key}.path", path, allowed, optional=False)
        query: dict[str, Any] = {}
        if "query" in conf:
            if not isinstance(conf["query"], Mapping):
                raise self.fail(
                    f"{key}.query", 'must be a table, e.g. query = { ref = "{reconciliation_key}" }'
                )
            for name, tmpl in conf["query"].items():
                if not isinstance(tmpl, (str, int, float, bool, list)):
                    raise self.fail(
                        f"{key}.query.{name}", "must be a string, a number or a list of them"
                    )
                query[name] = _shape.compile_template(f"{key}.query.{name}", tmpl, allowed)
        headers: dict[str, Any] = {}
        if "headers" in conf:
            if not isinstance(conf["headers"], Mapping):
                raise self.fail(
                    f"{key}.headers",
                    'must be a table, e.g. headers = { "Stripe-Version" = "2024-06-20" }',
                )
            for name, raw in conf["headers"].items():
                where = f"{key}.headers.{name}"
                if not _TOKEN.match(name):
                    raise self.fail(where, "is not a valid HTTP header name")
                headers[name] = self.header_template(where, raw, allowed)
        encoding = conf.get("encoding", "json")
        if encoding not in ENCODINGS:
            raise self.fail(
                f"{key}.encoding", f'{encoding!r} is not an encoding; use "json", "form" or "none"'
            )
        lists = conf.get("form_lists", "indexed")
        if lists not in FORM_LISTS:
            raise self.fail(f"{key}.form_lists", f"{lists!r}: use one of {', '.join(FORM_LISTS)}")
        if "form_lists" in conf and encoding != "form":
            raise self.fail(f"{key}.form_lists", 'applies to encoding = "form" only; remove it')
        body = None
        if "body" in conf:
            if encoding == "none":
                raise self.fail(
                    f"{key}.body", 'encoding = "none" sends no body; remove body or the encoding'
                )
            body = self.body_template(f"{key}.body", conf["body"], allowed)
            if (
                encoding == "form"
                and not isinstance(body, Mapping)
                and not (isinstance(body, Text) and body.whole is not None)
            ):
                raise self.fail(f"{key}.body", "a form body must be a table of name = value pairs")
        return Call(method.upper(), path_t, query, headers, body, encoding, lists), conf

    def header_template(self, key: str, raw: Any, allowed: set[str]) -> Text:
        """A header value: placeholders, and ``${VAR}`` from the environment."""
        if not isinstance(raw, str):
            raise self.fail(key, 'must be a string, e.g. "2024-06-20" or "${TOKEN}"')
        refs: list[str] = []

        def hide(m: re.Match[str]) -> str:
            refs.append(m.group(0))
            return _ENV_SENTINEL.format(len(refs) - 1)

        hidden = re.sub(r"\$\{[^}]*\}", hide, raw)
        text = _shape.parse_text(key, hidden, allowed, optional=False)
        parts: list[Any] = []
        for i, part in enumerate(text.parts):
            if isinstance(part, str):
                restored = re.sub(r"\x00(\d+)\x00", lambda m: refs[int(m.group(1))], part)
                value = self.expand(key, restored)
                self.edges(key, restored, value, first=i == 0, last=i == len(text.parts) - 1)
                parts.append(value)
            else:
                parts.append(part)
        return Text(tuple(parts))

    def body_template(self, key: str, raw: Any, allowed: set[str]) -> Any:
        """A body template whose strings may hold ``${VAR}``: read from the environment
        now and sent as they are (a routing key); remembered as secrets, so every reply,
        reason and ``render`` masks them. The config keeps the reference; the ledger
        keeps only the params."""
        if isinstance(raw, str) and "${" in raw:
            refs: list[str] = []

            def hide(m: re.Match[str]) -> str:
                refs.append(m.group(0))
                return _ENV_SENTINEL.format(len(refs) - 1)

            hidden = re.sub(r"\$\{[^}]*\}", hide, raw)
            text = _shape.parse_text(key, hidden, allowed)
            parts: list[Any] = []
            for part in text.parts:
                if isinstance(part, str):
                    restored = re.sub(r"\x00(\d+)\x00", lambda m: refs[int(m.group(1))], part)
                    parts.append(self.expand(key, restored, header=False))
                else:
                    parts.append(part)
            return Text(tuple(parts))
        if isinstance(raw, Mapping):
            return {str(k): self.body_template(f"{key}.{k}", v, allowed) for k, v in raw.items()}
        if isinstance(raw, list):
            return [self.body_template(f"{key}[{i}]", v, allowed) for i, v in enumerate(raw)]
        return _shape.compile_template(key, raw, allowed)


_EXAMPLES = {
    "request": '{ method = "POST", path = "/messages" }',
    "query": '{ method = "GET", path = "/messages/{reconciliation_key}" }',
    "verify": "{ interval = 2, deadline = 300, min_checks = 3 }",
    "auth": '{ type = "bearer", token = "${API_TOKEN}" }',
    "operations": "[providers.NAME.operations.OP]",
    "": "{ ... }",
}


def _tier(c: Checker, key: str, conf: Mapping[str, Any]) -> Tier:
    if "tier" not in conf:
        raise c.fail(
            f"{key}.tier", 'missing; add tier = "full", "reconcilable", "partial" or "blind"'
        )
    try:
        return Tier(conf["tier"])
    except ValueError:
        raise c.fail(
            f"{key}.tier",
            f"{conf['tier']!r} is not a tier; use one of full, reconcilable, partial, blind",
        ) from None


@dataclass(frozen=True, slots=True)
class _Budget:
    """How long and how often: the one retry budget, the per-try deadline, the pause
    between tries, and when verification gives up."""

    window: float
    attempts: int
    timeout: float
    backoff: float | None
    verify_interval: float
    verify_deadline: float
    verify_min_checks: int


def _budget(c: Checker, key: str, conf: Mapping[str, Any], default_timeout: float) -> _Budget:
    window = number(
        f"{key}.consistency_window", conf.get("consistency_window", DEFAULT_CONSISTENCY_WINDOW)
    )
    attempts = conf.get("attempts", DEFAULT_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise c.fail(
            f"{key}.attempts",
            f"must be a whole number >= 1 (the one retry budget), got {attempts!r}",
        )
    timeout = number(f"{key}.timeout", conf.get("timeout", default_timeout), positive=True)
    backoff = number(f"{key}.backoff", conf["backoff"]) if "backoff" in conf else None
    verify = dict(DEFAULT_VERIFY)
    if "verify" in conf:
        vconf = c.table(f"{key}.verify", conf["verify"], ("interval", "deadline", "min_checks"))
        for vk in ("interval", "deadline"):
            if vk in vconf:
                verify[vk] = number(f"{key}.verify.{vk}", vconf[vk], positive=True)
        if "min_checks" in vconf:
            verify["min_checks"] = number(
                f"{key}.verify.min_checks", vconf["min_checks"], whole=True
            )
    return _Budget(
        window,
        attempts,
        timeout,
        backoff,
        verify["interval"],
        verify["deadline"],
        int(verify["min_checks"]),
    )


def _presentation(c: Checker, key: str, conf: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The words and flags an agent or an operator sees; returns the params schema."""
    for k in ("title", "description"):
        if k in conf and (not isinstance(conf[k], str) or has_control(conf[k])):
            raise c.fail(f"{key}.{k}", "must be a one-line string")
    for k in ("destructive", "needs_confirmation"):
        if k in conf and not isinstance(conf[k], bool):
            raise c.fail(f"{key}.{k}", "must be true or false")
    schema = conf.get("params_schema")
    if schema is not None and (not isinstance(schema, Mapping) or schema.get("type") != "object"):
        raise c.fail(
            f"{key}.params_schema",
            'must be a JSON schema for an object, e.g. params_schema = { type = "object", '
            'required = ["to"], properties = { to = { type = "string" } } }',
        )
    return schema


def _key_param(c: Checker, key: str, conf: Mapping[str, Any], tier: Tier) -> str | None:
    key_param = conf.get("reconciliation_key_param")
    if key_param is None:
        return None
    if not isinstance(key_param, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", key_param):
        raise c.fail(
            f"{key}.reconciliation_key_param",
            'must name one top-level param, e.g. reconciliation_key_param = "order_number"',
        )
    if tier is Tier.BLIND:
        raise c.fail(
            f"{key}.reconciliation_key_param",
            "a blind operation gets no reconciliation key; remove it",
        )
    return key_param


def _body_field(
    c: Checker, key: str, conf: Mapping[str, Any], name: str, tier: Tier | None, request: Call
) -> Pointer | None:
    """Where in the body a key is written (``reconciliation_key_field``,
    ``idempotency_field``): a field name, a JSON pointer or a form path. ``tier`` None:
    any tier may carry it."""
    if name not in conf:
        return None
    raw = c.text(f"{key}.{name}", conf[name], '"client_reference"')
    if tier is Tier.BLIND:
        raise c.fail(f"{key}.{name}", "a blind operation gets no reconciliation key; remove it")
    if request.encoding == "none":
        raise c.fail(
            f"{key}.{name}",
            'the request has no body (encoding = "none"); put the key in its path, query or a header',
        )
    where = Pointer.parse(raw) if raw.startswith("/") else Pointer.from_form_path(raw)
    if where is None or not where.tokens:
        raise c.fail(
            f"{key}.{name}",
            f'{raw!r}: write a field name ("client_reference"), a JSON pointer ("/row/id") '
            'or a form path ("metadata[ref]")',
        )
    return where


def _conflict_statuses(c: Checker, key: str, conf: Mapping[str, Any]) -> tuple[int, ...]:
    if "conflict_statuses" not in conf:
        return ()
    raw = conf["conflict_statuses"]
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(v, int) and not isinstance(v, bool) and 400 <= v <= 599 for v in raw)
    ):
        raise c.fail(
            f"{key}.conflict_statuses",
            "must be a list of HTTP statuses 400-599, e.g. conflict_statuses = [409]",
        )
    return tuple(raw)


def _params_schema(call: Call) -> Mapping[str, Any] | None:
    """The params a request template needs, as a JSON schema; None when the params go
    as the body unchanged (anything goes)."""
    refs = [*call.path.refs, *_shape.refs_of(dict(call.query)), *_shape.refs_of(dict(call.headers))]
    if call.body is None:
        return None
    refs += _shape.refs_of(call.body)
    if any(r.name == "params" for r in refs):
        return None
    props = sorted({r.path()[0] for r in refs if r.name.startswith("params.")})
    required = sorted(
        {r.path()[0] for r in refs if r.name.startswith("params.") and not r.optional}
    )
    return {"type": "object", "properties": {p: {} for p in props}, "required": required}


def base_url(base: Any, shown: Any = None, key: str = "base_url") -> str:
    """``base`` (its ``${VAR}``s already read) checked as httpx will parse it; messages
    quote ``shown``, the configured text, never a value read from the environment."""
    fix = 'e.g. base_url = "https://api.example.com/v1"'
    shown = base if shown is None else shown
    if not isinstance(base, str) or not base.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: {shown!r} must be an http:// or https:// URL, {fix}")
    try:
        url = httpx.URL(base)
        httpx.URL(base.rstrip("/") + "/x")
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        why = f" ({exc})" if shown == base else ""
        raise ConfigError(f"{key}: {shown!r} is not a valid URL{why}; {fix}") from None
    if url.userinfo:
        raise ConfigError(
            f"{key}: must not carry credentials; send them with auth or in headers, e.g. "
            'headers = { Authorization = "Bearer ${TOKEN}" }'
        )
    if not url.host:
        raise ConfigError(f"{key}: {shown!r} names no host; {fix}")
    if url.query or url.fragment or "?" in base or "#" in base:
        raise ConfigError(
            f"{key}: must not hold a query string or fragment; put query parameters in "
            'request.query, e.g. query = { api_version = "2" }'
        )
    return base.rstrip("/")


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def operation(c: Checker, name: str, conf: Any, default_timeout: float) -> Operation:
    """One operation's table, checked section by section: what it is (tier, budget, the
    words an agent sees), how its request is shaped and where the keys go, how its
    replies and its query are read. Each section refuses with the key and an example."""
    key = f"operations.{name}"
    conf = c.table(key, conf, OPERATION_KEYS)
    tier = _tier(c, key, conf)
    budget = _budget(c, key, conf, default_timeout)
    idem = conf.get("idempotency_header")
    if idem is not None and (not isinstance(idem, str) or not _TOKEN.match(idem)):
        raise c.fail(
            f"{key}.idempotency_header",
            'must be a header name, e.g. "Idempotency-Key"; omit it when the provider does not deduplicate',
        )
    schema = _presentation(c, key, conf)

    key_param = _key_param(c, key, conf, tier)
    allowed = REQUEST_FIELDS | ({"reconciliation_key"} if tier is not Tier.BLIND else set())
    if "request" not in conf:
        raise c.fail(
            f"{key}.request", 'missing; add request = { method = "POST", path = "/things" }'
        )
    request, _ = c.call(f"{key}.request", conf["request"], REQUEST_METHODS, allowed, REQUEST_KEYS)
    key_field = _body_field(c, key, conf, "reconciliation_key_field", tier, request)
    idem_field = _body_field(c, key, conf, "idempotency_field", None, request)
    if key_field is not None and idem_field is not None and key_field.text == idem_field.text:
        raise c.fail(
            f"{key}.idempotency_field",
            "is the same field as reconciliation_key_field; one field carries one key",
        )
    carries = key_field is not None or key_param is not None or request.uses("reconciliation_key")
    key_format = _key_format(c, key, conf, tier, carries, key_param)
    object_id = (
        _object_id(c, f"{key}.object_id", conf["object_id"]) if "object_id" in conf else None
    )
    conflict = _conflict_statuses(c, key, conf)

    status, applied, not_applied = _reading(c, key, conf, None)
    maybe = (
        parse_predicate(f"{key}.maybe_applied", conf["maybe_applied"], status)
        if "maybe_applied" in conf
        else None
    )
    sends = _sent(request, carries, object_id, idem, idem_field)
    query = None
    if "query" in conf:
        if tier in (Tier.PARTIAL, Tier.BLIND):
            raise c.fail(
                f"{key}.query",
                f"a {tier} operation is verified by a person, so its query would never run; "
                'remove it, or declare tier = "reconcilable" if the query reads the real effect',
            )
        query = _query(c, key, conf["query"], sends, object_id, (status, applied, not_applied))
    elif tier is Tier.RECONCILABLE:
        raise c.fail(
            f"{key}.query",
            "missing: a reconcilable operation needs a query that reads the real effect; add "
            'query = { method = "GET", path = "/things/{reconciliation_key}" }, or declare '
            'tier = "partial" (a person verifies)',
        )
    if tier is Tier.FULL and applied is None and object_id is None and query is None:
        raise c.fail(
            key,
            "a 2xx by itself proves nothing (rule 19): declare what in the reply proves the "
            'effect, object_id = "/id" (its presence proves it) or status = "/status" with '
            'applied = ["succeeded"], or add a query; or declare tier = "partial" and let a '
            "person verify",
        )
    if conflict and query is None:
        raise c.fail(
            f"{key}.conflict_statuses",
            "a conflict only says the key may already be applied; the query must verify it, "
            "so add a query (or remove conflict_statuses)",
        )
    absent, shape = _not_found(c, key, conf, query)

    spec = OperationSpec(
        name,
        tier,
        consistency_window=budget.window,
        attempts=budget.attempts,
        dedupes_keys=idem is not None or idem_field is not None,
        timeout=budget.timeout,
        verify_interval=budget.verify_interval,
        verify_deadline=budget.verify_deadline,
        verify_min_checks=budget.verify_min_checks,
        queryable=query is not None,
        carries_key=carries,  # blind requests cannot carry a key (refused above)
        verifies=_describe_query(query) if query is not None else _unverified(tier),
        proof=_reply_proof(tier, applied, object_id) if tier is Tier.FULL else "",
        query_by_object_id=query is not None
        and "provider_object_id" in query.call.refs(body=False)
        and "reconciliation_key" not in query.call.refs(body=False),
        backoff=budget.backoff,
        conflict_statuses=conflict,
        destructive=conf.get("destructive", True),
        title=conf.get("title", ""),
        description=conf.get("description", ""),
        params_schema=dict(schema) if schema is not None else _params_schema(request),
        needs_confirmation=conf.get("needs_confirmation", False),
        absence_proof=query is not None and absent,
        predicate=query is not None and query.predicate,
        key_param=key_param,
        key_format="hex" if key_format is not None and key_param is None else None,
        effect=_effect(tier, applied, object_id, query),
        absence=_absence(tier, not_applied, maybe, query, absent, shape),
        neither=_neither(tier, maybe, query, absent, shape),
    )
    return Operation(
        spec,
        request,
        key_field,
        key_param,
        idem,
        idem_field,
        object_id,
        query,
        status,
        applied,
        not_applied,
        maybe,
        absent,
        shape,
        conflict,
        key_format,
    )


def _sent(
    request: Call,
    carries: bool,
    object_id: Source | None,
    idem: str | None,
    idem_field: Pointer | None,
) -> set[str]:
    """What of settled's own a query may read back to tie an item to this action."""
    out = set()
    if carries:
        out.add("reconciliation_key")
    if object_id is not None:
        out.add("provider_object_id")
    if request.uses("action_id"):
        out.add("action_id")
    if idem is not None or idem_field is not None or request.uses("idempotency_key"):
        out.add("idempotency_key")
    return out


def _key_format(
    c: Checker,
    key: str,
    conf: Mapping[str, Any],
    tier: Tier,
    carries: bool,
    key_param: str | None,
) -> KeyFormat | None:
    """What the reconciliation key must look like (a client-chosen id: Google
    Calendar's event ids are base32hex, 5-1024 characters). A generated key is then 32
    lowercase hex characters instead of ``stl-…``, which fits every alphabet here."""
    if "key_format" not in conf:
        return None
    where = f"{key}.key_format"
    raw = c.table(where, conf["key_format"], ("alphabet", "min_length", "max_length"))
    if tier is Tier.BLIND or not carries:
        raise c.fail(
            where,
            "applies to the reconciliation key the request carries, and this request carries "
            "none; set reconciliation_key_field or put {reconciliation_key} in the request",
        )
    alphabet = raw.get("alphabet")
    if alphabet is not None and alphabet not in ALPHABETS:
        raise c.fail(f"{where}.alphabet", f"{alphabet!r}: use one of {', '.join(ALPHABETS)}")
    low, high = 1, 200
    for k in ("min_length", "max_length"):
        if k in raw:
            v = raw[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise c.fail(f"{where}.{k}", "must be a whole number >= 1")
    low = raw.get("min_length", low)
    high = raw.get("max_length", max(high, low))
    if low > high:
        raise c.fail(where, f"min_length {low} is more than max_length {high}")
    if key_param is None and not low <= GENERATED_KEY_LENGTH <= high:
        raise c.fail(
            where,
            f"a key settled generates has {GENERATED_KEY_LENGTH} characters, outside "
            f"{low}-{high}; widen the range, or take the key from a param "
            '(reconciliation_key_param = "...")',
        )
    return KeyFormat(alphabet, low, high)


def _object_id(c: Checker, key: str, raw: Any) -> Source:
    """Where the provider's object id is: a path into the 2xx reply (a JSON pointer or
    JMESPath), or a header (``{ header = "Location", pattern = "/orders/([^/]+)$" }``)."""
    if isinstance(raw, str):
        return Source(path=Path.parse(key, raw))
    conf = c.table(key, raw, ("path", "header", "pattern"))
    if ("path" in conf) == ("header" in conf):
        raise c.fail(
            key,
            'takes one of path or header: object_id = "/id", or object_id = { header = "X-Message-Id" }',
        )
    pattern = None
    if "pattern" in conf:
        try:
            pattern = re.compile(c.text(f"{key}.pattern", conf["pattern"], '"/orders/([0-9]+)"'))
        except re.error as exc:
            raise c.fail(f"{key}.pattern", f"is not a regular expression ({exc})") from None
        if pattern.groups != 1:
            raise c.fail(
                f"{key}.pattern", 'must have exactly one group, the id: e.g. "/orders/([0-9]+)$"'
            )
    if "path" in conf:
        return Source(path=Path.parse(f"{key}.path", conf["path"]), pattern=pattern)
    name = conf["header"]
    if not isinstance(name, str) or not _TOKEN.match(name):
        raise c.fail(f"{key}.header", 'must be a header name, e.g. "X-Message-Id"')
    return Source(header=name, pattern=pattern)


def _reading(
    c: Checker,
    key: str,
    conf: Mapping[str, Any],
    inherited: tuple[Path | None, Predicate | None, Predicate | None] | None,
) -> tuple[Path | None, Predicate | None, Predicate | None]:
    """Where a reply's status is read and what proves or disproves the effect. A query
    that declares none of ``status``, ``applied`` and ``not_applied`` reads with the
    operation's (``inherited``); one that declares any reads with its own, its lists of
    values at its own ``status`` or else the operation's."""
    own = {"status", "applied", "not_applied"} & set(conf)
    if inherited is not None and not own:
        return inherited
    if "status" in conf:
        status: Path | None = Path.parse(f"{key}.status", conf["status"])
    elif inherited is not None and any(isinstance(conf.get(k), list) for k in own):
        status = inherited[0]  # the query's lists of values are read at the operation's status
    else:
        status = None
    applied = (
        parse_predicate(f"{key}.applied", conf["applied"], status) if "applied" in conf else None
    )
    not_applied = (
        parse_predicate(f"{key}.not_applied", conf["not_applied"], status)
        if "not_applied" in conf
        else None
    )
    if applied is None and ("status" in conf or inherited is not None):
        raise c.fail(
            f"{key}.applied",
            'missing: say what proves the effect, e.g. applied = ["delivered"] (read at status) '
            'or applied = { path = "/event", is = "delivered" }',
        )
    if applied is not None and not_applied is not None:
        both = overlap(applied, not_applied)
        if both is not None:
            raise c.fail(
                f"{key}.not_applied", f"{both} is in both applied and not_applied; keep it in one"
            )
    return status, applied, not_applied


def _not_found(
    c: Checker, key: str, conf: Mapping[str, Any], query: Query | None
) -> tuple[bool, Predicate]:
    """What the query's "not found" means, and what the provider's own not-found reply
    looks like (rule 20): absence is proof only in the declared shape; any other
    404/4xx/5xx is a check that failed."""
    not_found = conf.get("not_found", "pending")
    if not_found not in ("pending", "not_applied"):
        raise c.fail(
            f"{key}.not_found", f'{not_found!r} is not allowed; use "pending" or "not_applied"'
        )
    for k in ("not_found", "not_found_when"):
        if k in conf and query is None:
            raise c.fail(
                f"{key}.{k}", "applies to the query's replies, but there is no query; remove it"
            )
    if "not_found_when" in conf:
        shape = parse_predicate(f"{key}.not_found_when", conf["not_found_when"], None)
    elif not_found == "not_applied":
        raise c.fail(
            f"{key}.not_found_when",
            'missing: not_found = "not_applied" takes only the provider\'s own not-found reply '
            "as proof of absence (rule 20), so declare its shape, e.g. not_found_when = "
            '{ http_status = [404], path = "/error/code", is = "resource_missing" }, or '
            "{ http_status = [404] } where the API's 404 carries no error code; any other reply "
            "is then a check that failed, never absence",
        )
    else:
        shape = PLAIN_404
    return not_found == "not_applied", shape


def _query(
    c: Checker,
    key: str,
    value: Any,
    sends: set[str],
    object_id: Source | None,
    inherited: tuple[Path | None, Predicate | None, Predicate | None],
) -> Query:
    allowed = REQUEST_FIELDS | {"reconciliation_key", "provider_object_id"}
    call, conf = c.call(f"{key}.query", value, ("GET",), allowed, QUERY_KEYS)
    call = _elsewhere(c, f"{key}.query", conf, call)
    refs = call.refs(body=False)
    if "reconciliation_key" in refs and "reconciliation_key" not in sends:
        raise c.fail(
            f"{key}.query.path",
            "uses {reconciliation_key} but the request does not carry the key; set "
            "reconciliation_key_field, or put {reconciliation_key} in request.path",
        )
    if "provider_object_id" in refs and object_id is None:
        raise c.fail(
            f"{key}.query.path",
            'uses {provider_object_id} but object_id is not set; add object_id = "/id" '
            "(a JSON pointer into the reply)",
        )
    items = Path.parse(f"{key}.query.list", conf["list"]) if "list" in conf else None
    match: list[tuple[Path, Text]] = []
    tied = False
    if "match" in conf:
        raw = conf["match"]
        pairs = {raw: "{reconciliation_key}"} if isinstance(raw, str) else raw
        if not isinstance(pairs, Mapping) or not pairs:
            raise c.fail(
                f"{key}.query.match",
                'must be a JSON pointer into each item ("/client_reference": it must equal the key) '
                'or a table of pointer = value, e.g. { "/metadata/ref" = "{reconciliation_key}" }',
            )
        for ptr, want in pairs.items():
            where = f"{key}.query.match.{ptr}"
            if not isinstance(want, str):
                raise c.fail(where, 'must be a string such as "{reconciliation_key}"')
            text = _shape.parse_text(where, want, allowed, optional=False)
            names = {r.name for r in text.refs}
            if "reconciliation_key" in names and "reconciliation_key" not in sends:
                raise c.fail(
                    where, "uses {reconciliation_key} but the request does not carry the key"
                )
            tied = tied or bool(names & sends & set(TIES))
            match.append((Path.parse(where, ptr), text))
    if items is not None and not match:
        raise c.fail(
            f"{key}.query.match",
            'missing: a list query proves nothing without a match; add match = "/client_reference" '
            "(the item field that holds the key) so one item can be told from another",
        )
    addressed = {r.name for r in call.path.refs} & {"reconciliation_key", "provider_object_id"}
    if not match and not addressed:
        # A status read from a resource that is not this action's says nothing about it,
        # and a filter in the query string alone may be ignored by the API.
        raise c.fail(
            f"{key}.query",
            "proves nothing about this action: it addresses no resource of it; put "
            "{reconciliation_key} or {provider_object_id} in its path, or declare list and "
            'match (e.g. list = "/data", match = "/client_reference")',
        )
    if match and not addressed and not tied:
        # Rule 19: an item that matches only on params (the recipient, the amount) may be
        # another action's: an earlier mail to the same address confirms a dropped one.
        raise c.fail(
            f"{key}.query.match",
            "names neither the reconciliation key nor the object id, so the item it picks may "
            "be another action's (rule 19): match on a field that carries what settled sent "
            '(e.g. "/custom_args/settled_key" = "{reconciliation_key}", with the key sent in '
            'that field), or remove the query and declare tier = "partial" (a person '
            "verifies, or a signed callback that names the key)",
        )
    status, applied, not_applied = _reading(c, f"{key}.query", conf, inherited)
    pages = _pages(c, f"{key}.query.pages", conf["pages"], items) if "pages" in conf else None
    only = None
    if "where" in conf:
        if items is None:
            raise c.fail(f"{key}.query.where", 'applies to a list query; add list = "/items"')
        only = parse_predicate(f"{key}.query.where", conf["where"], None)
    found_id = object_id if object_id is not None and object_id.path is not None else None
    if "object_id" in conf:
        found_id = _object_id(c, f"{key}.query.object_id", conf["object_id"])
        if found_id.header is not None:
            raise c.fail(f"{key}.query.object_id", 'is read in the item: write a path, e.g. "/id"')
    return Query(call, items, tuple(match), status, applied, not_applied, pages, only, found_id)


def _elsewhere(c: Checker, key: str, conf: Mapping[str, Any], call: Call) -> Call:
    """A query on another host (``base_url``) with its own ``auth``: it sends only its
    own headers there, never the provider's (whose credentials belong to another host)."""
    if "base_url" not in conf and "auth" not in conf:
        return call
    fixed: dict[str, str] = {}
    if "auth" in conf:
        fixed.update(c.auth(f"{key}.auth", conf["auth"]))
        if any(h.lower() == "authorization" for h in call.headers):
            raise c.fail(f"{key}.auth", "and headers.Authorization both set it; keep one")
    base = None
    if "base_url" in conf:
        raw, hidden = expand_url(f"{key}.base_url", conf["base_url"], c.env)
        c.secrets += hidden
        base = base_url(raw, shown=conf["base_url"], key=f"{key}.base_url")
    return Call(
        call.method,
        call.path,
        call.query,
        call.headers,
        call.body,
        call.encoding,
        call.form_lists,
        base=base,
        fixed=fixed,
    )


def _pages(c: Checker, key: str, raw: Any, items: Path | None) -> Pages:
    conf = c.table(key, raw, ("link", "url", "cursor", "param", "max"))
    if items is None:
        raise c.fail(key, 'applies to a list query; add list = "/data" and a match')
    most = conf.get("max", DEFAULT_PAGES)
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_PAGES:
        raise c.fail(f"{key}.max", f"must be a whole number 1-{MAX_PAGES} (pages read at most)")
    if len({"link", "url", "cursor"} & set(conf)) != 1:
        raise c.fail(
            key,
            'takes one of link, url or cursor: pages = { link = "next" } (a Link header), '
            'pages = { url = "/paging/next" } (the next page\'s URL in the reply), or '
            'pages = { cursor = "/meta/next_cursor", param = "cursor" }',
        )
    if "url" in conf:
        if "param" in conf:
            raise c.fail(f"{key}.param", "applies to a cursor; remove it")
        return Pages(url=Path.parse(f"{key}.url", conf["url"]), max=most)
    if "link" in conf:
        rel = conf["link"]
        if not isinstance(rel, str) or not _TOKEN.match(rel) or "param" in conf:
            raise c.fail(f"{key}.link", 'must be a link relation such as "next" (and no param)')
        return Pages(link=rel, max=most)
    cursor = Path.parse(f"{key}.cursor", conf["cursor"])
    param = conf.get("param")
    if not isinstance(param, str) or not param:
        raise c.fail(
            f"{key}.param",
            'missing: the query parameter that sends the cursor back, e.g. param = "cursor"',
        )
    return Pages(cursor=cursor, param=param, max=most)


# -- what proves what, in words (settled providers, providers audit) -------------------------


def _reply_proof(tier: Tier, applied: Predicate | None, object_id: Source | None) -> str:
    if applied is not None:
        return f"a 2xx reply where {applied.describe()}"
    if object_id is not None:
        return f"a 2xx reply (not 202) that carries its object id at {object_id.text}"
    return "nothing in the reply: the query decides"


def _unverified(tier: Tier) -> str:
    if tier is Tier.FULL:
        return "the reply (no query: a lost reply needs a person)"
    if tier is Tier.PARTIAL:
        return "a person: the reply proves delivery only"
    return "nothing can: a person"


def _describe_query(query: Query) -> str:
    call = query.call
    qs = "&".join(f"{k}=…" for k in call.query)
    where = (call.base or "") + template_text(call.path)
    what = f"{call.method} {where}" + (f"?{qs}" if qs else "")
    matched = ", ".join(f"{p.text} = {template_text(t)}" for p, t in query.match)
    if query.items is not None:
        what += f": the one item of {query.items.text or 'the reply'} whose {matched}"
        if query.where is not None:
            what += f" among those where {query.where.describe()}"
        if query.pages is not None:
            what += f" (up to {query.pages.max} pages)"
    elif query.match:
        what += f": {matched}"
    if query.applied is not None:
        return what + ("; " if query.match else ": ") + query.applied.describe()
    return what + ("" if query.match else ": exists (no predicate)")


def _effect(
    tier: Tier, applied: Predicate | None, object_id: Source | None, query: Query | None
) -> str:
    parts = []
    if tier is Tier.FULL and (applied is not None or object_id is not None):
        parts.append(_reply_proof(tier, applied, object_id))
    if query is not None:
        parts.append("the query: " + _describe_query(query))
    if not parts:
        return "a person's verdict (settled resolve), or a signed callback that reports it"
    return "; or ".join(parts)


def _absence(
    tier: Tier,
    not_applied: Predicate | None,
    maybe: Predicate | None,
    query: Query | None,
    absent: bool,
    shape: Predicate,
) -> str:
    parts = ["nothing sent (the connection was refused)"]
    rejection = "a 4xx reply to the send (a validation rejection)"
    if maybe is not None:
        rejection += f" unless {maybe.describe()}"
    parts.append(rejection)
    if not_applied is not None:
        parts.append(f"a 2xx reply where {not_applied.describe()}")
    if query is not None:
        if query.not_applied is not None:
            parts.append(f"the query's item where {query.not_applied.describe()}")
        if absent:
            parts.append(
                f"the provider's not-found reply ({shape.describe()}) or no matching item, "
                "once the request can no longer land"
            )
    return "; ".join(parts)


def _neither(
    tier: Tier, maybe: Predicate | None, query: Query | None, absent: bool, shape: Predicate
) -> str:
    parts = ["a timeout, a reset, a 5xx, 408 or 429", "a 2xx reply its predicates do not recognise"]
    if maybe is not None:
        parts.append(f"{maybe.describe()} (may come after the effect)")
    if query is not None:
        if not absent:
            parts.append(f"the not-found reply ({shape.describe()}): not visible yet")
        parts.append("any other 4xx/5xx from the query: a check that failed")
        if query.items is not None:
            parts.append("several matching items: ambiguous")
    return "; ".join(parts)


def template_text(t: Text) -> str:
    return "".join(p if isinstance(p, str) else "{" + p.name + "}" for p in t.parts)
