"""The ``http`` provider: a declarative client for real HTTP APIs, configured in
settled.toml (docs/providers.md documents every key; ``_http_config`` reads them).

It reports what happened on the wire and what the reply says, as declared, nothing
more: the dispatcher classifies (rule 3 in docs/rules.md) and owns the one retry budget.

- The request is built from templates (``_shape``): path, query string, headers and
  a JSON or form body, with placeholders for params and keys, and ``${VAR}`` secrets
  read from the environment. The same function builds what ``execute`` sends and what
  ``settled providers render`` shows.
- **Proof names the action** (rule 19). A ``full`` operation's 2xx reply proves the
  effect only as declared: a reply where the ``applied`` predicate holds, or, without
  one, a reply (not ``202 Accepted``) that carries its object id. Anything else is
  "accepted": the query decides, or a person.
- **Only a final answer proves absence** (rule 20). A reply proves "not applied" only
  through ``not_applied``; a 4xx is the dispatcher's validation rejection (rule 3)
  unless ``maybe_applied`` says this error may come after the effect, which makes it
  unknown (``WireResult.maybe_applied``). A declared conflict status
  (``conflict_statuses``) is reported as ``WireResult.conflict``: never proof.
- A query reads the real effect, one addressed resource or one item of a list
  (``list`` and ``match``, over up to ``pages.max`` pages): zero matches, an empty
  list, ``null`` or ``{}``, and the provider's own not-found reply (``not_found_when``,
  a plain 404 by default) are "not found"; several matches are ambiguous; any other
  4xx or 5xx is a check that failed (``Seen.UNKNOWN``), never absence. Then the item's
  predicates: ``applied`` → applied, ``not_applied`` → not applied, else not yet.

Secrets: ``${VAR}`` values (``base_url``, headers, ``auth``, body templates) are read
from the environment when the provider is built, and sent byte for byte. They are never
returned: every detail, reason and piece of evidence this provider hands back passes
through a ``Redactor`` that masks every spelling of them (``_redact``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx

from ..checks import expand_url, number
from ..errors import ConfigError, InvalidInput, UnknownProvider
from ..model import Tier, idempotency_key
from . import _shape
from ._http_config import (
    DEFAULT_TIMEOUT,
    PROVIDER_KEYS,
    Call,
    Checker,
    Operation,
    Pages,
    base_url,
    operation,
)
from ._predicate import NO_BODY, Path, Predicate, Reading, same
from ._redact import Redactor
from ._shape import OMIT, ShapeError, Text
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

# What ``render`` shows for values settled only knows at dispatch.
SAMPLE_ACTION_ID = "ACTION-ID"
SAMPLE_KEY = "stl-KEY"
SAMPLE_FORMATTED_KEY = "0123456789abcdef" * 2  # a generated key when a key_format applies
SAMPLE_OBJECT_ID = "OBJECT-ID"


def create(name: str, conf: Mapping[str, Any], client: httpx.Client) -> HttpProvider:
    return HttpProvider(name, conf, client, os.environ)


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
        c = Checker(env)
        c.table("", conf, PROVIDER_KEYS)
        if "base_url" not in conf:
            raise c.fail("base_url", 'missing; add base_url = "https://api.example.com"')
        base, hidden = expand_url("base_url", conf["base_url"], env)
        c.secrets += hidden
        self._base = base_url(base, shown=conf["base_url"])
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
        # Every operation is checked, so that `settled providers check` names every
        # problem at once; any command stops at the first.
        self._ops: dict[str, Operation] = {}
        problems: list[str] = []
        for op, oconf in ops.items():
            try:
                self._ops[op] = operation(c, op, oconf, timeout)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError(problems[0], problems)
        self._redact = Redactor(c.secrets)
        self._client = client

    def operations(self) -> Mapping[str, OperationSpec]:
        return {name: op.spec for name, op in self._ops.items()}

    def _op(self, name: str) -> Operation:
        op = self._ops.get(name)
        if op is None:
            raise UnknownProvider(f"{self.name} has no operation {name!r}")
        return op

    # -- building requests ------------------------------------------------------------------

    def _context(
        self,
        op: Operation,
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
        if op.key_format is not None and key is not None:
            problem = op.key_format.problem(key)
            if problem:
                source = f"params.{op.key_param}" if op.key_param else "the reconciliation key"
                raise ShapeError(f"{source} is {key!r}: it {problem} (key_format)")
        return {
            "params": params,
            "reconciliation_key": key,
            "idempotency_key": idem or idempotency_key(action_id, attempt),
            "action_id": action_id,
            "attempt": attempt,
            "provider_object_id": object_id,
        }

    def _sample_key(self, op: Operation) -> str:
        return SAMPLE_FORMATTED_KEY if op.key_format is not None else SAMPLE_KEY

    def _build(self, call: Call, ctx: Mapping[str, Any], op: Operation | None) -> Built:
        """The request a call template describes; ``op`` for the operation's own request
        (body, key fields, idempotency header). A query on another host sends only its
        own headers there. Raises ShapeError."""
        base = call.base if call.base is not None else self._base
        url = base + _shape.render_path(call.path, ctx)
        query: list[tuple[str, str]] = []
        for name, tmpl in call.query.items():
            value = _shape.render(tmpl, ctx)
            if value is OMIT:
                continue
            for v in value if isinstance(value, list) else [value]:
                query.append((name, _shape.as_text(_shape.Ref(f"query.{name}", False), v)))
        if call.base is not None:
            headers = dict(call.fixed or {})
        else:
            headers = dict(self._headers)
            if call.fixed:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                headers.update(call.fixed)
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
                if op.idempotency_field is not None:
                    body = op.idempotency_field.put(body, ctx["idempotency_key"])
                content, ctype = _encode(body, call)
                if content is not None:
                    headers.setdefault("Content-Type", ctype)
        return Built(call.method, url, headers, content, query)

    def _request(self, op: Operation, ctx: Mapping[str, Any]) -> Built:
        return self._build(op.request, ctx, op)

    def _query_request(self, op: Operation, ctx: Mapping[str, Any]) -> Built:
        assert op.query is not None
        return self._build(op.query.call, ctx, None)

    def check_params(self, operation: str, params: Any) -> None:
        """Refuse, before anything is recorded, params no request could be built from:
        a missing param, a key param that is absent, unsafe or not in the declared
        key_format, a param where a key goes, a value that would change which resource
        a path addresses."""
        op = self._op(operation)
        try:
            ctx = self._context(op, params, "check", 1, self._sample_key(op), SAMPLE_OBJECT_ID)
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

    def _reply(self, op: Operation, ex: Exchange) -> WireResult:
        """What the send's reply says, read only as declared (rules 19 and 20)."""
        code = ex.status_code or 0
        notes = [f"HTTP {code}"]
        body: Any = NO_BODY
        conflict = code in op.conflict
        if conflict:
            notes.append("a declared conflict: this key may already be applied; the query decides")
        if ex.body is None:
            notes.append(ex.problem)
        elif ex.body:
            parsed, problem = parse_json(ex.body)
            body = NO_BODY if problem else parsed
            if problem and ex.ok:
                notes.append(problem)
            if not ex.ok:
                notes.append(f"body: {excerpt(ex.body, redact=self._redact)}")
        seen = Reading(code, body)
        object_id = None
        if ex.ok and op.object_id is not None:
            object_id = op.object_id.find(body, ex.headers)
        applied: bool | None = None
        maybe = False
        if ex.ok and op.applied is not None and op.applied.holds(seen):
            applied = True
        elif not conflict and op.maybe_applied is not None and op.maybe_applied.holds(seen):
            maybe = True
            notes.append(
                f"{self._said(op.maybe_applied, body)}: declared to come possibly after the "
                "effect (maybe_applied); outcome unknown"
            )
        elif ex.ok and op.not_applied is not None and op.not_applied.holds(seen):
            applied = False
            notes.append(self._said(op.not_applied, body))
        elif ex.ok and op.applied is not None:
            notes.append(f"{self._said(op.applied, body)}: proves nothing")
        elif ex.ok and op.spec.tier is Tier.FULL:
            if code == 202:
                notes.append("202 Accepted: processing not complete, proves nothing")
            elif object_id is not None:
                applied = True  # the reply to this request names the object it made
            elif op.object_id is not None:
                notes.append(f"no object id at {op.object_id.text}: proves nothing")
        return WireResult(
            Wire.ANSWERED,
            status_code=code,
            object_id=self._redact.clean(object_id) if object_id else None,
            applied=applied,
            detail=self._redact.clean("; ".join(n for n in notes if n)),
            conflict=conflict,
            written_at=ex.written_at,
            retry_after=ex.retry_after,
            maybe_applied=maybe,
        )

    def _said(self, pred: Predicate, body: Any) -> str:
        """The values a predicate read, as ``/event = 'failed', /severity = 'temporary'``."""
        shown = []
        for path in dict.fromkeys(pred.paths()):
            found, value = (False, None) if body is NO_BODY else path.find(body)
            shown.append(f"{path.text or 'the reply'} = {repr(value) if found else 'absent'}")
        return self._redact.clean(", ".join(shown) or pred.describe())

    # -- query ----------------------------------------------------------------------------

    def query(self, target: QueryTarget) -> Observation:
        op = self._op(target.operation)
        if op.query is None:
            return Observation(Seen.UNKNOWN, detail=f"{self.name}.{target.operation} has no query")
        if "provider_object_id" in op.query.call.refs(body=False) and not target.provider_object_id:
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
        return self._read(op, built, wants)

    def _get(self, op: Operation, built: Built, url: str, params: Any) -> Exchange:
        return exchange(
            self._client,
            "GET",
            url,
            timeout=op.spec.timeout,
            headers=built.headers,
            params=params,
            redact=self._redact,
        )

    def _read(self, op: Operation, built: Built, wants: list[tuple[Path, Any]]) -> Observation:
        """The query, page after page for a list (at most ``pages.max``), then what it
        found: this action's one item, none, or several."""
        q = op.query
        assert q is not None
        evidence: dict[str, Any] = {}
        url: str = built.url
        params: Any = built.query
        matches: list[Any] = []
        pages = 0
        code = 0
        while True:
            ex = self._get(op, built, url, params)
            pages += 1
            evidence["status_code"] = ex.status_code
            page = self._page(op, ex, evidence, first=pages == 1)
            if isinstance(page, Observation):
                return page
            code = ex.status_code or 0
            if q.items is None:
                return self._resource(op, page, wants, code, evidence)
            found, items = q.items.find(page)
            if not found or not isinstance(items, list):
                where = q.items.text or "the reply"
                return Observation(
                    Seen.UNKNOWN, detail=f"HTTP {code}: {where} is not a list", evidence=evidence
                )
            matches += [
                it
                for it in items
                if _matches(it, wants) and (q.where is None or q.where.holds(Reading(code, it)))
            ]
            if len(matches) > 1 or q.pages is None:
                break
            if not items:
                break  # a page without items is the last
            nxt = self._next_page(q.pages, ex, page, url, params)
            if isinstance(nxt, str):
                return Observation(Seen.UNKNOWN, detail=self._redact.clean(nxt), evidence=evidence)
            if nxt is None:
                break
            if pages >= q.pages.max:
                if not matches:
                    return Observation(
                        Seen.UNKNOWN,
                        detail=f"no item matches in the first {pages} pages and more follow "
                        f"(pages.max = {q.pages.max}): this action's item may be on a later one",
                        evidence={**evidence, "pages": pages},
                    )
                break
            url, params = nxt
        if q.pages is not None:
            evidence["pages"] = pages
        evidence["matches"] = len(matches)
        if not matches:
            return self._absent(op, f"HTTP {code}: no item matches", evidence)
        if len(matches) > 1:
            return Observation(
                Seen.AMBIGUOUS,
                detail=f"HTTP {code}: {len(matches)} items match; cannot tell which is this action's",
                evidence=evidence,
            )
        return self._item(op, matches[0], code, evidence)

    def _page(
        self, op: Operation, ex: Exchange, evidence: dict[str, Any], *, first: bool
    ) -> Observation | Any:
        """One reply of the query: its parsed body, or what it already proves (the
        provider's own not-found reply, on the first page) or that it proves nothing."""
        if ex.wire is not Wire.ANSWERED:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        code = ex.status_code or 0
        body: Any = NO_BODY
        problem = ""
        if ex.body is not None and ex.body.strip():
            parsed, problem = parse_json(ex.body)
            body = NO_BODY if problem else parsed
        if first and op.not_found_when.holds(Reading(code, body)):
            return self._absent(op, f"HTTP {code}: the provider's not-found reply", evidence)
        if not ex.ok:
            shown = f": {excerpt(ex.body, redact=self._redact)}" if ex.body else ""
            why = f"unexpected reply HTTP {code}{shown}"
            if code == 404:
                why += f" (not the declared not-found reply: {op.not_found_when.describe()})"
            return Observation(Seen.UNKNOWN, detail=self._redact.clean(why), evidence=evidence)
        if ex.body is None:
            return Observation(Seen.UNKNOWN, detail=ex.problem, evidence=evidence)
        if not ex.body.strip():
            return Observation(
                Seen.UNKNOWN,
                detail=f"HTTP {code} with an empty reply proves nothing",
                evidence=evidence,
            )
        if problem:
            return Observation(Seen.UNKNOWN, detail=f"HTTP {code}: {problem}", evidence=evidence)
        return body

    def _next_page(
        self, pages: Pages, ex: Exchange, body: Any, url: str, params: Any
    ) -> tuple[str, Any] | str | None:
        """The next page's URL and query, None when this was the last, or why it cannot
        be read (a link to another host: the query's credentials stay with its own)."""
        if pages.link is not None or pages.url is not None:
            if pages.link is not None:
                what, target = f"the {pages.link!r} link", _link(ex.headers, pages.link)
            else:
                assert pages.url is not None
                found, value = pages.url.find(body)
                what, target = pages.url.text, value if found and isinstance(value, str) else None
            if not target:
                return None
            here = httpx.URL(url)
            try:
                there = here.join(target)
            except (httpx.InvalidURL, ValueError):
                return f"{what} is not a URL: {target[:100]!r}"
            if (there.scheme, there.host, there.port) != (here.scheme, here.host, here.port):
                return f"{what} points to another host ({there.host}); not followed"
            return str(there), None
        cursor, param = pages.cursor, pages.param
        assert cursor is not None and param is not None
        found, value = cursor.find(body)
        if not found or value in ("", None) or isinstance(value, (bool, dict, list)):
            return None
        rest = [(k, v) for k, v in (params or []) if k != param]
        return url, [*rest, (param, str(value))]

    def _resource(
        self,
        op: Operation,
        item: Any,
        wants: list[tuple[Path, Any]],
        code: int,
        evidence: dict[str, Any],
    ) -> Observation:
        if item is None or item in ({}, []):
            return self._absent(op, f"HTTP {code}: an empty reply ({json.dumps(item)})", evidence)
        if wants and not _matches(item, wants):
            return Observation(
                Seen.AMBIGUOUS,
                detail=f"HTTP {code}: the resource exists but does not carry this action's key",
                evidence=evidence,
            )
        return self._item(op, item, code, evidence)

    def _item(self, op: Operation, item: Any, code: int, evidence: dict[str, Any]) -> Observation:
        """This action's resource or item, read by the query's predicates."""
        q = op.query
        assert q is not None
        object_id = q.object_id.find(item, {}) if q.object_id is not None else None
        object_id = self._redact.clean(object_id) if object_id else None
        if q.applied is None:
            what = "the matching item exists" if q.match else "the resource exists (no predicate)"
            return Observation(Seen.APPLIED, object_id, f"HTTP {code}: {what}", evidence)
        if q.status is not None:
            found, value = q.status.find(item)
            if not found:
                return Observation(
                    Seen.UNKNOWN, detail=f"reply has no {q.status.text}", evidence=evidence
                )
            evidence["status"] = self._redact.value(value)
        seen = Reading(code, item)
        if q.applied.holds(seen):
            return Observation(Seen.APPLIED, object_id, self._said(q.applied, item), evidence)
        if q.not_applied is not None and q.not_applied.holds(seen):
            return Observation(
                Seen.NOT_APPLIED, object_id, self._said(q.not_applied, item), evidence
            )
        return Observation(
            Seen.NOT_YET, object_id, f"{self._said(q.applied, item)}, not terminal", evidence
        )

    def _absent(self, op: Operation, why: str, evidence: dict[str, Any]) -> Observation:
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
        sample = self._sample_key(op)
        key = reconciliation_key or (sample if op.spec.carries_key else None)
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
                "idempotency_key": ctx["idempotency_key"] if op.spec.dedupes_keys else None,
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
                f"{sample} stands for the reconciliation key settled generates at dispatch"
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


def _encode(body: Any, call: Call) -> tuple[bytes | None, str]:
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


def _same(value: Any, want: Any) -> bool:
    """The equality a match uses: a number in the reply equals the same number written
    as text in a template (``1042`` and ``"1042"``), and true is never 1."""
    if isinstance(value, bool) or isinstance(want, bool):
        return type(value) is type(want) and value == want
    if isinstance(value, int) and isinstance(want, str):
        return str(value) == want
    if isinstance(want, int) and isinstance(value, str):
        return str(want) == value
    return same(value, want)


def _matches(item: Any, wants: list[tuple[Path, Any]]) -> bool:
    for ptr, want in wants:
        found, value = ptr.find(item)
        if not found or not _same(value, want):
            return False
    return True


_LINK = re.compile(r"<([^>]*)>((?:\s*;\s*[^;,]*)*)")


def _link(headers: Mapping[str, str], rel: str) -> str | None:
    """The target of the ``Link`` header's (RFC 8288) relation ``rel``, or None."""
    raw = next((v for k, v in headers.items() if k.lower() == "link"), "")
    for m in _LINK.finditer(raw):
        for param in m.group(2).split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "rel" and rel in value.strip().strip('"').split():
                return m.group(1)
    return None
