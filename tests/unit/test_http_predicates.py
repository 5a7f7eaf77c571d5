"""The http provider's predicate grammar and the request and reply shapes added for
real APIs, on ``httpx.MockTransport`` (no network): what each reads, what it refuses at
load (one line naming the key), and what it never follows or sends."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from settled.errors import ConfigError, InvalidInput
from settled.providers.base import QueryTarget, Request, Seen
from settled.providers.http import HttpProvider

pytestmark = pytest.mark.ledger_free

Handler = Callable[[httpx.Request], httpx.Response]


def provider(
    handler: Handler, env: dict[str, str] | None = None, **op: Any
) -> tuple[HttpProvider, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return handler(request)

    conf = {
        "base_url": "https://api.example.com",
        "headers": {"Authorization": "Bearer main-token"},
        "operations": {"op": {"request": {"path": "/things"}, **op}},
    }
    client = httpx.Client(transport=httpx.MockTransport(record))
    return HttpProvider("api", conf, client, env or {}), seen


def send(p: HttpProvider, params: Any = None, key: str = "stl-k1") -> Any:
    return p.execute(Request("a1", "op", params or {"x": 1}, "a1:1", key, 1, 1.0))


def check(p: HttpProvider, key: str = "stl-k1", oid: str | None = None) -> Any:
    return p.query(QueryTarget("a1", "op", {"x": 1}, key, oid, None, 1))


def reply(body: Any, code: int = 200, **headers: str) -> Handler:
    return lambda r: httpx.Response(code, json=body, headers=headers)


MAILGUN = {
    "tier": "full",
    "object_id": "/id",
    "applied": {"path": "/event", "is": "delivered"},
    "not_applied": {
        "all": [{"path": "/event", "is": "failed"}, {"path": "/severity", "is": "permanent"}]
    },
}


@pytest.mark.parametrize(
    ("body", "applied"),
    [
        ({"id": "m", "event": "delivered"}, True),
        ({"id": "m", "event": "failed", "severity": "permanent"}, False),
        ({"id": "m", "event": "failed", "severity": "temporary"}, None),  # not final
        ({"id": "m"}, None),
    ],
)
def test_all_of_several_fields(body: Any, applied: bool | None) -> None:
    p, _ = provider(reply(body), **MAILGUN)
    assert send(p).applied is applied


def test_any_of_and_http_status_beside_a_path() -> None:
    p, _ = provider(
        reply({"error": {"code": "E7"}}, 422),
        tier="full",
        object_id="/id",
        maybe_applied={"any": [{"http_status": [422], "path": "/error/code", "is": "E7"}]},
    )
    r = send(p)
    assert r.maybe_applied is True and r.applied is None
    p, _ = provider(
        reply({"error": {"code": "E8"}}, 422),
        tier="full",
        object_id="/id",
        maybe_applied={"http_status": [422], "path": "/error/code", "is": "E7"},
    )
    assert send(p).maybe_applied is False  # another code: rule 3's rejection


def test_maybe_applied_outweighs_a_broad_not_applied() -> None:
    p, _ = provider(
        reply({"ok": False, "error": "internal_error"}),
        tier="full",
        object_id="/ts",
        status="/ok",
        applied=[True],
        not_applied=[False],
        maybe_applied={"path": "/error", "in": ["internal_error"]},
    )
    r = send(p)
    assert (r.applied, r.maybe_applied) == (None, True) and "maybe_applied" in r.detail


def test_jmespath_selects_an_element_by_name() -> None:
    items = [
        {"id": 1, "note_attributes": [{"name": "other", "value": "stl-k1"}]},
        {"id": 2, "note_attributes": [{"name": "settled_key", "value": "stl-k1"}]},
    ]
    p, _ = provider(
        reply({"orders": items}),
        tier="reconcilable",
        reconciliation_key_field="ref",
        query={
            "path": "/orders",
            "list": "/orders",
            "match": {"note_attributes[?name=='settled_key'].value | [0]": "{reconciliation_key}"},
            "object_id": "/id",
        },
    )
    obs = check(p)
    assert obs.seen is Seen.APPLIED and obs.object_id == "2"


def test_the_object_id_from_a_header_and_through_a_pattern() -> None:
    p, _ = provider(
        lambda r: httpx.Response(201, headers={"Location": "https://x/orders/981?v=2"}),
        tier="full",
        object_id={"header": "Location", "pattern": "/orders/([0-9]+)"},
    )
    r = send(p)
    assert (r.applied, r.object_id) == (True, "981")
    p, _ = provider(
        lambda r: httpx.Response(202, headers={"X-Message-Id": "abc"}),
        tier="partial",
        reconciliation_key_field="ref",
        object_id={"header": "X-Message-Id"},
    )
    assert send(p).object_id == "abc"


def test_a_query_on_another_host_sends_only_its_own_credentials() -> None:
    p, seen = provider(
        lambda r: httpx.Response(200, json={"items": [{"k": "a1:1", "s": "done"}]}),
        env={"OTHER": "other-token"},
        tier="reconcilable",
        idempotency_field="dedup",
        query={
            "base_url": "https://other.example.net",
            "auth": {"type": "bearer", "token": "${OTHER}"},
            "path": "/items",
            "list": "/items",
            "match": {"/k": "{idempotency_key}"},
            "status": "/s",
            "applied": ["done"],
        },
    )
    send(p)
    assert check(p).seen is Seen.APPLIED
    posted, queried = seen
    assert json.loads(posted.content)["dedup"] == "a1:1"
    assert posted.headers["authorization"] == "Bearer main-token"
    assert str(queried.url).startswith("https://other.example.net/items")
    assert queried.headers["authorization"] == "Bearer other-token"


LIST = {
    "tier": "reconcilable",
    "reconciliation_key_field": "ref",
    "status": "/s",
    "applied": ["done"],
}


def test_pages_are_bounded_and_a_next_link_to_another_host_is_not_followed() -> None:
    def pages(r: httpx.Request) -> httpx.Response:
        n = int(r.url.params.get("page", "1"))
        return httpx.Response(
            200,
            json={"data": [{"ref": f"other-{n}", "s": "done"}]},
            headers={"Link": f'<https://api.example.com/q?page={n + 1}>; rel="next"'},
        )

    q = {"path": "/q", "list": "/data", "match": "/ref", "pages": {"link": "next", "max": 3}}
    p, seen = provider(pages, **LIST, query=q)
    obs = check(p)
    assert obs.seen is Seen.UNKNOWN and "first 3 pages" in obs.detail and len(seen) == 3
    away = {"Link": '<https://evil.example/q?page=2>; rel="next"'}
    p, seen = provider(reply({"data": [{"ref": "x", "s": "done"}]}, **away), **LIST, query=q)
    obs = check(p)
    assert obs.seen is Seen.UNKNOWN and "another host" in obs.detail and len(seen) == 1


def test_a_cursor_is_sent_back_until_the_match_is_found() -> None:
    def pages(r: httpx.Request) -> httpx.Response:
        if r.url.params.get("cursor") == "c2":
            return httpx.Response(200, json={"data": [{"ref": "stl-k1", "s": "done"}]})
        return httpx.Response(200, json={"data": [{"ref": "x", "s": "done"}], "next": "c2"})

    q = {
        "path": "/q",
        "list": "/data",
        "match": "/ref",
        "pages": {"cursor": "/next", "param": "cursor"},
    }
    p, seen = provider(pages, **LIST, query=q)
    assert check(p).seen is Seen.APPLIED and [r.url.params.get("cursor") for r in seen] == [
        None,
        "c2",
    ]


def test_only_the_declared_not_found_reply_proves_absence() -> None:
    op = {
        **LIST,
        "query": {"path": "/q/{reconciliation_key}"},
        "not_found": "not_applied",
        "not_found_when": {"http_status": [404], "path": "/error/code", "is": "missing"},
    }
    p, _ = provider(reply({"error": {"code": "missing"}}, 404), **op)
    obs = check(p)
    assert obs.seen is Seen.NOT_APPLIED and obs.by_absence
    p, _ = provider(lambda r: httpx.Response(404, text="<html>no route</html>"), **op)
    obs = check(p)
    assert obs.seen is Seen.UNKNOWN and "not the declared not-found reply" in obs.detail


def test_a_secret_in_the_body_is_sent_and_masked() -> None:
    p, seen = provider(
        reply({}, 202),
        env={"ROUTING": "r0ut1ng-s3cret"},
        tier="partial",
        reconciliation_key_field="ref",
        request={"path": "/enqueue", "body": {"routing_key": "${ROUTING}", "x": "{params.x}"}},
    )
    send(p)
    assert json.loads(seen[0].content)["routing_key"] == "r0ut1ng-s3cret"
    shown = p.render("op", {"x": 1})
    assert (
        "r0ut1ng-s3cret" not in json.dumps(shown)
        and '"routing_key":"***"' in shown["request"]["body"]
    )


def test_a_key_format_is_checked_before_anything_is_recorded() -> None:
    p, _ = provider(
        reply({"id": "x"}),
        tier="full",
        object_id="/id",
        reconciliation_key_param="event_id",
        key_format={"alphabet": "base32hex", "min_length": 5, "max_length": 1024},
        request={"path": "/events", "body": {"id": "{reconciliation_key}"}},
    )
    p.check_params("op", {"event_id": "abcdev0123"})
    with pytest.raises(InvalidInput, match="may hold only base32hex characters, not 'wxyz'"):
        p.check_params("op", {"event_id": "wxyz0123"})
    p, _ = provider(
        reply({"id": "x"}),
        tier="full",
        object_id="/id",
        reconciliation_key_field="id",
        key_format={"alphabet": "base32hex"},
    )
    assert p.operations()["op"].key_format == "hex"  # generated keys fit it
    assert send(p, key="stl-0f").wire.value == "not_connected"  # an old key: never sent


@pytest.mark.parametrize(
    ("op", "key", "fix"),
    [
        (
            {"applied": {"path": "/a", "is": 1, "in": [1]}},
            "applied",
            "exactly one of is, in or exists",
        ),
        ({"applied": {"all": []}}, "applied.all", "non-empty list"),
        ({"applied": {"path": "a[", "is": 1}}, "applied.path", "JMESPath"),
        ({"applied": {"path": "/a", "equals": 1}}, "applied.equals", "unknown key"),
        ({"applied": ["x"]}, "applied", "`status`, which is not set"),
        ({"applied": {"http_status": [99]}}, "applied.http_status", "100-599"),
        (
            {"object_id": {"header": "X", "pattern": "a(b)(c)"}},
            "object_id.pattern",
            "exactly one group",
        ),
        (
            {
                "query": {
                    "path": "/q",
                    "list": "/d",
                    "match": "/r",
                    "pages": {"max": 500, "link": "next"},
                }
            },
            "query.pages.max",
            "1-100",
        ),
    ],
)
def test_mistakes_are_one_line_naming_the_key(op: dict[str, Any], key: str, fix: str) -> None:
    conf = {"tier": "full", "object_id": "/id", "reconciliation_key_field": "r", **op}
    with pytest.raises(ConfigError) as err:
        provider(reply({}), **conf)
    msg = str(err.value)
    assert msg.startswith(f"operations.op.{key}") and fix in msg and "\n" not in msg, msg
