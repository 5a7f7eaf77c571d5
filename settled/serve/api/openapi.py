"""The API's OpenAPI 3.1 description: the one source of truth for ``/api/v1``.

The document is built from the route table (``settled.serve.api.ENDPOINTS``, each with
its :class:`Operation`) and the schemas below. The same schemas validate request
bodies (``validator``), the suite fuzzes the API from the served document
(schemathesis) and checks every response against it, and docs/api.md is rendered
from it (``python -m settled.serve.api.apidoc``), so code, checks and docs cannot drift.

Records have the shape of the CLI's ``--json`` (``ActionRecord.to_json``), dispatch
and confirm answers that of ``dispatch.Report.to_json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ... import __version__
from ...model import MAX_ACTION_ID, RECORD_FIELDS, Status
from ...storage.columns import EVENT_COLUMNS, TABLE, Column

API_PREFIX = "/api/v1"
DOC_ID = "urn:settled:api:v1"  # where the validators find the document ($refs); OpenAPI 3.1
# allows no root `$id`, so the id is the registry's, never written into the document

STATUSES = [str(s) for s in Status]
OUTCOMES = ["dispatched", "recorded", "already_completed", "in_progress", "blocked", "not_found"]
RESULTS = ["succeeded", "accepted", "failed", "unresolved"]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema["type"]
    return {**schema, "type": [kind, "null"] if isinstance(kind, str) else [*kind, "null"]}


TIME = {
    "type": "string",
    "description": "UTC, ISO-8601 with a Z, fixed width (text order is time order)",
}
TIME_OR_NULL = _nullable(TIME)
TEXT_OR_NULL = {"type": ["string", "null"]}

ACTION_ID: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ACTION_ID,
    "description": (
        "The caller's id for one intended action: 1-200 printable characters, no "
        "surrounding spaces. Repeating it never sends twice. In a path it is one "
        "percent-encoded segment (encode '/' as %2F, '.' and '..' as %2E)."
    ),
    "examples": ["order-42-mail"],
}

# What a record field's column cannot say of it: its meaning, its bounds. Every other
# property follows from the ledger's column (``storage.columns``): a new field is here
# by itself.
_SAID: dict[str, dict[str, Any]] = {
    "params": {"description": "the params as recorded (a JSON object)"},
    "acceptance": {
        "description": (
            "whether the effect happened: ACCEPTED once observed or attested; not the "
            "report's result `accepted`, which means not yet observed"
        )
    },
    "eligible_at": {"description": "first automatic check; null: never (a person verifies)"},
    "attempt": {"minimum": 1},
    "checks": {"minimum": 0},
    "counted_checks": {"minimum": 0, "description": "checks that spent the budget"},
    "check_error": {"description": "why the last check could not be made"},
    "lands_by": {"description": "last moment this attempt could reach the provider"},
    "contradiction": {"description": "later evidence against a settled status"},
    "declared": {"type": ["object", "null"], "description": "the declaration that governs it"},
}


def _shape(column: Column) -> dict[str, Any]:
    """The JSON a record field holds, by the codec of its column."""
    kind = column.codec.kind
    shape: dict[str, Any]
    if column.codec.enum is not None:
        shape = {"type": "string", "enum": [str(v) for v in column.codec.enum]}
    elif kind == "time":
        shape = dict(TIME)
    elif kind in ("integer", "boolean"):
        shape = {"type": kind}
    elif kind == "json":
        return {}  # any JSON value (its field says which)
    else:
        shape = {"type": "string"}
    return _nullable(shape) if column.null else shape


_RECORD_PROPS: dict[str, Any] = {
    c.name: {**_shape(c), **_SAID.get(c.name, {})} for c in TABLE if c.name in RECORD_FIELDS
}
assert set(_RECORD_PROPS) == set(RECORD_FIELDS)

RECORD: dict[str, Any] = {
    "type": "object",
    "description": "An action record, as `settled show --json` prints it (without events).",
    "properties": _RECORD_PROPS,
    "required": list(RECORD_FIELDS),
}


def _with(
    base: str, description: str, props: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "description": description,
        "allOf": [{"$ref": f"#/components/schemas/{base}"}],
        "type": "object",
        "properties": props,
        "required": required,
    }


SCHEMAS: dict[str, Any] = {
    "ActionId": ACTION_ID,
    "Record": RECORD,
    "Report": _with(
        "Record",
        "What a dispatch, confirm or retry did (rule 8): the record as it now stands, the "
        "`outcome`, and the real `result` of a call this request made.",
        {
            "outcome": {"type": "string", "enum": OUTCOMES},
            "result": {"type": ["string", "null"], "enum": [*RESULTS, None]},
            "message": {"type": "string"},
        },
        ["outcome", "result", "message"],
    ),
    "Event": {
        "type": "object",
        "description": "One entry of an action's append-only event log.",
        "properties": {
            "id": {"type": "integer"},
            "action_id": {"type": "string"},
            "at": TIME,
            "actor": {
                "type": "string",
                "description": "who acted: api:TOKEN, operator:NAME, daemon:PID, ...",
            },
            "kind": {"type": "string"},
            "from_status": {"type": ["string", "null"]},
            "to_status": {"type": "string"},
            "attempt": {"type": "integer"},
            "detail": {"type": "object"},
        },
        "required": list(EVENT_COLUMNS),
    },
    "Shown": _with(
        "Record",
        "One action with its events, oldest first, as `settled show --json` prints it.",
        {
            "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
            "config_changes": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": (
                    "how today's config of the operation differs from what the action was "
                    "recorded with (null: nothing to compare)"
                ),
            },
        },
        ["events", "config_changes"],
    ),
    "Listed": _with(
        "Record",
        "A record of a listing, with what settles it next (as `settled queue --json`).",
        {"next": {"type": "string"}},
        ["next"],
    ),
    "EventsPage": {
        "type": "object",
        "description": "A page of the audit, newest first.",
        "properties": {
            "events": {
                "type": "array",
                "items": {
                    "allOf": [
                        {"$ref": "#/components/schemas/Event"},
                        {
                            "type": "object",
                            "properties": {
                                "person": {"type": ["string", "null"]},
                                "via": {"type": ["string", "null"]},
                                "said": {"type": "string"},
                            },
                            "required": ["person", "via", "said"],
                        },
                    ]
                },
            },
            "count": {"type": "integer", "description": "events in `events`"},
            "next": {
                "type": ["integer", "null"],
                "description": "the `cursor` of the next page; null on the last",
            },
        },
        "required": ["events", "count", "next"],
    },
    "Listing": {
        "type": "object",
        "properties": {
            "actions": {"type": "array", "items": {"$ref": "#/components/schemas/Listed"}},
            "count": {"type": "integer", "description": "records in `actions`"},
            "total": {
                "type": "integer",
                "description": "records the selectors match (more than `count` when `limit` cut the list)",
            },
            "next_cursor": {
                "type": ["string", "null"],
                "description": "`after` for the next page; null on the last page",
            },
        },
        "required": ["actions", "count", "total", "next_cursor"],
    },
    "Change": {
        "type": "object",
        "properties": {
            "at": TIME_OR_NULL,
            "action_id": {"type": "string"},
            "from": {"type": "string"},
            "to": {"type": "string"},
            "kind": {"type": "string"},
            "reason": {"type": "string"},
            "next_check_at": TIME_OR_NULL,
            "seen": {"type": ["string", "null"]},
        },
        "required": ["action_id", "from", "to", "kind", "reason"],
    },
    "Reconciled": {
        "type": "object",
        "description": "The check's report (as `settled reconcile ID --json`) and the record afterwards.",
        "properties": {
            "examined": {"type": "integer"},
            "changes": {"type": "array", "items": {"$ref": "#/components/schemas/Change"}},
            "waiting": {"type": "array", "items": {"$ref": "#/components/schemas/Change"}},
            "skipped": {"type": "array", "items": {"$ref": "#/components/schemas/Change"}},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "stopped": {"type": "boolean"},
            "record": {"$ref": "#/components/schemas/Record"},
        },
        "required": ["examined", "changes", "waiting", "skipped", "counts", "stopped", "record"],
    },
    "Stats": {
        "type": "object",
        "description": (
            "Records by status × provider × operation, from the counts every write keeps "
            "in its own transaction: one read, one snapshot, no scan of the records."
        ),
        "properties": {
            "total": {"type": "integer"},
            "by_status": {"type": "object", "additionalProperties": {"type": "integer"}},
            "counts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string", "enum": STATUSES},
                        "provider": {"type": "string"},
                        "operation": {"type": "string"},
                        "count": {"type": "integer", "minimum": 1},
                    },
                    "required": ["status", "provider", "operation", "count"],
                },
            },
        },
        "required": ["total", "by_status", "counts"],
    },
    "Problem": {
        "type": "object",
        "description": "An error (RFC 9457).",
        "properties": {
            "type": {"type": "string", "description": "urn:settled:problem:SLUG"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {
                "type": "string",
                "description": "one line saying what was wrong and how to fix it",
            },
            "action_id": {"type": "string"},
            "record_status": {
                "type": "string",
                "description": "a verdict or retry refused because the check made first saw "
                "the effect (rule 14): the status that evidence settled the action in",
            },
        },
        "required": ["type", "title", "status", "detail"],
    },
    "DispatchRequest": {
        "type": "object",
        "properties": {
            "provider": {"type": "string", "minLength": 1, "maxLength": 200},
            "operation": {"type": "string", "minLength": 1, "maxLength": 200},
            "action_id": {"$ref": "#/components/schemas/ActionId"},
            "params": {"type": "object", "default": {}, "description": "the operation's params"},
            "needs_confirmation": {
                "type": "boolean",
                "default": False,
                "description": "record only: POST .../confirm sends it (also when the operation declares it)",
            },
        },
        "required": ["provider", "operation", "action_id"],
        "additionalProperties": False,
    },
    "ResolveRequest": {
        "type": "object",
        "properties": {
            "applied": {
                "type": "boolean",
                "description": "true: the effect happened; false: it did not",
            },
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 2000,
                "description": "how you know",
            },
            "evidence": {
                "type": ["string", "null"],
                "maxLength": 2000,
                "description": "a reference: ticket, log line, URL",
            },
            "object_id": {
                "type": ["string", "null"],
                "maxLength": 500,
                "description": "the provider's id for the effect",
            },
            "by": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": 100,
                "description": (
                    "the person the token vouches for (the event's actor is operator:BY via "
                    "api:TOKEN, and it keeps `person` and `via` apart); 422 when it holds "
                    "' via ' or a control or invisible character"
                ),
            },
            "no_recheck": {
                "type": "boolean",
                "default": False,
                "description": "record the verdict without one more check of the provider (rule 14)",
            },
        },
        "required": ["applied", "reason"],
        "additionalProperties": False,
    },
    "RetryRequest": {
        "type": "object",
        "properties": {
            "no_recheck": {
                "type": "boolean",
                "default": False,
                "description": "open the attempt without one more check of the provider (rule 14)",
            },
        },
        "additionalProperties": False,
    },
    "Empty": {"type": "object", "additionalProperties": False, "maxProperties": 0},
}

ERRORS = {
    400: "The body is not JSON, or not UTF-8.",
    401: "No token, a wrong one, or a token in the query string.",
    403: "The token lacks the role for this route; or a write from another origin.",
    413: "The body is larger than `[serve] max_body`.",
    415: "A body that is not `application/json`.",
    421: "A Host header this service does not answer to.",
    422: "Input that can never work (a field, a query parameter, an id): the detail says which and why.",
    503: (
        "The ledger is busy or unavailable (nothing was changed, unless the detail says the "
        "request was sent); retry later."
    ),
}


@dataclass(frozen=True)
class Operation:
    """One route's description: what the table says about it, and what it answers."""

    method: str
    path: str  # under /api/v1, OpenAPI style: /actions/{id}
    operation_id: str
    summary: str
    description: str
    roles: tuple[str, ...]  # any of these may call it; (): readable without a token
    responses: dict[int, tuple[str, str | None]]  # status -> (description, schema name)
    request: str | None = None  # schema name of the JSON body
    body_required: bool = False
    query: list[dict[str, Any]] = field(default_factory=list)
    errors: tuple[int, ...] = (400, 401, 403, 413, 415, 421, 422, 503)


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "description": op.description,
        "tags": ["actions" if op.path.startswith("/actions") else "service"],
    }
    params = list(op.query)
    if "{id}" in op.path:
        params.insert(
            0,
            {
                "name": "id",
                "in": "path",
                "required": True,
                "description": "The action id, percent-encoded as one path segment.",
                "schema": {"$ref": "#/components/schemas/ActionId"},
            },
        )
    if params:
        out["parameters"] = params
    if op.request:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{op.request}"}}
            },
        }
    responses: dict[str, Any] = {}
    for code, (text, schema) in sorted(op.responses.items()):
        entry: dict[str, Any] = {"description": text}
        if schema is not None:
            kind = "application/problem+json" if schema == "Problem" else "application/json"
            entry["content"] = {kind: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
        responses[str(code)] = entry
    for code in op.errors:
        if not op.roles and code in (401, 403):
            continue
        if not op.request and code in (400, 413, 415):
            continue
        responses.setdefault(
            str(code),
            {
                "description": ERRORS[code],
                "content": {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                },
            },
        )
    out["responses"] = dict(sorted(responses.items()))
    out["security"] = [{"bearer": []}] if op.roles else []
    if op.roles:
        out["x-settled-roles"] = list(op.roles)
    return out


def document(operations: Iterable[Operation]) -> dict[str, Any]:
    """The OpenAPI 3.1 document for these operations."""
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "settled API",
            "version": __version__,
            "summary": "An honest ledger for side effects: never 'done' before the effect is observed.",
            "description": (
                "JSON for apps, served by `settled serve` under /api/v1. Records have the shape "
                "of the CLI's `--json`. Every call but this description needs "
                "`Authorization: Bearer TOKEN` (a token of `[serve.tokens.NAME]`); roles: read "
                "(GET), dispatch (POST /actions, confirm), operate (confirm, resolve, retry, "
                "reconcile); dispatch and operate include read. Errors are "
                "application/problem+json (RFC 9457). Every answer but this description "
                "carries `Cache-Control: no-store` (records hold params); this one may be "
                "cached for five minutes."
            ),
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": API_PREFIX}],
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "A token of [serve.tokens.NAME], in the Authorization header only "
                        "(never in the URL)."
                    ),
                }
            },
        },
    }


class Validators:
    """JSON-schema validators for the document's request bodies (``$ref``s resolved
    against the document itself)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        from jsonschema import Draft202012Validator
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        resource = Resource.from_contents(doc, default_specification=DRAFT202012)
        registry: Registry[Any] = Registry().with_resource(DOC_ID, resource)
        self._made: dict[str, Any] = {}
        self._cls = Draft202012Validator
        self._registry = registry

    def errors(self, schema: str, instance: Any) -> str:
        """Why ``instance`` does not match ``schema`` ("" when it does): one line,
        naming where in the body."""
        from jsonschema import exceptions

        v = self._made.get(schema)
        if v is None:
            v = self._cls(
                {"$ref": f"{DOC_ID}#/components/schemas/{schema}"}, registry=self._registry
            )
            self._made[schema] = v
        error = exceptions.best_match(v.iter_errors(instance))
        if error is None:
            return ""
        where = "/".join(str(p) for p in error.absolute_path)
        message = error.message
        if len(message) > 300:
            message = message[:300] + "…"
        return f"{where or 'body'}: {message}"


__all__ = ["API_PREFIX", "SCHEMAS", "Operation", "Validators", "document"]
