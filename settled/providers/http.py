"""The ``http`` provider: a declarative client for real HTTP APIs, configured in
settled.toml (docs/providers.md; every key is documented in docs/providers.md).

It reports what happened on the wire and what the reply body says, nothing more:
the dispatcher classifies (rule 3 in docs/rules.md) and owns the one retry budget.

- The request is built from templates (``_shape``): path, query string, headers and
  a JSON or form body, with placeholders for params and keys. The same function
  builds what ``execute`` sends and what ``settled providers render`` shows.
- A ``full`` operation's 2xx reply proves the effect only as declared: when
  ``status`` and ``applied`` are configured, only a reply whose status is in
  ``applied``; without them, any 2xx except ``202 Accepted`` (which says, by
  definition, that processing has not completed).
- A declared conflict status (``conflict_statuses``, e.g. 409 on a create with the
  same key) is reported as ``WireResult.conflict``: an earlier try may have applied
  it; never proof (rule 10 in docs/rules.md).
- A query reads the real effect, one addressed resource or one item of a list
  (``list`` and ``match``): zero matches, an empty list, ``null`` or ``{}`` are "not
  found"; several matches are ambiguous; a status in ``applied`` → applied, in
  ``not_applied`` → not applied, anything else → not yet. Without ``status`` and
  ``match`` a query only checks that one resource addressed in its path exists:
  allowed, reported as ``predicate = false`` (audit debt).

Secrets: ``${VAR}`` values (``base_url``, headers, ``auth``) are read from the
environment when the provider is built, and sent byte for byte (a value a header cannot
carry is refused then, by the variable's name). They are never returned: every detail,
reason and piece of evidence this provider hands back passes through a ``Redactor``
that masks every spelling of them (``_redact``).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from ..checks import ENV_REF, expand_env, expand_url, has_control, number
from ..errors import ConfigError, InvalidInput, UnknownProvider
from ..model import DEFAULT_CONSISTENCY_WINDOW, Tier, idempotency_key
from . import _shape
from ._redact import Redactor
from ._shape import FORM_LISTS, OMIT, Pointer, ShapeError, Text
from ._wire import (
    Exchange,
    build,
    excerpt,
    exchange,
    header_value,
    parse_json,
    send,
    show,
)
from .base import (
    BaseProvider,
    Observation,
    OperationSpec,
    QueryTarget,
    Request,
    Seen,
    Wire,
    WireResult,
)

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
    "request",
    "reconciliation_key_field",
    "reconciliation_key_param",
    "object_id",
    "conflict_statuses",
    "query",
    "status",
    "applied",
    "not_applied",
    "not_found",
    "verify",
)
REQUEST_KEYS = ("method", "path", "query", "headers", "body", "encoding", "form_lists")
QUERY_KEYS = ("method", "path", "query", "headers", "list", "match")
REQUEST_METHODS = ("POST", "PUT", "PATCH", "DELETE")
ENCODINGS = ("json", "form", "none")
DEFAULT_TIMEOUT = 5.0
DEFAULT_ATTEMPTS = 3
DEFAULT_VERIFY = {"interval": 2.0, "deadline": 300.0, "min_checks": 3.0}
# Placeholders a request may use (the key only where the tier has one).
REQUEST_FIELDS = {"params", "idempotency_key", "action_id", "attempt"}
# What ``render`` shows for values settled only knows at dispatch.
SAMPLE_ACTION_ID = "ACTION-ID"
SAMPLE_KEY = "stl-KEY"
SAMPLE_OBJECT_ID = "OBJECT-ID"

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name
_ENV_SENTINEL = "\x00{}\x00"


def create(name: str, conf: Mapping[str, Any], client: httpx.Client) -> HttpProvider:
    return HttpProvider(name, conf, client, os.environ)


# -- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    method: str
    path: Text
    query: Mapping[str, Any] = field(default_factory=dict)  # name -> template
    headers: Mapping[str, Any] = field(default_factory=dict)  # name -> Text
    body: Any = None  # a template; None = the params as they are
    encoding: str = "json"
    form_lists: str = "indexed"

    def uses(self, name: str) -> bool:
        refs = [
            *self.path.refs,
            *_shape.refs_of(dict(self.query)),
            *_shape.refs_of(dict(self.headers)),
        ]
        if self.body is not None:
            refs += _shape.refs_of(self.body)
        return any(r.name == name for r in refs)


@dataclass(frozen=True)
class _Query:
    call: _Call
    items: Pointer | None  # where the list of candidates is (``list``)
    match: tuple[tuple[Pointer, Text], ...]  # each item field and the value it must equal


@dataclass(frozen=True)
class _Operation:
    spec: OperationSpec
    request: _Call
    key_field: Pointer | None
    key_param: str | None
    idempotency_header: str | None
    object_id: Pointer | None
    query: _Query | None
    status: Pointer | None
    applied: tuple[Any, ...]
    not_applied: tuple[Any, ...]
    not_found_absent: bool
    conflict: tuple[int, ...]


class _Checker:
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
    ) -> tuple[_Call, Mapping[str, Any]]:
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
            body = _shape.compile_template(f"{key}.body", conf["body"], allowed)
            if (
                encoding == "form"
                and not isinstance(body, Mapping)
                and not (isinstance(body, Text) and body.whole is not None)
            ):
                raise self.fail(f"{key}.body", "a form body must be a table of name = value pairs")
        return _Call(method.upper(), path_t, query, headers, body, encoding, lists), conf

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


_EXAMPLES = {
    "request": '{ method = "POST", path = "/messages" }',
    "query": '{ method = "GET", path = "/messages/{reconciliation_key}" }',
    "verify": "{ interval = 2, deadline = 300, min_checks = 3 }",
    "auth": '{ type = "bearer", token = "${API_TOKEN}" }',
    "operations": "[providers.NAME.operations.OP]",
    "": "{ ... }",
}


def _operation(c: _Checker, name: str, conf: Any, default_timeout: float) -> _Operation:
    """One operation's table, checked section by section: what it is (tier, budget, the
    words an agent sees), how its request is shaped and where the key goes, how its
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
    key_field = _key_field(c, key, conf, tier, request)
    carries = key_field is not None or key_param is not None or request.uses("reconciliation_key")
    object_id = c.pointer(f"{key}.object_id", conf["object_id"]) if "object_id" in conf else None
    conflict = _conflict_statuses(c, key, conf)

    status, applied, not_applied = _reading(c, key, conf)
    query = None
    if "query" in conf:
        if tier in (Tier.PARTIAL, Tier.BLIND):
            raise c.fail(
                f"{key}.query",
                f"a {tier} operation is verified by a person, so its query would never run; "
                'remove it, or declare tier = "reconcilable" if the query reads the real effect',
            )
        query = _query(c, key, conf["query"], carries, object_id, status)
    elif tier is Tier.RECONCILABLE:
        raise c.fail(
            f"{key}.query",
            "missing: a reconcilable operation needs a query that reads the real effect; add "
            'query = { method = "GET", path = "/things/{reconciliation_key}" }, or declare '
            'tier = "partial" (a person verifies)',
        )
    if conflict and query is None:
        raise c.fail(
            f"{key}.conflict_statuses",
            "a conflict only says the key may already be applied; the query must verify it, "
            "so add a query (or remove conflict_statuses)",
        )
    not_found = conf.get("not_found", "pending")
    if not_found not in ("pending", "not_applied"):
        raise c.fail(
            f"{key}.not_found", f'{not_found!r} is not allowed; use "pending" or "not_applied"'
        )
    if "not_found" in conf and query is None:
        raise c.fail(
            f"{key}.not_found", "applies to the query's 404, but there is no query; remove it"
        )

    proof, verifies = _describe(tier, query, status, applied)
    query_refs = set()
    if query is not None:
        query_refs = {
            r.name for r in [*query.call.path.refs, *_shape.refs_of(dict(query.call.query))]
        }
    spec = OperationSpec(
        name,
        tier,
        consistency_window=budget.window,
        attempts=budget.attempts,
        dedupes_keys=idem is not None,
        timeout=budget.timeout,
        verify_interval=budget.verify_interval,
        verify_deadline=budget.verify_deadline,
        verify_min_checks=budget.verify_min_checks,
        queryable=query is not None,
        carries_key=carries,  # blind requests cannot carry a key (refused above)
        verifies=verifies,
        proof=proof,
        query_by_object_id="provider_object_id" in query_refs
        and "reconciliation_key" not in query_refs,
        backoff=budget.backoff,
        conflict_statuses=conflict,
        destructive=conf.get("destructive", True),
        title=conf.get("title", ""),
        description=conf.get("description", ""),
        params_schema=dict(schema) if schema is not None else _params_schema(request),
        needs_confirmation=conf.get("needs_confirmation", False),
        absence_proof=query is not None and not_found == "not_applied",
        predicate=query is not None and (status is not None or bool(query.match)),
        key_param=key_param,
    )
    return _Operation(
        spec,
        request,
        key_field,
        key_param,
        idem,
        object_id,
        query,
        status,
        applied,
        not_applied,
        not_found == "not_applied",
        conflict,
    )


def _tier(c: _Checker, key: str, conf: Mapping[str, Any]) -> Tier:
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


def _budget(c: _Checker, key: str, conf: Mapping[str, Any], default_timeout: float) -> _Budget:
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


def _presentation(c: _Checker, key: str, conf: Mapping[str, Any]) -> Mapping[str, Any] | None:
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


def _key_param(c: _Checker, key: str, conf: Mapping[str, Any], tier: Tier) -> str | None:
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


def _key_field(
    c: _Checker, key: str, conf: Mapping[str, Any], tier: Tier, request: _Call
) -> Pointer | None:
    """Where in the body the key is written: a field name, a JSON pointer or a form path."""
    if "reconciliation_key_field" not in conf:
        return None
    raw = c.text(
        f"{key}.reconciliation_key_field", conf["reconciliation_key_field"], '"client_reference"'
    )
    if tier is Tier.BLIND:
        raise c.fail(
            f"{key}.reconciliation_key_field",
            "a blind operation gets no reconciliation key; remove it",
        )
    if request.encoding == "none":
        raise c.fail(
            f"{key}.reconciliation_key_field",
            'the request has no body (encoding = "none"); put {reconciliation_key} in its path or query',
        )
    key_field = Pointer.parse(raw) if raw.startswith("/") else Pointer.from_form_path(raw)
    if key_field is None or not key_field.tokens:
        raise c.fail(
            f"{key}.reconciliation_key_field",
            f'{raw!r}: write a field name ("client_reference"), a JSON pointer ("/row/id") '
            'or a form path ("metadata[ref]")',
        )
    return key_field


def _conflict_statuses(c: _Checker, key: str, conf: Mapping[str, Any]) -> tuple[int, ...]:
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


def _reading(
    c: _Checker, key: str, conf: Mapping[str, Any]
) -> tuple[Pointer | None, tuple[Any, ...], tuple[Any, ...]]:
    """Where a reply's status is read and which values prove or disprove the effect."""
    status = c.pointer(f"{key}.status", conf["status"]) if "status" in conf else None
    applied = c.values(f"{key}.applied", conf["applied"]) if "applied" in conf else ()
    not_applied = (
        c.values(f"{key}.not_applied", conf["not_applied"]) if "not_applied" in conf else ()
    )
    if status is not None and not applied:
        raise c.fail(
            f"{key}.applied",
            'missing: status needs the values that prove the effect, e.g. applied = ["delivered"]',
        )
    if status is None and (applied or not_applied):
        which = "applied" if applied else "not_applied"
        raise c.fail(
            f"{key}.status",
            f'missing: {which} needs a JSON pointer to read, e.g. status = "/status"',
        )
    both = set(map(repr, applied)) & set(map(repr, not_applied))
    if both:
        raise c.fail(
            f"{key}.not_applied", f"{min(both)} is in both applied and not_applied; keep it in one"
        )
    return status, applied, not_applied


def _describe(
    tier: Tier, query: _Query | None, status: Pointer | None, applied: tuple[Any, ...]
) -> tuple[str, str]:
    """What proves the effect on the reply (full only), and what verifies it later."""
    if tier is Tier.FULL:
        proof = (
            f"a 2xx reply with {status.text} in {list(applied)}"
            if status is not None
            else "any 2xx reply except 202 (as declared)"
        )
    else:
        proof = ""
    if query is not None:
        verifies = _describe_query(query, status, applied)
    elif tier is Tier.FULL:
        verifies = "the reply (no query: a lost reply needs a person)"
    elif tier is Tier.PARTIAL:
        verifies = "a person: the reply proves delivery only"
    else:
        verifies = "nothing can: a person"
    return proof, verifies


def _query(
    c: _Checker,
    key: str,
    value: Any,
    carries: bool,
    object_id: Pointer | None,
    status: Pointer | None,
) -> _Query:
    allowed = REQUEST_FIELDS | {"reconciliation_key", "provider_object_id"}
    call, conf = c.call(f"{key}.query", value, ("GET",), allowed, QUERY_KEYS)
    refs = {
        r.name
        for r in [
            *call.path.refs,
            *_shape.refs_of(dict(call.query)),
            *_shape.refs_of(dict(call.headers)),
        ]
    }
    if "reconciliation_key" in refs and not carries:
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
    items = c.pointer(f"{key}.query.list", conf["list"]) if "list" in conf else None
    match: list[tuple[Pointer, Text]] = []
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
            if "reconciliation_key" in {r.name for r in text.refs} and not carries:
                raise c.fail(
                    where, "uses {reconciliation_key} but the request does not carry the key"
                )
            match.append((c.pointer(where, ptr), text))
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
    return _Query(call, items, tuple(match))


def _describe_query(query: _Query, status: Pointer | None, applied: tuple[Any, ...]) -> str:
    call = query.call
    qs = "&".join(f"{k}=…" for k in call.query)
    what = f"{call.method} {_template_text(call.path)}" + (f"?{qs}" if qs else "")
    matched = ", ".join(f"{p.text} = {_template_text(t)}" for p, t in query.match)
    if query.items is not None:
        what += f": the one item of {query.items.text or 'the reply'} whose {matched}"
    elif query.match:
        what += f": {matched}"
    if status is not None:
        return what + ("; " if query.match else ": ") + f"{status.text} in {list(applied)}"
    return what + ("" if query.match else ": exists (no predicate)")


def _template_text(t: Text) -> str:
    return "".join(p if isinstance(p, str) else "{" + p.name + "}" for p in t.parts)


def _params_schema(call: _Call) -> Mapping[str, Any] | None:
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


# -- the provider -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """One request as it goes on the wire."""

    method: str
    url: str
    headers: dict[str, str]
    content: bytes | None
    query: list[tuple[str, str]]


class HttpProvider(BaseProvider):
    def __init__(
        self, name: str, conf: Mapping[str, Any], client: httpx.Client, env: Mapping[str, str]
    ) -> None:
        self.name = name
        c = _Checker(env)
        c.table("", conf, PROVIDER_KEYS)
        if "base_url" not in conf:
            raise c.fail("base_url", 'missing; add base_url = "https://api.example.com"')
        base, hidden = expand_url("base_url", conf["base_url"], env)
        c.secrets += hidden
        self._base = _base_url(base, shown=conf["base_url"])
        timeout = number("timeout", conf.get("timeout", DEFAULT_TIMEOUT), positive=True)
        self._headers = c.headers("headers", conf.get("headers", {}))
        if "auth" in conf:
            auth = c.auth("auth", conf["auth"])
            if any(h.lower() == "authorization" for h in self._headers):
                raise c.fail("auth", "and headers.Authorization both set it; keep one")
            self._headers.update(auth)
        ops = conf.get("operations")
        if not isinstance(ops, Mapping) or not ops:
            raise c.fail(
                "operations", f"missing; add at least one [providers.{name}.operations.OP] table"
            )
        self._ops = {op: _operation(c, op, oconf, timeout) for op, oconf in ops.items()}
        self._redact = Redactor(c.secrets)
        self._client = client

    def operations(self) -> Mapping[str, OperationSpec]:
        return {name: op.spec for name, op in self._ops.items()}

    def _op(self, name: str) -> _Operation:
        op = self._ops.get(name)
        if op is None:
            raise UnknownProvider(f"{self.name} has no operation {name!r}")
        return op

    # -- building requests ------------------------------------------------------------------

    def _context(
        self,
        op: _Operation,
        params: Any,
        action_id: str,
        attempt: int,
        key: str | None,
        object_id: str | None = None,
        idem: str | None = None,
    ) -> dict[str, Any]:
        if op.key_param is not None:
            key = _key_from_param(op.key_param, params)
        elif op.spec.tier is Tier.BLIND:
            key = None
        return {
            "params": params,
            "reconciliation_key": key,
            "idempotency_key": idem or idempotency_key(action_id, attempt),
            "action_id": action_id,
            "attempt": attempt,
            "provider_object_id": object_id,
        }

    def _build(self, call: _Call, ctx: Mapping[str, Any], op: _Operation | None) -> Built:
        """The request a call template describes; ``op`` for the operation's own request
        (body, key field, idempotency header). Raises ShapeError."""
        url = self._base + _shape.render_path(call.path, ctx)
        query: list[tuple[str, str]] = []
        for name, tmpl in call.query.items():
            value = _shape.render(tmpl, ctx)
            if value is OMIT:
                continue
            for v in value if isinstance(value, list) else [value]:
                query.append((name, _shape.as_text(_shape.Ref(f"query.{name}", False), v)))
        headers = dict(self._headers)
        for name, tmpl in call.headers.items():
            headers[name] = _header(name, tmpl, ctx)
        content = None
        if op is not None:
            if op.idempotency_header:
                headers[op.idempotency_header] = header_value(ctx["idempotency_key"])
            if call.encoding != "none":
                body = ctx["params"] if call.body is None else _shape.render(call.body, ctx)
                if op.key_field is not None:
                    body = op.key_field.put(body, ctx["reconciliation_key"])
                content, ctype = _encode(body, call)
                if content is not None:
                    headers.setdefault("Content-Type", ctype)
        return Built(call.method, url, headers, content, query)

    def _request(self, op: _Operation, ctx: Mapping[str, Any]) -> Built:
        return self._build(op.request, ctx, op)

    def _query_request(self, op: _Operation, ctx: Mapping[str, Any]) -> Built:
        assert op.query is not None
        return self._build(op.query.call, ctx, None)

    def check_params(self, operation: str, params: Any) -> None:
        """Refuse, before anything is recorded, params no request could be built from:
        a missing param, a key param that is absent or unsafe, a param where the key
        goes, a value that would change which resource a path addresses."""
        op = self._op(operation)
        try:
            ctx = self._context(op, params, "check", 1, SAMPLE_KEY, SAMPLE_OBJECT_ID)
            self._request(op, ctx)
            if op.query is not None:
                self._query_request(op, ctx)
                for _, want in op.query.match:
                    _shape.render(want, ctx)
        except ShapeError as exc:
            raise InvalidInput(f"{self.name}.{operation}: {exc}") from None

    # -- execute --------------------------------------------------------------------------

    def execute(self, request: Request) -> WireResult:
        op = self._op(request.operation)
        try:
            ctx = self._context(
                op,
                request.params,
                request.action_id,
                request.attempt,
                request.reconciliation_key,
                idem=request.idempotency_key,
            )
            built = self._request(op, ctx)
        except ShapeError as exc:
            return WireResult(Wire.NOT_CONNECTED, detail=self._redact.clean(f"not sent: {exc}"))
        req = build(
            self._client,
            built.method,
            built.url,
            headers=built.headers,
            content=built.content,
            params=built.query,
        )
        if isinstance(req, str):
            return WireResult(Wire.NOT_CONNECTED, detail=self._redact.clean(f"not sent: {req}"))
        ex = send(
            self._client, req, timeout=request.timeout, send_by=request.send_by, redact=self._redact
        )
        if ex.wire is not Wire.ANSWERED:
            return WireResult(ex.wire, detail=ex.problem, written_at=ex.written_at)
        return self._reply(op, ex)

    def _reply(self, op: _Operation, ex: Exchange) -> WireResult:
        code = ex.status_code or 0
        notes = [f"HTTP {code}"]
        body: Any = None
        parsed = False
        conflict = code in op.conflict
        if conflict:
            notes.append("a declared conflict: this key may already be applied; the query decides")
        if ex.body is None:
            notes.append(ex.problem)
        elif ex.body:
            body, problem = parse_json(ex.body)
            parsed = not problem
            if problem and ex.ok:
                notes.append(problem)
            if not ex.ok:
                notes.append(f"body: {excerpt(ex.body, redact=self._redact)}")
        object_id = None
        if ex.ok and parsed and op.object_id is not None:
            object_id = _object_id(op.object_id, body)
        applied: bool | None = None
        if ex.ok:
            if op.status is not None:
                found, value = op.status.find(body) if parsed else (False, None)
                if found and _member(value, op.applied):
                    applied = True
                elif found and _member(value, op.not_applied):
                    applied = False
                    notes.append(f"{op.status.text} = {value!r}")
                else:
                    shown = repr(value) if found else "absent"
                    notes.append(f"{op.status.text} = {shown} proves nothing")
            elif op.spec.tier is Tier.FULL:
                if code == 202:
                    notes.append("202 Accepted: processing not complete, proves nothing")
                else:
                    applied = True
        return WireResult(
            Wire.ANSWERED,
            status_code=code,
            object_id=self._redact.clean(object_id) if object_id else None,
            applied=applied,
            detail=self._redact.clean("; ".join(n for n in notes if n)),
            conflict=conflict,
            written_at=ex.written_at,
            retry_after=ex.retry_after,
        )

    # -- query ----------------------------------------------------------------------------

    def query(self, target: QueryTarget) -> Observation:
        op = self._op(target.operation)
        if op.query is None:
            return Observation(Seen.UNKNOWN, detail=f"{self.name}.{target.operation} has no query")
        refs = {r.name for r in op.query.call.path.refs} | {
            r.name for r in _shape.refs_of(dict(op.query.call.query))
        }
        if "provider_object_id" in refs and not target.provider_object_id:
            return Observation(
                Seen.UNKNOWN,
                detail="no provider object id to query (the reply that carries it never arrived)",
            )
        try:
            ctx = self._context(
                op,
                target.params,
                target.action_id,
                target.attempt,
                target.reconciliation_key,
                target.provider_object_id,
            )
            built = self._query_request(op, ctx)
            wants = [(ptr, _shape.render(t, ctx)) for ptr, t in op.query.match]
        except ShapeError as exc:
            return Observation(Seen.UNKNOWN, detail=self._redact.clean(f"not queried: {exc}"))
        ex = exchange(
            self._client,
            "GET",
            built.url,
            timeout=op.spec.timeout,
            headers=built.headers,
            params=built.query,
            redact=self._redact,
        )
        return self._observe(op, ex, wants)

    def _absent(self, op: _Operation, why: str, evidence: dict[str, Any]) -> Observation:
        """Nothing found. Proof of absence only where declared, and the core counts it
        only once the request can no longer land (``by_absence``)."""
        if op.not_found_absent:
            return Observation(
                Seen.NOT_APPLIED,
                detail=f"{why}: absent (not_found = not_applied)",
                evidence=evidence,
                by_absence=True,
            )
        return Observation(Seen.NOT_YET, detail=f"{why}: not visible yet", evidence=evidence)

    def _observe(
        self, op: _Operation, ex: Exchange, wants: list[tuple[Pointer, Any]]
    ) -> Observation:
        assert op.query is not None
        evidence: dict[str, Any] = {"status_code": ex.status_code}
        if ex.wire is not Wire.ANSWERED:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        code = ex.status_code
        if code == 404:
            return self._absent(op, "404", evidence)
        if not ex.ok:
            shown = f": {excerpt(ex.body, redact=self._redact)}" if ex.body else ""
            return Observation(
                Seen.UNKNOWN,
                detail=self._redact.clean(f"unexpected reply HTTP {code}{shown}"),
                evidence=evidence,
            )
        if ex.body is None:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        if not ex.body.strip():
            return Observation(
                Seen.UNKNOWN,
                detail=f"HTTP {code} with an empty reply proves nothing",
                evidence=evidence,
            )
        body, problem = parse_json(ex.body)
        if problem:
            return Observation(Seen.UNKNOWN, detail=f"HTTP {code}: {problem}", evidence=evidence)
        if op.query.items is not None:
            found, items = op.query.items.find(body)
            if not found or not isinstance(items, list):
                where = op.query.items.text or "the reply"
                return Observation(
                    Seen.UNKNOWN, detail=f"HTTP {code}: {where} is not a list", evidence=evidence
                )
            matches = [it for it in items if _matches(it, wants)]
            evidence["matches"] = len(matches)
            if not matches:
                return self._absent(op, f"HTTP {code}: no item matches", evidence)
            if len(matches) > 1:
                return Observation(
                    Seen.AMBIGUOUS,
                    detail=f"HTTP {code}: {len(matches)} items match; cannot tell which is this action's",
                    evidence=evidence,
                )
            item = matches[0]
        else:
            item = body
            if item is None or item in ({}, []):
                return self._absent(
                    op, f"HTTP {code}: an empty reply ({json.dumps(item)})", evidence
                )
            if wants and not _matches(item, wants):
                return Observation(
                    Seen.AMBIGUOUS,
                    detail=f"HTTP {code}: the resource exists but does not carry this action's key",
                    evidence=evidence,
                )
        object_id = _object_id(op.object_id, item) if op.object_id is not None else None
        object_id = self._redact.clean(object_id) if object_id else None
        if op.status is None:
            what = "the matching item exists" if wants else "the resource exists (no predicate)"
            return Observation(Seen.APPLIED, object_id, f"HTTP {code}: {what}", evidence)
        found, value = op.status.find(item)
        if not found:
            return Observation(
                Seen.UNKNOWN, detail=f"reply has no {op.status.text}", evidence=evidence
            )
        evidence["status"] = self._redact.value(value)
        shown = self._redact.clean(repr(value))
        if _member(value, op.applied):
            return Observation(Seen.APPLIED, object_id, f"{op.status.text} = {shown}", evidence)
        if _member(value, op.not_applied):
            return Observation(Seen.NOT_APPLIED, object_id, f"{op.status.text} = {shown}", evidence)
        return Observation(
            Seen.NOT_YET, object_id, f"{op.status.text} = {shown}, not terminal", evidence
        )

    # -- render ---------------------------------------------------------------------------

    def render(
        self,
        operation: str,
        params: Any,
        *,
        action_id: str = SAMPLE_ACTION_ID,
        attempt: int = 1,
        reconciliation_key: str | None = None,
        provider_object_id: str | None = None,
    ) -> dict[str, Any]:
        """The exact request ``execute`` would send for these params (secrets shown as
        ``***``), and the query that would verify it. Sends nothing. Raises
        ``InvalidInput`` when no request can be built."""
        op = self._op(operation)
        key = reconciliation_key or (SAMPLE_KEY if op.spec.carries_key else None)
        try:
            ctx = self._context(
                op, params, action_id, attempt, key, provider_object_id or SAMPLE_OBJECT_ID
            )
            built = self._request(op, ctx)
            out: dict[str, Any] = {
                "provider": self.name,
                "operation": operation,
                "tier": str(op.spec.tier),
                "reconciliation_key": ctx["reconciliation_key"],
                "idempotency_key": ctx["idempotency_key"] if op.idempotency_header else None,
                "request": self._shown(built),
                "query": None,
            }
            if op.query is not None:
                out["query"] = self._shown(self._query_request(op, ctx))
                out["query"]["proves"] = op.spec.verifies
        except ShapeError as exc:
            raise InvalidInput(f"{self.name}.{operation}: {exc}") from None
        notes = []
        if op.key_param is None and op.spec.carries_key and reconciliation_key is None:
            notes.append(
                f"{SAMPLE_KEY} stands for the reconciliation key settled generates at dispatch"
            )
        if action_id == SAMPLE_ACTION_ID:
            notes.append(f"{SAMPLE_ACTION_ID} stands for the action id")
        if out["query"] is not None and op.spec.query_by_object_id and provider_object_id is None:
            where = op.object_id.text if op.object_id else "-"
            notes.append(f"{SAMPLE_OBJECT_ID} stands for the id read from the reply at {where}")
        out["notes"] = notes
        return out

    def _shown(self, built: Built) -> dict[str, Any]:
        req = build(
            self._client,
            built.method,
            built.url,
            headers=built.headers,
            content=built.content,
            params=built.query,
        )
        if isinstance(req, str):
            raise ShapeError(req)
        return show(req, self._redact)


def _base_url(base: Any, shown: Any = None) -> str:
    """``base`` (its ``${VAR}``s already read) checked as httpx will parse it; messages
    quote ``shown``, the configured text, never a value read from the environment."""
    fix = 'e.g. base_url = "https://api.example.com/v1"'
    shown = base if shown is None else shown
    if not isinstance(base, str) or not base.startswith(("http://", "https://")):
        raise ConfigError(f"base_url: {shown!r} must be an http:// or https:// URL, {fix}")
    try:
        url = httpx.URL(base)
        httpx.URL(base.rstrip("/") + "/x")
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        why = f" ({exc})" if shown == base else ""
        raise ConfigError(f"base_url: {shown!r} is not a valid URL{why}; {fix}") from None
    if url.userinfo:
        raise ConfigError(
            "base_url: must not carry credentials; send them with auth or in headers, e.g. "
            'headers = { Authorization = "Bearer ${TOKEN}" }'
        )
    if not url.host:
        raise ConfigError(f"base_url: {shown!r} names no host; {fix}")
    if url.query or url.fragment or "?" in base or "#" in base:
        raise ConfigError(
            "base_url: must not hold a query string or fragment; put query parameters in "
            'request.query, e.g. query = { api_version = "2" }'
        )
    return base.rstrip("/")


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _header(name: str, template: Text, ctx: Mapping[str, Any]) -> str:
    """One header value: the configured text and its ``${VAR}`` values exactly as they
    are (a SAS token's ``%2F`` stays ``%2F``); each placeholder's value written as a
    header value (``header_value``: visible ASCII as is, anything else percent-encoded
    once)."""
    out = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
        else:
            out.append(header_value(_shape.as_text(part, _shape.lookup(part, ctx))))
    value = "".join(out)
    if value != value.strip():
        raise ShapeError(
            f"header {name} would start or end with a space, which HTTP strips in transit"
        )
    return value


def _key_from_param(name: str, params: Any) -> str:
    value = params.get(name) if isinstance(params, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ShapeError(
            f"params need {name!r} (a string or a whole number): it is this operation's "
            "reconciliation key"
        )
    text = str(value)
    if not text or len(text) > 200 or not text.isprintable() or text != text.strip():
        raise ShapeError(
            f"params.{name} is the reconciliation key: it must be 1-200 printable characters "
            "without surrounding spaces"
        )
    return text


def _encode(body: Any, call: _Call) -> tuple[bytes | None, str]:
    if call.encoding == "form":
        if body is None:
            return None, ""
        return (
            urlencode(_shape.form_pairs(body, call.form_lists)).encode("ascii"),
            "application/x-www-form-urlencoded",
        )
    if body is None:
        return None, ""
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"the body is not valid JSON: {exc}") from None
    return text.encode("utf-8"), "application/json"


def _object_id(ptr: Pointer, body: Any) -> str | None:
    found, value = ptr.find(body)
    if found and isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    return None


def _same(value: Any, want: Any) -> bool:
    """The equality a match uses: a number in the reply equals the same number written
    as text in a template (``1042`` and ``"1042"``), and true is never 1."""
    if isinstance(value, bool) or isinstance(want, bool):
        return type(value) is type(want) and value == want
    if isinstance(value, int) and isinstance(want, str):
        return str(value) == want
    if isinstance(want, int) and isinstance(value, str):
        return str(want) == value
    return type(value) is type(want) and value == want


def _matches(item: Any, wants: list[tuple[Pointer, Any]]) -> bool:
    for ptr, want in wants:
        found, value = ptr.find(item)
        if not found or not _same(value, want):
            return False
    return True


def _member(value: Any, options: tuple[Any, ...]) -> bool:
    """Equality that keeps True apart from 1 (JSON true is not the number 1)."""
    return any(type(value) is type(o) and value == o for o in options) or (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and any(
            isinstance(o, (int, float)) and not isinstance(o, bool) and value == o for o in options
        )
    )
