"""The ``http`` provider's request shapes, queries and secrets, checked against the
exact request on the wire (``httpx.MockTransport``: no network)."""

from __future__ import annotations

import base64
import json
import secrets
import string
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest

from settled.errors import ConfigError, InvalidInput
from settled.providers import Registry
from settled.providers.base import QueryTarget, Request, Seen, Wire
from settled.providers.http import HttpProvider

pytestmark = pytest.mark.ledger_incidental

Handler = Callable[[httpx.Request], httpx.Response]


def provider(
    handler: Handler,
    env: dict[str, str] | None = None,
    provider_keys: dict[str, Any] | None = None,
    **op: Any,
) -> tuple[HttpProvider, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return handler(request)

    conf: dict[str, Any] = {
        "base_url": "https://api.example.com/v1",
        **(provider_keys or {}),
        "operations": {"op": {"tier": "reconcilable", "request": {"path": "/things"}, **op}},
    }
    spec = conf["operations"]["op"]
    if spec["tier"] == "full" and not {"object_id", "applied", "query"} & set(op):
        # A 2xx by itself proves nothing (rule 19): the replies here carry the id.
        spec["object_id"] = "/id"
    if spec["tier"] == "reconcilable":
        if not {"reconciliation_key_field", "reconciliation_key_param"} & set(op):
            spec["reconciliation_key_field"] = "ref"
        spec.setdefault("query", {"path": "/things/{reconciliation_key}"})
    client = httpx.Client(transport=httpx.MockTransport(record))
    return HttpProvider("api", conf, client, env or {}), seen


def req(
    params: Any = None, key: str | None = "stl-k1", aid: str = "a1", attempt: int = 1
) -> Request:
    return Request(
        aid, "op", {"x": 1} if params is None else params, f"{aid}:{attempt}", key, attempt, 1.0
    )


def target(params: Any = None, key: str | None = "stl-k1", oid: str | None = None) -> QueryTarget:
    return QueryTarget("a1", "op", {"x": 1} if params is None else params, key, oid, None, 1)


def ok(body: Any = None, code: int = 200) -> Handler:
    return lambda r: httpx.Response(code, json=body if body is not None else {"id": "o1"})


# -- request shape ---------------------------------------------------------------------------


def test_body_template_wraps_params_and_puts_the_key_at_a_pointer() -> None:
    p, seen = provider(
        ok(),
        request={"method": "POST", "path": "/things", "body": {"row": "{params}"}},
        reconciliation_key_field="/row/ref",
    )
    p.check_params("op", {"name": "n"})
    r = p.execute(req({"name": "n"}))
    assert r.wire is Wire.ANSWERED
    [sent] = seen
    assert json.loads(sent.content) == {"row": {"name": "n", "ref": "stl-k1"}}
    assert sent.headers["content-type"] == "application/json"


def test_placeholders_keep_types_whole_and_become_text_inside_strings() -> None:
    p, seen = provider(
        ok(),
        tier="full",
        request={
            "path": "/orders/{params.id}/items",
            "query": {
                "expand": ["a", "b"],
                "ref": "{reconciliation_key}",
                "note": "{params.note?}",
            },
            "headers": {"X-Action": "{action_id}", "X-Version": "2024-06-20"},
            "body": {
                "amount": "{params.amount}",
                "label": "order {params.id} try {attempt}",
                "key": "{idempotency_key}",
                "maybe": "{params.missing?}",
                "literal": "{{not a placeholder}}",
            },
        },
    )
    p.execute(req({"id": "o 7", "amount": 1250}))
    [sent] = seen
    assert sent.url.raw_path == b"/v1/orders/o%207/items?expand=a&expand=b&ref=stl-k1"
    assert sent.headers["X-Action"] == "a1" and sent.headers["X-Version"] == "2024-06-20"
    assert json.loads(sent.content) == {
        "amount": 1250,
        "label": "order o 7 try 1",
        "key": "a1:1",
        "literal": "{not a placeholder}",
    }


def test_form_encoding_with_nested_keys_and_the_key_at_a_form_path() -> None:
    p, seen = provider(
        ok(),
        request={
            "path": "/refunds",
            "encoding": "form",
            "body": {
                "charge": "{params.charge}",
                "metadata": {"order": "{params.order}"},
                "items": [{"p": 1}],
            },
        },
        reconciliation_key_field="metadata[settled_key]",
    )
    p.execute(req({"charge": "ch_1", "order": 42}))
    [sent] = seen
    assert sent.headers["content-type"] == "application/x-www-form-urlencoded"
    assert parse_qsl(sent.content.decode()) == [
        ("charge", "ch_1"),
        ("metadata[order]", "42"),
        ("metadata[settled_key]", "stl-k1"),
        ("items[0][p]", "1"),
    ]


@pytest.mark.parametrize(
    ("lists", "pairs"),
    [
        ("indexed", [("To", "a"), ("M[0]", "x"), ("M[1]", "y")]),
        ("brackets", [("To", "a"), ("M[]", "x"), ("M[]", "y")]),
        ("repeat", [("To", "a"), ("M", "x"), ("M", "y")]),
    ],
)
def test_form_lists(lists: str, pairs: list[tuple[str, str]]) -> None:
    p, seen = provider(
        ok(), tier="full", request={"path": "/m", "encoding": "form", "form_lists": lists}
    )
    p.execute(req({"To": "a", "M": ["x", "y"]}))
    assert parse_qsl(seen[0].content.decode()) == pairs


def test_a_param_where_the_key_goes_is_refused_at_record_time_never_overwritten() -> None:
    p, seen = provider(ok(), reconciliation_key_field="client_reference")
    with pytest.raises(InvalidInput, match=r"client_reference.*never overwrites"):
        p.check_params("op", {"client_reference": "mine"})
    r = p.execute(req({"client_reference": "mine"}))  # a config changed since recording
    assert r.wire is Wire.NOT_CONNECTED and r.detail.startswith("not sent:") and seen == []


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "a\\b"])
def test_a_value_that_would_address_another_resource_is_refused(value: str) -> None:
    p, seen = provider(ok(), request={"path": "/things/{params.id}"})
    with pytest.raises(InvalidInput, match="another resource"):
        p.check_params("op", {"id": value})
    r = p.execute(req({"id": value}))
    assert r.wire is Wire.NOT_CONNECTED and "another resource" in r.detail and seen == []


@pytest.mark.parametrize("oid", ["..", ".", "a/b", ""])
def test_a_query_never_reads_another_resource(oid: str) -> None:
    p, seen = provider(
        ok({"status": "delivered"}),
        object_id="/id",
        query={"path": "/messages/{provider_object_id}"},
        status="/status",
        applied=["delivered"],
    )
    o = p.query(target(oid=oid))
    assert o.seen is Seen.UNKNOWN and seen == []


def test_missing_params_are_refused_before_anything_is_recorded() -> None:
    p, _ = provider(ok(), request={"path": "/t", "body": {"a": "{params.amount}"}})
    with pytest.raises(InvalidInput, match="params need 'amount'"):
        p.check_params("op", {"x": 1})
    assert p.operations()["op"].params_schema == {
        "type": "object",
        "properties": {"amount": {}},
        "required": ["amount"],
    }


def test_auth_bearer_and_basic_from_the_environment() -> None:
    p, seen = provider(
        ok(),
        env={"TOK": "t0ken-abc"},
        provider_keys={"auth": {"type": "bearer", "token": "${TOK}"}},
    )
    p.execute(req())
    assert seen[0].headers["authorization"] == "Bearer t0ken-abc"
    p, seen = provider(
        ok(),
        env={"U": "acct", "PW": "pa55:word"},
        provider_keys={"auth": {"type": "basic", "username": "${U}", "password": "${PW}"}},
    )
    p.execute(req())
    assert (
        seen[0].headers["authorization"] == "Basic " + base64.b64encode(b"acct:pa55:word").decode()
    )


def test_a_business_id_is_the_key_on_every_attempt() -> None:
    p, seen = provider(
        ok([{"order_number": "A-1042", "status": "paid"}]),
        reconciliation_key_param="order_number",
        idempotency_header="Idempotency-Key",
        query={
            "path": "/orders",
            "query": {"order_number": "{reconciliation_key}"},
            "list": "",
            "match": "/order_number",
        },
        status="/status",
        applied=["paid"],
    )
    spec = p.operations()["op"]
    assert spec.key_param == "order_number" and spec.carries_key and spec.predicate
    with pytest.raises(InvalidInput, match="order_number"):
        p.check_params("op", {"amount": 1})
    p.execute(req({"order_number": "A-1042"}, key="stl-generated", attempt=2))
    assert json.loads(seen[0].content) == {"order_number": "A-1042"}
    o = p.query(target({"order_number": "A-1042"}, key="stl-generated"))
    assert o.seen is Seen.APPLIED
    assert seen[1].url.raw_path == b"/v1/orders?order_number=A-1042"


# -- conflicts and replies ----------------------------------------------------------------------


def test_a_declared_conflict_is_reported_never_proof() -> None:
    p, _ = provider(
        ok({"error": "duplicate"}, code=409),
        tier="full",
        conflict_statuses=[409],
        reconciliation_key_field="ref",
        query={"path": "/things/{reconciliation_key}"},
        backoff=1.5,
    )
    r = p.execute(req())
    assert (r.status_code, r.conflict, r.applied) == (409, True, None)
    assert p.operations()["op"].conflict_statuses == (409,) and p.operations()["op"].backoff == 1.5


def test_reasons_never_carry_raw_newlines_or_escapes() -> None:
    body = b"line one\nline two\r\n\x1b[2J\x1b[Hcleared \xe2\x80\xae"
    p, _ = provider(lambda r: httpx.Response(500, content=body), tier="full")
    r = p.execute(req())
    assert "\n" not in r.detail and "\r" not in r.detail and "\x1b" not in r.detail
    assert "\u202e" not in r.detail and "line one\\nline two" in r.detail


# -- queries (rule 10) ----------------------------------------------------------------------------

SEARCH = {
    "query": {
        "path": "/messages",
        "query": {"ref": "{reconciliation_key}"},
        "list": "/data",
        "match": "/ref",
    },
    "status": "/state",
    "applied": ["delivered"],
    "not_applied": ["bounced"],
}


@pytest.mark.parametrize(
    ("data", "seen"),
    [
        ([], Seen.NOT_YET),
        ([{"ref": "other", "state": "delivered"}], Seen.NOT_YET),  # the server ignored the filter
        ([{"ref": "stl-k1", "state": "delivered"}], Seen.APPLIED),
        ([{"ref": "stl-k1", "state": "bounced"}], Seen.NOT_APPLIED),
        ([{"ref": "stl-k1", "state": "queued"}], Seen.NOT_YET),
        (
            [{"ref": "stl-k1", "state": "delivered"}, {"ref": "stl-k1", "state": "delivered"}],
            Seen.AMBIGUOUS,
        ),
    ],
)
def test_a_search_counts_only_the_one_matching_item(data: list[Any], seen: Seen) -> None:
    p, sent = provider(ok({"data": data}), reconciliation_key_field="ref", **SEARCH)
    assert p.query(target()).seen is seen
    assert sent[0].url.raw_path == b"/v1/messages?ref=stl-k1"


@pytest.mark.parametrize("body", [None, {}, []])
def test_an_empty_reply_is_not_found(body: Any) -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(body).encode())

    for not_found, seen in (("pending", Seen.NOT_YET), ("not_applied", Seen.NOT_APPLIED)):
        shape = {"not_found_when": {"http_status": [404]}} if not_found == "not_applied" else {}
        p, _ = provider(
            handler, query={"path": "/things/{reconciliation_key}"}, not_found=not_found, **shape
        )
        assert p.query(target()).seen is seen


def test_an_existence_check_without_a_predicate_is_allowed_and_marked() -> None:
    p, _ = provider(ok({"id": "o1"}), query={"path": "/things/{reconciliation_key}"})
    assert p.query(target()).seen is Seen.APPLIED
    assert p.operations()["op"].predicate is False


def test_a_status_of_a_resource_that_is_not_this_actions_is_refused() -> None:
    with pytest.raises(ConfigError, match="addresses no resource"):
        provider(
            ok(),
            reconciliation_key_field="ref",
            query={"path": "/queue", "query": {"ref": "{reconciliation_key}"}},
            status="/state",
            applied=["done"],
        )


@pytest.mark.parametrize(
    ("query", "fix"),
    [
        ({"path": "/messages"}, "addresses no resource"),
        ({"path": "/messages", "query": {"ref": "{reconciliation_key}"}}, "addresses no resource"),
        ({"path": "/messages", "list": "/data"}, "list query proves nothing without a match"),
    ],
)
def test_a_query_that_could_confirm_anything_is_refused_at_load(
    query: dict[str, Any], fix: str
) -> None:
    with pytest.raises(ConfigError, match=fix):
        provider(ok(), reconciliation_key_field="ref", query=query)


# -- secrets (rule 13) --------------------------------------------------------------------------


def token40() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))


def leaked(token: str, text: str) -> bool:
    return any(token[i : i + 4] in text for i in range(len(token) - 3))


def test_an_echoed_token_is_redacted_before_the_reply_is_cut() -> None:
    token = token40()
    body = ("x" * 180 + f"Bearer {token} was refused").encode()
    p, _ = provider(
        lambda r: httpx.Response(401, content=body),
        env={"TOK": token},
        provider_keys={"headers": {"Authorization": "Bearer ${TOK}"}},
        tier="full",
    )
    r = p.execute(req())
    assert r.status_code == 401 and not leaked(token, r.detail), r.detail


@pytest.mark.parametrize(
    "form",
    [
        lambda t: t,
        lambda t: repr(t)[1:-1],
        lambda t: json.dumps(t)[1:-1],
        lambda t: __import__("urllib.parse").parse.quote(t, safe=""),
        lambda t: __import__("re").sub(
            "%[0-9A-F]{2}",
            lambda m: m.group(0).lower(),
            __import__("urllib.parse").parse.quote(t, safe=""),
        ),
    ],
    ids=["plain", "repr", "json", "url", "url-lower"],
)
def test_every_encoding_of_a_secret_is_redacted(form: Callable[[str], str]) -> None:
    token = token40()[:20] + '/+="é'
    p, _ = provider(
        lambda r: httpx.Response(403, content=f"echo: {form(token)}".encode()),
        env={"TOK": token.encode("ascii", "ignore").decode()},
        provider_keys={"auth": {"type": "bearer", "token": "${TOK}"}},
        tier="full",
    )
    r = p.execute(req())
    assert not leaked(token.encode("ascii", "ignore").decode()[:20], r.detail), r.detail


def test_the_base64_of_basic_auth_is_redacted() -> None:
    cred = base64.b64encode(b"acct:pw-" + token40().encode()).decode()
    p, _ = provider(
        lambda r: httpx.Response(401, content=f"bad {r.headers['authorization']}".encode()),
        env={"PW": "pw-" + base64.b64decode(cred).decode().split(":", 1)[1][3:]},
        provider_keys={"auth": {"type": "basic", "username": "acct", "password": "${PW}"}},
        tier="full",
    )
    r = p.execute(req())
    assert not leaked(cred, r.detail), r.detail


@pytest.mark.parametrize("value", ["t0ken\t", "t0k\nen", "\x1bt0ken"])
def test_a_secret_with_a_control_character_is_refused_by_variable_name(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        provider(
            ok(),
            env={"MY_TOKEN": value},
            provider_keys={"headers": {"Authorization": "Bearer ${MY_TOKEN}"}},
        )
    msg = str(err.value)
    assert "MY_TOKEN" in msg and "control character" in msg and "t0k" not in msg


# -- load-time checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "fix"),
    [
        ("http://host:port/", "not a valid URL"),
        ("https://api.example.com/v1?key=1", "query string"),
        ("https://", "not a valid URL|names no host"),
    ],
)
def test_base_url_is_checked_at_load(base: str, fix: str) -> None:
    conf = {
        "type": "http",
        "base_url": base,
        "operations": {"op": {"tier": "blind", "request": {"path": "/p"}}},
    }
    with (
        pytest.raises(ConfigError, match=fix),
        Registry({"api": conf}, source="settled.toml") as reg,
    ):
        reg.load_all()


@pytest.mark.parametrize(
    ("op", "key", "fix"),
    [
        (
            {"request": {"path": "/p", "encoding": "xml"}},
            "request.encoding",
            '"json", "form" or "none"',
        ),
        ({"request": {"path": "/p?x=1"}}, "request.path", "query = {"),
        (
            {"request": {"path": "/p", "body": {"a": "{secret}"}}},
            "request.body.a",
            "not a placeholder",
        ),
        ({"request": {"path": "/p", "body": {"a": "{params"}}}, "request.body.a", "stray"),
        ({"conflict_statuses": [200]}, "conflict_statuses", "400-599"),
        ({"backoff": -1}, "backoff", ">= 0"),
        ({"reconciliation_key_param": "a.b"}, "reconciliation_key_param", "one top-level param"),
        (
            {"request": {"path": "/p", "form_lists": "repeat"}},
            "request.form_lists",
            'encoding = "form"',
        ),
    ],
)
def test_new_keys_are_checked_at_load(op: dict[str, Any], key: str, fix: str) -> None:
    base = {"tier": "full", "request": {"path": "/p"}, "object_id": "/id"}
    conf = {"type": "http", "base_url": "https://a.example", "operations": {"op": {**base, **op}}}
    with pytest.raises(ConfigError) as err, Registry({"api": conf}, source="settled.toml") as reg:
        reg.load_all()
    msg = str(err.value)
    assert msg.startswith(f"settled.toml: providers.api.operations.op.{key}") and fix in msg, msg


def test_a_full_operation_shows_no_window() -> None:
    p, _ = provider(ok(), tier="full", consistency_window=30)
    assert p.operations()["op"].to_json()["consistency_window"] == 0.0


def test_a_conflict_is_settled_by_the_query_not_failed(mem_ledger: Any) -> None:
    from settled.dispatch import Dispatcher, DispatchSettings
    from settled.model import Status

    def handler(r: httpx.Request) -> httpx.Response:
        if r.method == "POST":
            return httpx.Response(409, json={"error": "order A-1 exists"})
        return httpx.Response(200, json=[{"number": "A-1", "state": "placed"}])

    conf = {
        "type": "http",
        "base_url": "https://shop.example",
        "operations": {
            "order": {
                "tier": "full",
                "attempts": 1,
                "reconciliation_key_param": "number",
                "conflict_statuses": [409],
                "request": {"path": "/orders"},
                "query": {
                    "path": "/orders",
                    "query": {"number": "{reconciliation_key}"},
                    "list": "",
                    "match": "/number",
                },
                "status": "/state",
                "applied": ["placed"],
            }
        },
    }
    client = httpx.Client(transport=httpx.MockTransport(handler))
    with Registry({"shop": conf}, source="test", client=client) as reg:
        d = Dispatcher(mem_ledger, reg, settings=DispatchSettings(backoff=0.01))
        r = d.submit("shop", "order", {"number": "A-1"}, action_id="o1").record
    assert r.status is Status.CONFIRMED and r.confirmed_by != "provider", r.reason
