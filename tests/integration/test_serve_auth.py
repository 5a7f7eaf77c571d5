"""Who may call the service and from where: every API route without a token, with a
wrong one, with one that lacks the role, with a token in the query string; the Host
and Origin checks on every route a browser can reach; the service with no token
configured. Every refusal is a problem document and leaves the ledger as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import TOKENS, auth, in_process, path_of, token_env, write_serve_config

from settled import Ledger
from settled.config import from_dict
from settled.errors import ConfigError
from settled.providers.sim_server import SimServer
from settled.serve.api import ENDPOINTS
from settled.serve.auth import Guard, Tokens

# The ledger is only where a refused request must change nothing: these tests are about
# the checks in front of it, and run once (on SQLite).
pytestmark = pytest.mark.ledger_incidental

READ_ONLY = ("reader",)


def records() -> list[Any]:
    with Ledger.open(os.environ["SETTLED_DB"], create=False) as led:
        return [(r.to_json(), [e.to_json() for e in evs]) for r, evs in led.export(limit=100_000)]


@pytest.fixture
def client(tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim, hosts=["settled.example.com"])
    with in_process() as (c, lines):
        c.lines = lines
        r = c.post(
            "/api/v1/actions",
            headers=auth("app"),
            json={"provider": "sim", "operation": "notify", "action_id": "seed", "params": {}},
        )
        assert r.status_code == 201
        yield c


def call(c: Any, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
    path = path.replace("{id}", path_of("seed").rsplit("/", 1)[1])
    body = {}
    if method == "POST" and path.endswith("/resolve"):
        body = {"json": {"applied": True, "reason": "seen"}}
    if method == "POST" and path.endswith("/actions"):
        body = {
            "json": {"provider": "sim", "operation": "book", "action_id": "new-1", "params": {}}
        }
    return c.request(method, "/api/v1" + path, headers=headers or {}, **body, **kw)


GUARDED = [e.op for e in ENDPOINTS if e.op.roles]


@pytest.mark.parametrize("op", GUARDED, ids=lambda o: o.operation_id)
def test_every_route_refuses_a_missing_or_wrong_token(client: Any, op: Any) -> None:
    before = records()
    for headers in (
        {},
        {"Authorization": "Bearer " + "x" * 20},
        {"Authorization": "Basic " + "o" * 20},
        {"Authorization": "Bearer"},
        {"Authorization": TOKENS["ops"][0]},
    ):
        r = call(client, op.method, op.path, headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"].startswith('Bearer realm="settled"')
        assert r.headers["content-type"].startswith("application/problem+json")
    assert records() == before


@pytest.mark.parametrize("op", GUARDED, ids=lambda o: o.operation_id)
def test_every_route_refuses_a_token_without_its_role(client: Any, op: Any) -> None:
    from settled.serve.auth import INCLUDES

    before = records()
    for name, (_secret, roles) in TOKENS.items():
        allowed = set().union(*(INCLUDES[r] for r in roles))
        r = call(client, op.method, op.path, auth(name))
        if allowed & set(op.roles):
            assert r.status_code not in (401, 403), (name, r.text)
        else:
            assert r.status_code == 403, (name, r.text)
            assert "lacks the role" in r.json()["detail"]
    if op.method == "GET":
        assert records() == before


@pytest.mark.parametrize("op", [e.op for e in ENDPOINTS], ids=lambda o: o.operation_id)
@pytest.mark.parametrize("param", ["token", "access_token", "ACCESS_TOKEN"])
def test_a_token_in_the_query_string_is_refused_and_never_logged(
    client: Any, op: Any, param: str
) -> None:
    before = records()
    secret = TOKENS["app"][0]
    r = call(client, op.method, op.path, auth("app"), params={param: secret})
    assert r.status_code == 401 and "in the URL" in r.json()["detail"]
    assert secret not in r.text
    line = client.lines.requests()[-1]
    assert line["status"] == 401 and param.lower() in line["refused"]
    assert secret not in str(client.lines.entries)
    assert records() == before


def test_no_token_and_no_header_value_ever_reaches_the_log(client: Any) -> None:
    for name in TOKENS:
        client.get("/api/v1/actions", headers=auth(name))
    client.get("/api/v1/actions", headers={"Authorization": "Bearer wrong-token-value-123"})
    text = str(client.lines.entries)
    for secret, _roles in TOKENS.values():
        assert secret not in text
    assert "wrong-token-value-123" not in text and "Bearer" not in text


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "127.0.0.1:9999",
        "localhost:1",
        "settled.example.com.evil",
        "127.0.0.2:8780",
        "",
        "127.0.0.1:8780@evil",
        "a b",
    ],
)
def test_a_host_it_does_not_answer_to_is_misdirected(client: Any, host: str) -> None:
    before = records()
    for method, path in (
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/api/v1/actions"),
        ("POST", "/api/v1/actions"),
        ("POST", "/mcp"),
    ):
        r = client.request(method, path, headers={**auth("app"), "Host": host})
        assert r.status_code in (400, 421), (method, path, r.status_code)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert records() == before


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8780",
        "localhost:8780",
        "[::1]:8780",
        "settled.example.com",
        "SETTLED.example.com:443",
    ],
)
def test_the_hosts_it_answers_to(client: Any, host: str) -> None:
    assert client.get("/healthz", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "null",
        "https://127.0.0.1:8780",
        "http://127.0.0.1:8781",
        "http://localhost:8780",
        "file://",
        "http://127.0.0.1:8780.evil",
    ],
)
def test_a_write_from_another_origin_is_forbidden(client: Any, origin: str) -> None:
    before = records()
    for op in [e.op for e in ENDPOINTS if e.op.method == "POST"]:
        r = call(client, op.method, op.path, {**auth("app"), "Origin": origin})
        assert r.status_code == 403, (op.operation_id, r.text)
        assert "another origin" in r.json()["detail"]
    r = client.post("/mcp", headers={**auth("app"), "Origin": origin}, json={})
    assert r.status_code == 403
    assert records() == before
    # a read from another origin is answered (no CORS headers: a browser keeps it from the page)
    r = client.get("/api/v1/actions", headers={**auth("reader"), "Origin": origin})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_a_same_origin_write_is_served(client: Any) -> None:
    r = client.post(
        path_of("seed") + "/resolve",
        json={"applied": True, "reason": "seen"},
        headers={**auth("ops"), "Origin": "http://127.0.0.1:8780"},
    )
    assert r.status_code == 200, r.text


def test_an_encoded_slash_never_turns_into_another_route(client: Any) -> None:
    r = client.post("/api/v1/actions/seed%2Fconfirm", headers=auth("app"))
    assert r.status_code in (404, 405), r.text
    assert (
        client.post("/api/v1/actions/seed/confirm", headers=auth("app")).json()["outcome"]
        == "blocked"
    )


def test_openapi_health_and_metrics_need_no_token(client: Any) -> None:
    for path in ("/api/v1/openapi.json", "/healthz", "/metrics"):
        assert client.get(path).status_code == 200


def test_mcp_needs_a_dispatch_token_once_tokens_are_configured(client: Any) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    assert client.post("/mcp", json=init, headers=accept).status_code == 401
    assert client.post("/mcp", json=init, headers={**accept, **auth("reader")}).status_code == 403
    assert client.post("/mcp", json=init, headers={**accept, **auth("ops")}).status_code == 403
    ok = client.post("/mcp", json=init, headers={**accept, **auth("sender")})
    assert ok.status_code == 200, ok.text


def test_without_tokens_the_api_refuses_every_call(tmp_path: Path, sim: SimServer) -> None:
    write_serve_config(tmp_path / "settled.toml", sim, tokens=False)
    with in_process() as (c, _lines):
        for op in GUARDED:
            r = call(c, op.method, op.path, {"Authorization": "Bearer " + "o" * 20})
            assert r.status_code == 401 and "no API tokens" in r.json()["detail"]
        assert c.get("/api/v1/openapi.json").status_code == 200
        assert c.get("/healthz").status_code == 200
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        r = c.post("/mcp", json=init, headers={"Accept": "application/json, text/event-stream"})
        assert r.status_code == 200  # loopback without tokens: open, as `settled mcp --http`


def test_tokens_are_compared_by_digest_and_identify_their_caller() -> None:
    toks = Tokens([("a", "x" * 20, ["read"]), ("b", "y" * 20, ["dispatch", "operate"])])
    a, b = toks.identify("x" * 20), toks.identify("y" * 20)
    assert a is not None and a.actor == "api:a" and a.may("read") and not a.may("dispatch")
    assert b is not None and b.may("read") and b.may("dispatch") and b.may("operate")
    assert toks.identify("x" * 19) is None and toks.identify("") is None


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (None, "is not set"),
        ("short", "at least 16"),
        ("bad\tvalue-but-long-enough", "control character"),
    ],
)
def test_token_secrets_are_checked_at_start(
    monkeypatch: pytest.MonkeyPatch, value: str | None, fix: str
) -> None:
    cfg = from_dict(
        {"serve": {"tokens": {"a": {"secret": "${T_A}", "roles": ["read"]}}}}, source="s.toml"
    )
    if value is None:
        monkeypatch.delenv("T_A", raising=False)
    else:
        monkeypatch.setenv("T_A", value)
    with pytest.raises(ConfigError) as err:
        Tokens.from_config(cfg)
    assert fix in str(err.value) and "s.toml: serve.tokens.a.secret" in str(err.value)
    if value:
        assert value not in str(err.value)


def test_two_tokens_with_one_secret_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_A", "z" * 20)
    cfg = from_dict(
        {
            "serve": {
                "tokens": {
                    "a": {"secret": "${T_A}", "roles": ["read"]},
                    "b": {"secret": "${T_A}", "roles": ["read"]},
                }
            }
        }
    )
    with pytest.raises(ConfigError, match="same secret"):
        Tokens.from_config(cfg)


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ({"listen": "nowhere"}, "serve.listen 'nowhere': use HOST:PORT"),
        ({"listen": 8780}, "serve.listen must be a string"),
        ({"max_body": 0}, "serve.max_body: must be a whole number >= 1"),
        ({"max_body": 2**40}, "serve.max_body must be at most"),
        ({"hosts": "a.example"}, "serve.hosts must be a list"),
        ({"trusted_proxies": ["127.0.0.1"]}, "serve.trusted_proxies: unknown key"),
        (
            {"tokens": {"x": {"secret": "plain-text-secret", "roles": ["read"]}}},
            "must name an environment variable",
        ),
        (
            {"tokens": {"x": {"secret": "${X}", "roles": []}}},
            "serve.tokens.x.roles: must be a non-empty list",
        ),
        ({"tokens": {"x": {"secret": "${X}", "roles": ["admin"]}}}, "read, dispatch, operate"),
        (
            {"tokens": {"x": {"secret": "${X}", "roles": ["read"], "scope": 1}}},
            "serve.tokens.x.scope: unknown key",
        ),
        ({"tokens": {"bad name": {"secret": "${X}", "roles": ["read"]}}}, "a token name is"),
    ],
)
def test_serve_config_mistakes_are_one_line_naming_file_and_key(
    serve: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"serve": serve}, source="settled.toml")
    text = str(err.value)
    assert text.startswith("settled.toml: serve") and message in text and "\n" not in text


def test_guard_knows_loopback_names_and_configured_hosts() -> None:
    g = Guard("127.0.0.1", 8780, ["settled.example.com"])
    assert g.host_ok("127.0.0.1:8780") and g.host_ok("LOCALHOST:8780") and g.host_ok("[::1]:8780")
    assert g.host_ok("settled.example.com") and g.host_ok("settled.example.com:8443")
    assert not g.host_ok("127.0.0.1") and not g.host_ok("evil:8780") and not g.host_ok(None)
    assert Guard.same_origin("https://settled.example.com", "https", "settled.example.com:443")
    assert not Guard.same_origin("http://settled.example.com", "https", "settled.example.com")
    remote = Guard("0.0.0.0", 8780, ["api.example.com"])
    assert remote.host_ok("api.example.com") and not remote.host_ok("0.0.0.0:8780")
