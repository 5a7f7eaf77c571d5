"""The ``http`` provider: a declarative client for real HTTP APIs, configured in
settled.toml (DESIGN.md §3; every key is documented in docs/providers.md).

It reports what happened on the wire and what the reply body says, nothing more:
the dispatcher classifies (DESIGN.md rule 3) and owns the one retry budget.

- A ``full`` operation's 2xx reply proves the effect only as declared: when
  ``status`` and ``applied`` are configured, only a reply whose status is in
  ``applied``; without them, any 2xx except ``202 Accepted`` (which says, by
  definition, that processing has not completed).
- A query reads the real effect: a status in ``applied`` → applied, in
  ``not_applied`` → not applied, anything else → not yet; a 404 is "not yet" unless
  ``not_found = "not_applied"``; without ``status`` a 2xx alone means applied.

Secrets: header values may use ``${VAR}``, read from the environment when the
provider is built. They are sent and never returned: every detail, reason and piece
of evidence this provider hands back passes through a ``Redactor`` that masks them.
"""

from __future__ import annotations

import math
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from ..errors import ConfigError, UnknownProvider
from ..model import DEFAULT_CONSISTENCY_WINDOW, Tier
from ._wire import Exchange, Redactor, excerpt, exchange, parse_json
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

PROVIDER_KEYS = ("base_url", "timeout", "headers", "operations")
OPERATION_KEYS = (
    "tier",
    "consistency_window",
    "attempts",
    "timeout",
    "idempotency_header",
    "request",
    "reconciliation_key_field",
    "object_id",
    "query",
    "status",
    "applied",
    "not_applied",
    "not_found",
    "verify",
)
REQUEST_METHODS = ("POST", "PUT", "PATCH", "DELETE")
DEFAULT_TIMEOUT = 5.0
DEFAULT_ATTEMPTS = 3
DEFAULT_VERIFY = {"interval": 2.0, "deadline": 300.0}

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name


def create(name: str, conf: Mapping[str, Any], client: httpx.Client) -> HttpProvider:
    return HttpProvider(name, conf, client, os.environ)


# -- JSON pointers (RFC 6901) ---------------------------------------------------------------


@dataclass(frozen=True)
class Pointer:
    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Pointer | None:
        if text == "":
            return cls(text, ())
        if not text.startswith("/") or re.search(r"~(?![01])", text):
            return None
        return cls(
            text, tuple(t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/"))
        )

    def find(self, doc: Any) -> tuple[bool, Any]:
        """``(found, value)``."""
        for token in self.tokens:
            if isinstance(doc, Mapping) and token in doc:
                doc = doc[token]
            elif isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
                doc = doc[int(token)]
            else:
                return False, None
        return True, doc


# -- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    method: str
    path: str  # a template: {reconciliation_key}, {provider_object_id}


@dataclass(frozen=True)
class _Operation:
    spec: OperationSpec
    request: _Call
    key_field: str | None
    idempotency_header: str | None
    object_id: Pointer | None
    query: _Call | None
    status: Pointer | None
    applied: tuple[Any, ...]
    not_applied: tuple[Any, ...]
    not_found_absent: bool


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

    def number(self, key: str, value: Any, *, positive: bool) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(key, f"must be a number of seconds, got {value!r}")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value!r}")
        if value < 0:
            raise self.fail(key, f"must be >= 0, got {value!r}")
        return float(value)

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

    def call(
        self, key: str, value: Any, methods: tuple[str, ...], allowed_fields: set[str]
    ) -> _Call:
        conf = self.table(key, value, ("method", "path"))
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
        if not isinstance(path, str) or not path.startswith("/"):
            raise self.fail(f"{key}.path", f'{path!r} must start with "/", e.g. path = "/things"')
        try:
            fields = [
                f
                for _, f, spec, conv in string.Formatter().parse(path)
                if f is not None or spec or conv
            ]
            bad = [f for f in fields if f not in allowed_fields]
        except ValueError:
            bad = ["a stray { or }"]
        if bad:
            known = ", ".join("{" + f + "}" for f in sorted(allowed_fields)) or "none"
            raise self.fail(
                f"{key}.path",
                f"{bad[0]!r} is not a placeholder here; use {known} (write {{{{ and }}}} for literal braces)",
            )
        return _Call(method.upper(), path)

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
            if not isinstance(raw, str):
                raise self.fail(where, 'must be a string, e.g. "Bearer ${TOKEN}"')
            out[name] = self.expand(where, raw)
        return out

    def expand(self, key: str, raw: str) -> str:
        """``${VAR}`` → the environment's value, remembered as a secret. The value
        itself never appears in a message."""
        leftover = _ENV.sub("", raw)
        if "${" in leftover:
            raise self.fail(key, "has a malformed ${...}; write ${NAME} with letters, digits and _")

        def sub(m: re.Match[str]) -> str:
            var = m.group(1)
            if var not in self.env:
                raise self.fail(
                    key,
                    f"environment variable {var} is not set; export it before running settled "
                    "(values are read at run time, never stored)",
                )
            value = self.env[var]
            self.secrets.append(value)
            return value

        value = _ENV.sub(sub, raw)
        if value != raw:
            self.secrets.append(value)
        if any(c in value for c in "\r\n\0") or not value.isascii():
            raise self.fail(
                key, "expands to characters not allowed in a header (non-ASCII, CR, LF)"
            )
        return value

    def values(self, key: str, value: Any) -> tuple[Any, ...]:
        ok = isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) for v in value)
        if not ok or not value:
            raise self.fail(
                key,
                f'must be a non-empty list of values, e.g. {key.rsplit(".", 1)[-1]} = ["delivered"]',
            )
        return tuple(value)


_EXAMPLES = {
    "request": '{ method = "POST", path = "/messages" }',
    "query": '{ method = "GET", path = "/messages/{reconciliation_key}" }',
    "verify": "{ interval = 2, deadline = 300 }",
    "operations": "[providers.NAME.operations.OP]",
    "": "{ ... }",
}


def _operation(c: _Checker, name: str, conf: Any, default_timeout: float) -> _Operation:
    key = f"operations.{name}"
    conf = c.table(key, conf, OPERATION_KEYS)
    if "tier" not in conf:
        raise c.fail(
            f"{key}.tier", 'missing; add tier = "full", "reconcilable", "partial" or "blind"'
        )
    try:
        tier = Tier(conf["tier"])
    except ValueError:
        raise c.fail(
            f"{key}.tier",
            f"{conf['tier']!r} is not a tier; use one of full, reconcilable, partial, blind",
        ) from None
    window = c.number(
        f"{key}.consistency_window",
        conf.get("consistency_window", DEFAULT_CONSISTENCY_WINDOW),
        positive=False,
    )
    attempts = conf.get("attempts", DEFAULT_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise c.fail(
            f"{key}.attempts",
            f"must be a whole number >= 1 (the one retry budget), got {attempts!r}",
        )
    timeout = c.number(f"{key}.timeout", conf.get("timeout", default_timeout), positive=True)
    idem = conf.get("idempotency_header")
    if idem is not None and (not isinstance(idem, str) or not _TOKEN.match(idem)):
        raise c.fail(
            f"{key}.idempotency_header",
            'must be a header name, e.g. "Idempotency-Key"; omit it when the provider does not deduplicate',
        )
    if "request" not in conf:
        raise c.fail(
            f"{key}.request", 'missing; add request = { method = "POST", path = "/things" }'
        )
    request = c.call(
        f"{key}.request",
        conf["request"],
        REQUEST_METHODS,
        {"reconciliation_key"} if tier is not Tier.BLIND else set(),
    )
    key_field = conf.get("reconciliation_key_field")
    if key_field is not None:
        key_field = c.text(f"{key}.reconciliation_key_field", key_field, '"client_reference"')
        if tier is Tier.BLIND:
            raise c.fail(
                f"{key}.reconciliation_key_field",
                "a blind operation gets no reconciliation key; remove it",
            )
    carries = key_field is not None or "{reconciliation_key}" in request.path
    object_id = c.pointer(f"{key}.object_id", conf["object_id"]) if "object_id" in conf else None

    query = None
    if "query" in conf:
        if tier in (Tier.PARTIAL, Tier.BLIND):
            raise c.fail(
                f"{key}.query",
                f"a {tier} operation is verified by a person, so its query would never run; "
                'remove it, or declare tier = "reconcilable" if the query reads the real effect',
            )
        query = c.call(
            f"{key}.query", conf["query"], ("GET",), {"reconciliation_key", "provider_object_id"}
        )
        if "{reconciliation_key}" in query.path and not carries:
            raise c.fail(
                f"{key}.query.path",
                "uses {reconciliation_key} but the request does not carry the key; set "
                "reconciliation_key_field, or put {reconciliation_key} in request.path",
            )
        if "{provider_object_id}" in query.path and object_id is None:
            raise c.fail(
                f"{key}.query.path",
                'uses {provider_object_id} but object_id is not set; add object_id = "/id" '
                "(a JSON pointer into the reply)",
            )
    elif tier is Tier.RECONCILABLE:
        raise c.fail(
            f"{key}.query",
            "missing: a reconcilable operation needs a query that reads the real effect; add "
            'query = { method = "GET", path = "/things/{reconciliation_key}" }, or declare '
            'tier = "partial" (a person verifies)',
        )

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
    not_found = conf.get("not_found", "pending")
    if not_found not in ("pending", "not_applied"):
        raise c.fail(
            f"{key}.not_found", f'{not_found!r} is not allowed; use "pending" or "not_applied"'
        )
    if "not_found" in conf and query is None:
        raise c.fail(
            f"{key}.not_found", "applies to the query's 404, but there is no query; remove it"
        )
    if not_found == "not_applied" and tier is Tier.FULL:
        # A full operation has no window: its query runs right after an ambiguous reply,
        # while the request may still be in progress, so a 404 then proves nothing.
        raise c.fail(
            f"{key}.not_found",
            "a full operation's query runs at once after an ambiguous reply, when a 404 "
            'cannot prove absence; use not_found = "pending"',
        )

    verify = dict(DEFAULT_VERIFY)
    if "verify" in conf:
        vconf = c.table(f"{key}.verify", conf["verify"], ("interval", "deadline"))
        for vk in ("interval", "deadline"):
            if vk in vconf:
                verify[vk] = c.number(f"{key}.verify.{vk}", vconf[vk], positive=True)

    if tier is Tier.FULL:
        proof = (
            f"a 2xx reply with {status.text} in {list(applied)}"
            if status is not None
            else "any 2xx reply except 202 (as declared)"
        )
    else:
        proof = ""
    if query is not None:
        what = f"{query.method} {query.path}"
        verifies = what + (f": {status.text} in {list(applied)}" if status else ": a 2xx")
    elif tier is Tier.FULL:
        verifies = "the reply (no query: a lost reply needs a person)"
    elif tier is Tier.PARTIAL:
        verifies = "a person: the reply proves delivery only"
    else:
        verifies = "nothing can: a person"
    spec = OperationSpec(
        name,
        tier,
        consistency_window=window,
        attempts=attempts,
        dedupes_keys=idem is not None,
        timeout=timeout,
        verify_interval=verify["interval"],
        verify_deadline=verify["deadline"],
        queryable=query is not None,
        carries_key=carries,  # blind requests cannot carry a key (refused above)
        verifies=verifies,
        proof=proof,
        query_by_object_id=query is not None
        and "{provider_object_id}" in query.path
        and "{reconciliation_key}" not in query.path,
    )
    return _Operation(
        spec,
        request,
        key_field,
        idem,
        object_id,
        query,
        status,
        applied,
        not_applied,
        not_found == "not_applied",
    )


# -- the provider -------------------------------------------------------------------------------


class HttpProvider(BaseProvider):
    def __init__(
        self, name: str, conf: Mapping[str, Any], client: httpx.Client, env: Mapping[str, str]
    ) -> None:
        self.name = name
        c = _Checker(env)
        c.table("", conf, PROVIDER_KEYS)
        if "base_url" not in conf:
            raise c.fail("base_url", 'missing; add base_url = "https://api.example.com"')
        base = conf["base_url"]
        if not isinstance(base, str) or not base.startswith(("http://", "https://")):
            raise c.fail(
                "base_url",
                f'{base!r} must be an http:// or https:// URL, e.g. "https://api.example.com"',
            )
        if urlsplit(base).username is not None:
            raise c.fail(
                "base_url",
                "must not carry credentials; send them in headers, e.g. "
                'headers = { Authorization = "Bearer ${TOKEN}" }',
            )
        self._base = base.rstrip("/")
        timeout = c.number("timeout", conf.get("timeout", DEFAULT_TIMEOUT), positive=True)
        self._headers = c.headers("headers", conf.get("headers", {}))
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

    def _url(self, template: str, **values: str | None) -> str:
        encoded = {k: quote(v or "", safe="") for k, v in values.items()}
        return self._base + template.format(**encoded)

    # -- execute --------------------------------------------------------------------------

    def execute(self, request: Request) -> WireResult:
        op = self._op(request.operation)
        body: Any = request.params
        if op.key_field is not None:
            if not isinstance(body, Mapping):
                return WireResult(
                    Wire.NOT_CONNECTED,
                    detail=f"not sent: params must be a JSON object to carry the key in {op.key_field!r}",
                )
            body = {**body, op.key_field: request.reconciliation_key}
        headers = dict(self._headers)
        if op.idempotency_header:
            headers[op.idempotency_header] = request.idempotency_key
        url = self._url(op.request.path, reconciliation_key=request.reconciliation_key)
        ex = exchange(
            self._client,
            op.request.method,
            url,
            timeout=request.timeout,
            headers=headers,
            json_body=body,
            redact=self._redact,
        )
        if ex.wire is not Wire.ANSWERED:
            return WireResult(ex.wire, detail=ex.problem)
        return self._reply(op, ex)

    def _reply(self, op: _Operation, ex: Exchange) -> WireResult:
        code = ex.status_code or 0
        notes = [f"HTTP {code}"]
        body: Any = None
        parsed = False
        if ex.body is None:
            notes.append(ex.problem)
        elif ex.body:
            body, problem = parse_json(ex.body)
            parsed = not problem
            if problem and ex.ok:
                notes.append(problem)
            if not ex.ok:
                notes.append(f"body: {excerpt(ex.body)}")
        object_id = None
        if ex.ok and parsed and op.object_id is not None:
            found, value = op.object_id.find(body)
            if found and isinstance(value, (str, int)) and not isinstance(value, bool):
                object_id = str(value)
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
            object_id=self._redact(object_id) if object_id else None,
            applied=applied,
            detail=self._redact("; ".join(n for n in notes if n)),
        )

    # -- query ----------------------------------------------------------------------------

    def query(self, target: QueryTarget) -> Observation:
        op = self._op(target.operation)
        if op.query is None:
            return Observation(Seen.UNKNOWN, detail=f"{self.name}.{target.operation} has no query")
        path = op.query.path
        if "{reconciliation_key}" in path and not target.reconciliation_key:
            return Observation(Seen.UNKNOWN, detail="no reconciliation key to query")
        if "{provider_object_id}" in path and not target.provider_object_id:
            return Observation(
                Seen.UNKNOWN,
                detail="no provider object id to query (the reply that carries it never arrived)",
            )
        url = self._url(
            path,
            reconciliation_key=target.reconciliation_key,
            provider_object_id=target.provider_object_id,
        )
        ex = exchange(
            self._client,
            "GET",
            url,
            timeout=op.spec.timeout,
            headers=self._headers,
            redact=self._redact,
        )
        return self._observe(op, ex)

    def _observe(self, op: _Operation, ex: Exchange) -> Observation:
        evidence: dict[str, Any] = {"status_code": ex.status_code}
        if ex.wire is not Wire.ANSWERED:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        code = ex.status_code
        if code == 404:
            if op.not_found_absent:
                return Observation(
                    Seen.NOT_APPLIED,
                    detail="404: absent (not_found = not_applied)",
                    evidence=evidence,
                    by_absence=True,
                )
            return Observation(Seen.NOT_YET, detail="404: not visible yet", evidence=evidence)
        if not ex.ok:
            shown = f": {excerpt(ex.body)}" if ex.body else ""
            return Observation(
                Seen.UNKNOWN,
                detail=self._redact(f"unexpected reply HTTP {code}{shown}"),
                evidence=evidence,
            )
        if ex.body is None:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        body, problem = parse_json(ex.body) if ex.body else (None, "empty reply")
        object_id = None
        if not problem and op.object_id is not None:
            found, value = op.object_id.find(body)
            if found and isinstance(value, (str, int)) and not isinstance(value, bool):
                object_id = self._redact(str(value))
        if op.status is None:
            return Observation(Seen.APPLIED, object_id, f"HTTP {code}: the effect exists", evidence)
        if problem:
            return Observation(Seen.UNKNOWN, detail=problem, evidence=evidence)
        found, value = op.status.find(body)
        if not found:
            return Observation(
                Seen.UNKNOWN, detail=f"reply has no {op.status.text}", evidence=evidence
            )
        evidence["status"] = self._redact.value(value)
        shown = self._redact(repr(value))
        if _member(value, op.applied):
            return Observation(Seen.APPLIED, object_id, f"{op.status.text} = {shown}", evidence)
        if _member(value, op.not_applied):
            return Observation(Seen.NOT_APPLIED, object_id, f"{op.status.text} = {shown}", evidence)
        return Observation(
            Seen.NOT_YET, object_id, f"{op.status.text} = {shown}, not terminal", evidence
        )


def _member(value: Any, options: tuple[Any, ...]) -> bool:
    """Equality that keeps True apart from 1 (JSON true is not the number 1)."""
    return any(type(value) is type(o) and value == o for o in options) or (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and any(
            isinstance(o, (int, float)) and not isinstance(o, bool) and value == o for o in options
        )
    )
