"""The ``sim`` provider: an httpx client for :mod:`settled.providers.sim_server`.

It declares one operation per tier (and a snapshotting ``set``), puts each request on
the wire once, and reports only what the wire showed (``base.py``). Reply bodies are
read up to :data:`settled.providers._wire.MAX_BODY` bytes; a larger reply is left unread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from .. import crashpoints
from ..checks import number
from ..errors import ConfigError, InvalidInput, UnknownProvider
from ..model import Tier
from ._wire import Exchange, build, excerpt, exchange, header_value, parse_json, show
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

# key -> (accepted types, description for the error message, default)
_CONF: dict[str, tuple[tuple[type, ...], str, Any]] = {
    "base_url": ((str,), 'a URL string, e.g. base_url = "http://127.0.0.1:8080"', None),
    "dedupe": ((bool,), "true or false", False),
    "timeout": ((int, float), "a number of seconds > 0, e.g. timeout = 5.0", 5.0),
    "consistency_window": ((int, float), "a number of seconds >= 0, e.g. 30", 30.0),
    "attempts": ((int,), "a whole number >= 1, e.g. attempts = 3", 3),
    "verify_interval": ((int, float), "a number of seconds > 0, e.g. 2", 2.0),
    "verify_deadline": ((int, float), "a number of seconds > 0, e.g. 300", 300.0),
    "verify_min_checks": ((int,), "a whole number >= 1, e.g. 3", 3),
}
_NUMBERS = (
    "timeout",
    "consistency_window",
    "attempts",
    "verify_interval",
    "verify_deadline",
    "verify_min_checks",
)
_POSITIVE = ("timeout", "verify_interval", "verify_deadline")
_WHOLE = ("attempts", "verify_min_checks")
# ``verify = { interval, deadline, min_checks }``, as the other provider types write it;
# the flat ``verify_*`` keys stay the same settings.
_VERIFY = {
    "interval": "verify_interval",
    "deadline": "verify_deadline",
    "min_checks": "verify_min_checks",
}


def _verify_table(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with a ``verify`` table spelled as its flat keys."""
    if "verify" not in conf:
        return dict(conf)
    table = conf["verify"]
    if not isinstance(table, Mapping) or set(table) - set(_VERIFY):
        raise ConfigError(
            "verify: must be a table like verify = { interval = 2, deadline = 300, min_checks = 3 }"
        )
    out = {k: v for k, v in conf.items() if k != "verify"}
    for short, flat in _VERIFY.items():
        if short in table:
            if flat in conf:
                raise ConfigError(f"verify.{short} and {flat} are the same setting; keep one")
            out[flat] = table[short]
    return out


def _settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``conf``: a one-line ConfigError naming the key and the fix. The
    registry prefixes the message with where the section lives (``providers.NAME``)."""
    unknown = sorted(set(conf) - set(_CONF) - {"verify"})
    if unknown:
        allowed = ", ".join([*_CONF, "verify"])
        raise ConfigError(f"unknown key {unknown[0]!r}; remove it (allowed: {allowed})")
    conf = _verify_table(conf)
    if "base_url" not in conf:
        raise ConfigError('base_url is missing; add base_url = "http://127.0.0.1:PORT"')
    out: dict[str, Any] = {}
    for key, (types, fix, default) in _CONF.items():
        value = conf.get(key, default)
        if key in _NUMBERS:
            try:
                out[key] = number(key, value, positive=key in _POSITIVE, whole=key in _WHOLE)
            except ConfigError as exc:
                raise ConfigError(f"{exc}; use {fix}") from None
            if key in _WHOLE:
                out[key] = int(value)
            continue
        wrong = not isinstance(value, types)
        if not wrong and key == "base_url":
            try:
                url = httpx.URL(value)
                wrong = not value.startswith(("http://", "https://")) or not url.host
            except (httpx.InvalidURL, ValueError, TypeError):
                wrong = True
        if wrong:
            raise ConfigError(f"{key} = {value!r} is invalid; use {fix}")
        out[key] = value
    out["base_url"] = out["base_url"].rstrip("/")
    return out


def create(name: str, conf: Mapping[str, Any], client: httpx.Client) -> SimProvider:
    return SimProvider(name, _settings(conf), client)


class SimProvider(BaseProvider):
    def __init__(self, name: str, settings: Mapping[str, Any], client: httpx.Client) -> None:
        self.name = name
        self._base = settings["base_url"]
        self._timeout = float(settings["timeout"])
        self._client = client
        common: dict[str, Any] = {
            "consistency_window": float(settings["consistency_window"]),
            "attempts": settings["attempts"],
            "dedupes_keys": settings["dedupe"],
            "timeout": self._timeout,
            "verify_interval": float(settings["verify_interval"]),
            "verify_deadline": float(settings["verify_deadline"]),
            "verify_min_checks": settings["verify_min_checks"],
        }
        effects = "GET /v1/effects/{reconciliation_key}"
        self._ops = {
            "book": OperationSpec(
                "book",
                Tier.FULL,
                queryable=True,
                carries_key=True,
                predicate=True,
                verifies=effects,
                proof='201 {"status": "booked"}',
                **common,
            ),
            "send": OperationSpec(
                "send",
                Tier.RECONCILABLE,
                queryable=True,
                carries_key=True,
                predicate=True,
                verifies=effects,
                **common,
            ),
            "deliver": OperationSpec(
                "deliver",
                Tier.PARTIAL,
                carries_key=True,
                verifies="a person: the receipt proves delivery only",
                **common,
            ),
            "notify": OperationSpec("notify", Tier.BLIND, verifies="nothing can", **common),
            "set": OperationSpec(
                "set",
                Tier.RECONCILABLE,
                queryable=True,
                snapshots=True,
                predicate=True,
                verifies="GET /v1/settings/{name}, compared with the snapshot",
                **common,
            ),
        }

    def operations(self) -> Mapping[str, OperationSpec]:
        return self._ops

    # -- execute ----------------------------------------------------------------------

    def execute(self, request: Request) -> WireResult:
        if request.operation not in self._ops:
            raise UnknownProvider(f"{self.name} has no operation {request.operation!r}")
        body = {
            "action_id": request.action_id,
            "reconciliation_key": request.reconciliation_key,
            "params": request.params,
        }
        ex = exchange(
            self._client,
            "POST",
            f"{self._base}/v1/{request.operation}",
            timeout=request.timeout,
            send_by=request.send_by,
            headers={"Idempotency-Key": header_value(request.idempotency_key)},
            json_body=body,
            extensions=_AFTER_SEND if crashpoints.armed() else {},
        )
        if ex.wire is not Wire.ANSWERED:
            return WireResult(ex.wire, detail=ex.problem, written_at=ex.written_at)
        return _answered(request.operation, ex)

    def render(
        self,
        operation: str,
        params: Any,
        *,
        action_id: str = "ACTION-ID",
        attempt: int = 1,
        reconciliation_key: str | None = None,
        provider_object_id: str | None = None,
    ) -> dict[str, Any]:
        """The request ``execute`` would send; sends nothing."""
        spec = self._ops.get(operation)
        if spec is None:
            raise UnknownProvider(f"{self.name} has no operation {operation!r}")
        key = reconciliation_key or ("stl-KEY" if spec.carries_key else None)
        req = build(
            self._client,
            "POST",
            f"{self._base}/v1/{operation}",
            headers={"Idempotency-Key": header_value(f"{action_id}:{attempt}")},
            json_body={"action_id": action_id, "reconciliation_key": key, "params": params},
        )
        if isinstance(req, str):
            raise InvalidInput(f"{self.name}.{operation}: {req}")
        query = None
        if operation in ("book", "send") and key:
            query = {
                **show(
                    self._client.build_request(
                        "GET", f"{self._base}/v1/effects/{quote(key, safe='')}"
                    )
                ),
                "proves": spec.verifies,
            }
        return {
            "provider": self.name,
            "operation": operation,
            "tier": str(spec.tier),
            "reconciliation_key": key,
            "idempotency_key": f"{action_id}:{attempt}",
            "request": show(req),
            "query": query,
            "notes": [],
        }

    # -- query and snapshot -------------------------------------------------------------

    def query(self, target: QueryTarget) -> Observation:
        op = target.operation
        if op in ("book", "send"):
            return self._query_effect(target)
        if op == "set":
            return self._query_setting(target)
        return Observation(Seen.UNKNOWN, detail=f"{self.name}.{op} has no query")

    def snapshot(self, operation: str, params: Any) -> Any:
        if operation != "set":
            return None
        name = _setting_name(params)
        if name is None:
            return {"error": 'params lack a "name" string'}
        value, error = self._read_setting(name)
        return {"error": error} if error else {"value": value}

    def _query_effect(self, target: QueryTarget) -> Observation:
        if target.reconciliation_key is None:
            return Observation(Seen.UNKNOWN, detail="no reconciliation key to query")
        url = f"{self._base}/v1/effects/{quote(target.reconciliation_key, safe='')}"
        code, body, error = self._get(url)
        evidence = {"status_code": code, "body": body}
        if error:
            return Observation(Seen.UNKNOWN, detail=error, evidence=evidence)
        if code == 404:
            return Observation(Seen.NOT_YET, detail="no effect visible yet", evidence=evidence)
        status = body.get("status") if isinstance(body, dict) else None
        if code == 200 and status in ("applied", "delivered"):
            oid = body.get("id") if isinstance(body.get("id"), str) else None
            return Observation(Seen.APPLIED, oid, f"effect {status}", evidence)
        if code == 200 and status == "bounced":
            return Observation(Seen.NOT_APPLIED, detail="bounced", evidence=evidence)
        return Observation(Seen.UNKNOWN, detail=f"unexpected reply HTTP {code}", evidence=evidence)

    def _query_setting(self, target: QueryTarget) -> Observation:
        name = _setting_name(target.params)
        if name is None:
            return Observation(Seen.UNKNOWN, detail='params lack a "name" string')
        desired = target.params.get("value")
        now, error = self._read_setting(name)
        evidence: dict[str, Any] = {"value": now, "snapshot": target.snapshot}
        if error:
            return Observation(Seen.UNKNOWN, detail=error, evidence=evidence)
        snap = target.snapshot
        if not (isinstance(snap, Mapping) and "value" in snap):
            # No trustworthy "before": a matching value cannot be attributed to us.
            if now == desired:
                detail = f"value is {desired!r} but there is no snapshot: cannot attribute"
                return Observation(Seen.AMBIGUOUS, detail=detail, evidence=evidence)
            detail = f"value is {now!r}, not yet {desired!r} (no snapshot to compare)"
            return Observation(Seen.NOT_YET, detail=detail, evidence=evidence)
        before = snap["value"]
        if before == desired:
            detail = f"value was already {desired!r} before dispatch: cannot attribute"
            return Observation(Seen.AMBIGUOUS, detail=detail, evidence=evidence)
        if now == desired:
            return Observation(Seen.APPLIED, detail=f"changed to {desired!r}", evidence=evidence)
        if now == before:
            return Observation(Seen.NOT_YET, detail=f"still {now!r}", evidence=evidence)
        detail = f"changed to {now!r}, not to {desired!r}: someone else changed it"
        return Observation(Seen.AMBIGUOUS, detail=detail, evidence=evidence)

    def _read_setting(self, name: str) -> tuple[Any, str]:
        code, body, error = self._get(f"{self._base}/v1/settings/{quote(name, safe='')}")
        if error:
            return None, error
        if code != 200 or not isinstance(body, dict) or "value" not in body:
            return None, f"unexpected reply HTTP {code}"
        return body["value"], ""

    def _get(self, url: str) -> tuple[int | None, Any, str]:
        """``(status_code, parsed body, error)``; error is "" when the body is JSON."""
        ex = exchange(self._client, "GET", url, timeout=self._timeout)
        if ex.wire is not Wire.ANSWERED:
            return None, None, ex.problem
        if ex.body is None:
            return ex.status_code, None, ex.problem
        body, problem = parse_json(ex.body)
        return ex.status_code, body, problem


def _after_send_trace(event: str, info: Mapping[str, Any]) -> None:
    if event == "http11.send_request_body.complete":
        crashpoints.hit("after_send")  # request written, reply not read


# The ``after_send`` crash point (settled.crashpoints) sits inside httpcore, via its
# trace hook; with no probe armed, no hook is installed at all.
_AFTER_SEND: dict[str, Any] = {"trace": _after_send_trace}


def _answered(op: str, ex: Exchange) -> WireResult:
    """A status line came back: report it; never fail because of the body."""
    code = ex.status_code or 0
    raw = ex.body
    notes = [f"HTTP {code}"]
    body: Any = None
    if raw is None:
        notes.append(ex.problem)
    elif raw:
        body, problem = parse_json(raw)
        if problem:
            notes.append(problem)
        elif not 200 <= code < 300:
            notes.append(f"body: {excerpt(raw)}")
    object_id = None
    if isinstance(body, dict):
        found = body.get("id", body.get("receipt"))
        object_id = found if isinstance(found, str) else None
    # Only a booking's 201 "booked" proves the effect; every other reply proves nothing.
    proved = (
        op == "book" and code == 201 and isinstance(body, dict) and body.get("status") == "booked"
    )
    return WireResult(
        Wire.ANSWERED,
        status_code=code,
        object_id=object_id,
        applied=True if proved else None,
        detail="; ".join(notes),
        written_at=ex.written_at,
        retry_after=ex.retry_after,
    )


def _setting_name(params: Any) -> str | None:
    name = params.get("name") if isinstance(params, Mapping) else None
    return name if isinstance(name, str) else None
