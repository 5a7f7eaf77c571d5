"""The HTTP API in process: the real ASGI app (TestClient), a real ledger on both
backends and the real sim on loopback. Each route does what its CLI command does, in
the same JSON shape; every refusal is a problem document and changes nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import check
from serving import auth, in_process, path_of, token_env, write_serve_config

from settled import Ledger
from settled.providers.sim_server import SimServer


@pytest.fixture
def client(tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim, max_body=4096)
    with in_process() as (c, lines):
        c.lines = lines
        yield c


def dump() -> list[Any]:
    """Every record and every event of the test's ledger (either backend)."""
    with Ledger.open(os.environ["SETTLED_DB"], create=False) as led:
        return [(r.to_json(), [e.to_json() for e in evs]) for r, evs in led.export(limit=100_000)]


def dispatch(c: Any, aid: str, op: str = "book", token: str = "sender", **body: Any) -> Any:
    return c.post(
        "/api/v1/actions",
        json={"provider": "sim", "operation": op, "action_id": aid, "params": {}, **body},
        headers=auth(token),
    )


def is_problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status and doc["type"].startswith("urn:settled:problem:")
    assert doc["title"] and doc["detail"] and "\n" not in doc["detail"]
    return doc


def test_dispatch_creates_sends_once_and_a_repeat_returns_the_record(
    client: Any, sim: SimServer
) -> None:
    r = dispatch(client, "order-1")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["outcome"] == "dispatched" and body["result"] == "succeeded"
    assert body["status"] == "CONFIRMED" and body["action_id"] == "order-1"
    assert r.headers["location"] == "/api/v1/actions/order-1"
    again = dispatch(client, "order-1")
    assert again.status_code == 200
    assert again.json()["outcome"] == "already_completed" and again.json()["result"] == "succeeded"
    assert len(sim.requests_for("order-1")) == 1 and sim.effects_for("order-1") == 1


def test_same_id_other_params_is_a_conflict_and_changes_nothing(
    client: Any, sim: SimServer
) -> None:
    assert dispatch(client, "c-1").status_code == 201
    before = dump()
    doc = is_problem(dispatch(client, "c-1", params={"x": 1}), 409)
    assert "nothing was sent" in doc["detail"] and doc["action_id"] == "c-1"
    assert dump() == before
    assert len(sim.requests_for("c-1")) == 1


def test_dispatch_events_name_the_token(client: Any) -> None:
    dispatch(client, "who-1", token="app")
    events = client.get(path_of("who-1"), headers=auth("reader")).json()["events"]
    assert [e["actor"] for e in events] == ["api:app"] * len(events)


def test_confirmation_flow_answers_rule_8(client: Any, sim: SimServer) -> None:
    r = dispatch(client, "book-7", needs_confirmation=True)
    assert r.status_code == 201 and r.json()["outcome"] == "recorded"
    assert r.json()["status"] == "PENDING" and sim.requests_for("book-7") == []
    first = client.post(path_of("book-7") + "/confirm", headers=auth("sender"))
    assert first.status_code == 200 and first.json()["outcome"] == "dispatched"
    assert first.json()["result"] == "succeeded"
    second = client.post(path_of("book-7") + "/confirm", json={}, headers=auth("ops"))
    assert second.json()["outcome"] == "already_completed"
    assert len(sim.requests_for("book-7")) == 1
    doc = is_problem(client.post(path_of("nope") + "/confirm", headers=auth("sender")), 404)
    assert doc["action_id"] == "nope"


def test_confirm_of_an_unresolved_action_is_blocked(client: Any, sim: SimServer) -> None:
    r = dispatch(client, "blind-1", op="notify")
    assert r.json()["status"] == "DENIED_UNRESOLVED"
    blocked = client.post(path_of("blind-1") + "/confirm", headers=auth("sender"))
    assert blocked.status_code == 200 and blocked.json()["outcome"] == "blocked"
    assert len(sim.requests_for("blind-1")) == 1


@pytest.mark.parametrize(
    "aid", ["a/b", "a%2Fb", "with space", "zürich-ünï-✓", "..", ".", "x/confirm", "50%", "a?b#c"]
)
def test_ids_are_one_segment_decoded_exactly_once(client: Any, sim: SimServer, aid: str) -> None:
    assert dispatch(client, aid).status_code == 201
    shown = client.get(path_of(aid), headers=auth("reader"))
    assert shown.status_code == 200, shown.text
    assert shown.json()["action_id"] == aid
    confirm = client.post(path_of(aid) + "/confirm", headers=auth("sender"))
    assert confirm.json()["action_id"] == aid and confirm.json()["outcome"] == "already_completed"
    assert len(sim.requests_for(aid)) == 1
    routes = {e["route"] for e in client.lines.requests()}
    assert routes == {"/api/v1/actions", "/api/v1/actions/{id}", "/api/v1/actions/{id}/confirm"}


def test_an_id_that_cannot_name_an_action_is_refused(client: Any) -> None:
    for bad in (" lead", "x" * 201, "tab\there"):
        doc = is_problem(client.get(path_of(bad), headers=auth("reader")), 422)
        assert "action id" in doc["detail"]
    is_problem(client.get("/api/v1/actions/", headers=auth("reader")), 422)
    is_problem(dispatch(client, " lead"), 422)


def test_show_is_the_record_with_its_events(client: Any) -> None:
    dispatch(client, "s-1")
    data = client.get(path_of("s-1"), headers=auth("reader")).json()
    assert data["status"] == "CONFIRMED" and data["config_changes"] == []
    assert [e["kind"] for e in data["events"]] == ["recorded", "claimed", "outcome"]
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        assert {k: data[k] for k in led.get("s-1").to_json()} == led.get("s-1").to_json()
    is_problem(client.get(path_of("missing"), headers=auth("reader")), 404)


def test_listing_takes_the_queue_selectors(client: Any) -> None:
    dispatch(client, "l-ok")
    dispatch(client, "l-blind", op="notify")
    default = client.get("/api/v1/actions", headers=auth("reader")).json()
    assert [a["action_id"] for a in default["actions"]] == ["l-blind"]
    assert default["count"] == default["total"] == 1 and default["actions"][0]["next"]
    every = client.get("/api/v1/actions", params={"status": "all"}, headers=auth("reader")).json()
    assert {a["action_id"] for a in every["actions"]} == {"l-ok", "l-blind"}
    one = client.get(
        "/api/v1/actions", params={"status": "all", "limit": 1}, headers=auth("reader")
    )
    assert one.json()["count"] == 1 and one.json()["total"] == 2
    confirmed = client.get(
        "/api/v1/actions",
        params={"status": "CONFIRMED", "provider": "sim", "operation": "book", "older_than": "0s"},
        headers=auth("reader"),
    ).json()
    assert [a["action_id"] for a in confirmed["actions"]] == ["l-ok"]
    young = client.get(
        "/api/v1/actions", params={"status": "all", "older_than": "1d"}, headers=auth("reader")
    )
    assert young.json()["actions"] == []
    for params, field in (
        ({"provider": "nosuch"}, "provider"),
        ({"provider": "sim", "operation": "nosuch"}, "operation"),
        ({"status": "DONE"}, "status"),
        ({"older_than": "soon"}, "older_than"),
        ({"limit": "0"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"stauts": "FAILED"}, "unknown query parameter 'stauts'; expected status"),
        ({"status": ["FAILED", "CONFIRMED"]}, "query parameter 'status': give it once"),
    ):
        doc = is_problem(client.get("/api/v1/actions", params=params, headers=auth("reader")), 422)
        assert doc["detail"].startswith(field), doc


def test_resolve_names_the_person_and_the_token(client: Any) -> None:
    dispatch(client, "r-1", op="notify")
    dispatch(client, "r-2", op="notify")
    r = client.post(
        path_of("r-1") + "/resolve",
        json={"applied": True, "reason": "customer replied"},
        headers=auth("ops"),
    )
    assert r.status_code == 200 and r.json()["status"] == "CONFIRMED"
    assert r.json()["confirmed_by"] == "operator:api:ops"
    r2 = client.post(
        path_of("r-2") + "/resolve",
        json={
            "applied": False,
            "reason": "bounced",
            "evidence": "ticket 9",
            "by": "alice",
            "no_recheck": True,
        },
        headers=auth("app"),
    )
    assert r2.json()["status"] == "FAILED"
    last = client.get(path_of("r-2"), headers=auth("reader")).json()["events"][-1]
    assert (
        last["actor"] == "operator:alice via api:app" and last["detail"]["evidence"] == "ticket 9"
    )
    before = dump()
    is_problem(
        client.post(
            path_of("r-1") + "/resolve", json={"applied": False, "reason": "x"}, headers=auth("ops")
        ),
        409,
    )
    for body in (
        {"applied": True},
        {"applied": True, "reason": ""},
        {"applied": "yes", "reason": "x"},
        {"applied": True, "reason": "x", "by": " bob"},
        {"applied": True, "reason": "x", "extra": 1},
        {"applied": True, "reason": "x", "no_recheck": "no"},
    ):
        is_problem(client.post(path_of("r-2") + "/resolve", json=body, headers=auth("ops")), 422)
    is_problem(
        client.post(
            path_of("gone") + "/resolve", json={"applied": True, "reason": "x"}, headers=auth("ops")
        ),
        404,
    )
    assert dump() == before


def test_retry_opens_attempt_two_only_from_failed(client: Any, sim: SimServer) -> None:
    sim.plan("f-1", "reject")
    assert dispatch(client, "f-1").json()["status"] == "FAILED"
    r = client.post(path_of("f-1") + "/retry", json={"no_recheck": False}, headers=auth("ops"))
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "dispatched" and r.json()["attempt"] == 2
    assert r.json()["idempotency_key"] == "f-1:2" and r.json()["status"] == "CONFIRMED"
    doc = is_problem(client.post(path_of("f-1") + "/retry", headers=auth("ops")), 409)
    assert "FAILED" in doc["detail"]
    is_problem(
        client.post(path_of("f-1") + "/retry", json={"no_recheck": 1}, headers=auth("ops")), 422
    )
    is_problem(client.post(path_of("f-404") + "/retry", headers=auth("ops")), 404)


def test_reconcile_checks_now_and_returns_the_record(client: Any, sim: SimServer) -> None:
    r = dispatch(client, "m-1", op="send")
    assert r.json()["status"] == "AWAITING_VERIFICATION"
    rec = client.post(path_of("m-1") + "/reconcile", headers=auth("ops"))
    assert rec.status_code == 200, rec.text
    data = rec.json()
    assert data["examined"] == 1 and data["record"]["status"] == "CONFIRMED"
    assert data["changes"][0]["to"] == "CONFIRMED"
    is_problem(client.post(path_of("m-404") + "/reconcile", headers=auth("ops")), 404)
    is_problem(client.post(path_of("m-1") + "/reconcile", json={"x": 1}, headers=auth("ops")), 422)


def test_stats_count_status_by_provider_and_operation(client: Any) -> None:
    dispatch(client, "st-1")
    dispatch(client, "st-2")
    dispatch(client, "st-3", op="notify")
    data = client.get("/api/v1/stats", headers=auth("reader")).json()
    assert data["total"] == 3
    assert data["by_status"] == {"CONFIRMED": 2, "DENIED_UNRESOLVED": 1}
    assert sorted((c["status"], c["operation"], c["count"]) for c in data["counts"]) == [
        ("CONFIRMED", "book", 2),
        ("DENIED_UNRESOLVED", "notify", 1),
    ]
    only = client.get(
        "/api/v1/stats", params={"operation": "notify"}, headers=auth("reader")
    ).json()
    assert only["total"] == 1
    is_problem(
        client.get("/api/v1/stats", params={"provider": "nope"}, headers=auth("reader")), 422
    )


def test_malformed_and_oversized_bodies_are_refused_before_anything(
    client: Any, sim: SimServer
) -> None:
    before = dump()
    h = {**auth("sender"), "content-type": "application/json"}
    for raw in (b"{", b'{"provider": NaN}', b"\xff\xfe", b'{"a": 1e999}', b'"\\ud800"'):
        is_problem(client.post("/api/v1/actions", content=raw, headers=h), 400)
    is_problem(
        client.post(
            "/api/v1/actions",
            content=b"provider=sim",
            headers={**auth("sender"), "content-type": "application/x-www-form-urlencoded"},
        ),
        415,
    )
    big = {"provider": "sim", "operation": "book", "action_id": "big", "params": {"x": "y" * 5000}}
    is_problem(client.post("/api/v1/actions", json=big, headers=auth("sender")), 413)

    def chunks() -> Iterator[bytes]:
        yield b'{"provider": "sim", "operation": "book", "action_id": "big2", "params": {"x": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}}'

    is_problem(client.post("/api/v1/actions", content=chunks(), headers=h), 413)
    for body in (
        {"operation": "book", "action_id": "x"},
        {"provider": "sim", "operation": "book"},
        {"provider": "sim", "operation": "book", "action_id": "x", "params": []},
        {"provider": "sim", "operation": "book", "action_id": "x", "surprise": 1},
        {"provider": "nope", "operation": "book", "action_id": "x"},
        {"provider": "sim", "operation": "nope", "action_id": "x"},
        [],
    ):
        is_problem(client.post("/api/v1/actions", json=body, headers=auth("sender")), 422)
    assert dump() == before
    assert sim.truth()["requests"] == []


def test_unknown_routes_and_methods_are_problems(client: Any) -> None:
    is_problem(client.get("/api/v1/nothing", headers=auth("reader")), 404)
    is_problem(client.get("/", headers=auth("reader")), 404)
    is_problem(client.delete(path_of("x"), headers=auth("ops")), 405)
    is_problem(client.get(path_of("x") + "/confirm", headers=auth("reader")), 404)


def test_a_verdicts_actor_is_the_token_and_by_can_never_pose_as_another_surface(
    client: Any,
) -> None:
    """The actor is made from the token that called; ``by`` is the person it vouches
    for, kept in a field of its own, and can never carry ` via ` (which separates the
    person from the surface) nor a control character."""
    dispatch(client, "f-1", op="notify")
    assert client.get(path_of("f-1"), headers=auth("reader")).json()["status"] == (
        "DENIED_UNRESOLVED"
    )
    before = dump()
    for forged in (
        "alice via ui:token:reader:0123456789ab",
        "alice via api:reader",
        "alice\x1b[2Kvia api:reader",
        "alice\nvia api:reader",
        "alice\u202ereader:ipa",
        "alice\u200b",
    ):
        r = client.post(
            path_of("f-1") + "/resolve",
            json={"applied": True, "reason": "x", "by": forged},
            headers=auth("ops"),
        )
        doc = is_problem(r, 422)
        assert doc["detail"].startswith("by:"), doc
    assert dump() == before
    r = client.post(
        path_of("f-1") + "/resolve",
        json={"applied": True, "reason": "customer replied", "by": "alice"},
        headers=auth("ops"),
    )
    assert r.status_code == 200, r.text
    last = client.get(path_of("f-1"), headers=auth("reader")).json()["events"][-1]
    assert last["actor"] == "operator:alice via api:ops"  # the format older readers parse
    assert last["detail"]["by"] == "alice via api:ops"
    assert last["detail"]["person"] == "alice" and last["detail"]["via"] == "api:ops"


def test_openapi_description_needs_no_token(client: Any) -> None:
    r = client.get("/api/v1/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"] == "3.1.0" and doc["servers"] == [{"url": "/api/v1"}]
    assert set(doc["paths"]) == {
        "/openapi.json",
        "/actions",
        "/actions/{id}",
        "/actions/{id}/confirm",
        "/actions/{id}/resolve",
        "/actions/{id}/retry",
        "/actions/{id}/reconcile",
        "/events",
        "/stats",
    }


def test_openapi_description_is_valid_openapi_3_1(client: Any) -> None:
    """Generators and gateways validate the description before they accept the API
    (a root ``$id`` is not OpenAPI 3.1, and openapi-spec-validator refuses it)."""
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

    doc = client.get("/api/v1/openapi.json").json()
    try:
        validate(doc)
    except OpenAPIValidationError as exc:
        pytest.fail(f"not valid OpenAPI 3.1: {exc.message}")


def test_every_api_answer_but_its_description_is_never_stored_by_a_cache(client: Any) -> None:
    """Records carry params (personal data, often): a browser's or a proxy's cache must
    keep none of them, refusals included; the OpenAPI description may be kept briefly."""
    answers = [
        dispatch(client, "cc-1"),
        client.get(path_of("cc-1"), headers=auth("reader")),
        client.get("/api/v1/actions?status=all", headers=auth("reader")),
        client.get("/api/v1/stats", headers=auth("reader")),
        client.post(path_of("cc-1") + "/confirm", headers=auth("ops")),
        client.get(path_of("nope"), headers=auth("reader")),  # 404
        client.get(path_of("cc-1")),  # 401
        client.get("/api/v1/nothing", headers=auth("reader")),  # no such route
        client.post("/mcp", json={}),  # 401: /mcp's tool results carry records too
    ]
    for r in answers:
        assert r.headers.get("cache-control") == "no-store", (r.request.url, r.headers)
    doc = client.get("/api/v1/openapi.json")
    assert doc.headers["cache-control"].startswith("public, max-age="), doc.headers


def test_health_and_metrics_need_no_token(client: Any) -> None:
    dispatch(client, "h-1", op="notify")
    h = client.get("/healthz")
    assert h.status_code == 200 and h.text == "ok\n"
    m = client.get("/metrics")
    assert m.status_code == 200
    assert 'settled_queue_depth{provider="sim",status="DENIED_UNRESOLVED"} 1.0' in m.text
    assert (
        'settled_http_requests_total{method="POST",route="/api/v1/actions",status="201"} 1.0'
        in m.text
    )


def test_metrics_count_dispatch_outcomes_by_status_not_only_by_http_code(
    client: Any, sim: SimServer
) -> None:
    """A send the provider refused is still a 201 (this call recorded the action), so
    the request counter cannot tell it from a success: the outcome counter can."""
    sim.plan("refused-1", "reject")
    assert dispatch(client, "refused-1").json()["status"] == "FAILED"
    assert dispatch(client, "booked-1").json()["status"] == "CONFIRMED"
    assert dispatch(client, "booked-1").status_code == 200  # a repeat: nothing sent
    assert dispatch(client, "held-1", needs_confirmation=True).status_code == 201
    client.post(path_of("held-1") + "/confirm", headers=auth("ops"))
    text = client.get("/metrics").text
    series = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("settled_dispatch_outcomes_total{")
    }
    assert series == {
        'settled_dispatch_outcomes_total{outcome="dispatched",status="FAILED"}': 1.0,
        'settled_dispatch_outcomes_total{outcome="dispatched",status="CONFIRMED"}': 2.0,
        'settled_dispatch_outcomes_total{outcome="already_completed",status="CONFIRMED"}': 1.0,
        'settled_dispatch_outcomes_total{outcome="recorded",status="PENDING"}': 1.0,
    }
    assert (
        'settled_http_requests_total{method="POST",route="/api/v1/actions",status="201"} 3.0'
        in text
    )


def test_every_request_is_one_log_line_with_its_route_template(client: Any) -> None:
    dispatch(client, "secret-order-99")
    client.get(path_of("secret-order-99"), headers=auth("reader"))
    client.get("/api/v1/actions", params={"access_token": "abc-def-ghi"})
    client.get("/nowhere/secret-order-99")
    lines = client.lines.requests()
    assert [(e["method"], e["route"], e["status"]) for e in lines] == [
        ("POST", "/api/v1/actions", 201),
        ("GET", "/api/v1/actions/{id}", 200),
        ("GET", "/api/v1/actions", 401),
        ("GET", "-", 404),
    ]
    assert all(isinstance(e["duration_ms"], float) for e in lines)
    text = str(client.lines.entries)
    for secret in ("secret-order-99", "abc-def-ghi", "s" * 20, "r" * 20):
        assert secret not in text
    assert lines[0]["actor"] == "api:sender" and "actor" not in lines[2]
    assert "access_token" in lines[2]["refused"]


def test_the_ledger_holds_what_the_api_said(client: Any, sim: SimServer) -> None:
    for i in range(3):
        dispatch(client, f"inv-{i}", op=("book", "send", "notify")[i])
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        check(led, sim, open_ok={"inv-1", "inv-2"})
