"""The declarative ``http`` provider against a real server on loopback: the sim server,
described by an http config. Every fault the sim injects, with and without a
deduplicating key, through the real dispatcher and reconciler; each test checks what
the server received and applied, not only what settled recorded."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import PATIENT, SHORT

from settled import Ledger
from settled.clock import Clock
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import Status, Tier
from settled.providers import Registry
from settled.providers import http as http_provider
from settled.providers.base import QueryTarget, Request, Seen, Wire
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler

pytestmark = pytest.mark.ledger_incidental

DEADLINE = 0.5


def sim_ops(dedupe: bool) -> dict[str, Any]:
    """The sim server's endpoints, as a user would describe them in settled.toml."""
    common: dict[str, Any] = {
        "consistency_window": 0,
        "attempts": 3,
        "reconciliation_key_field": "reconciliation_key",
        "object_id": "/id",
        "query": {"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
        "status": "/status",
        "not_applied": ["bounced"],
        "verify": {"interval": 0.05, "deadline": DEADLINE},
    }
    if dedupe:
        common["idempotency_header"] = "Idempotency-Key"
    return {
        "send": {
            **common,
            "tier": "reconcilable",
            "request": {"method": "POST", "path": "/v1/send"},
            "applied": ["delivered"],
        },
        "book": {
            **common,
            "tier": "full",
            "request": {"method": "POST", "path": "/v1/book"},
            "applied": ["booked", "applied"],
        },
    }


# Faults whose subject is a reply that never comes in time: their tests get SHORT, under
# the server's hang, so the client gives up first; every other reply comes back, and gets
# a timeout no loaded machine outlasts.
HUNG = frozenset({"timeout_before_apply", "timeout_after_apply"})


def http_conf(url: str, dedupe: bool, fault: str = "ok") -> dict[str, Any]:
    timeout = SHORT if fault in HUNG else PATIENT
    return {"type": "http", "base_url": url, "timeout": timeout, "operations": sim_ops(dedupe)}


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0) as s:
        yield s


def settle(ledger: Ledger, registry: Registry, aid: str) -> Any:
    """Run verification for one record until it is terminal or only a person can
    settle it (bounded: a few seconds at most)."""
    reconciler = Reconciler(ledger, registry, lease=5.0)
    stop = time.monotonic() + 30  # a ceiling: it returns once the record is settled
    while time.monotonic() < stop:
        r = ledger.get(aid)
        if r.terminal or (r.status is Status.DENIED_UNRESOLVED and not r.next_check_at):
            return r
        reconciler.run_ids([aid])
        time.sleep(0.02)
    return ledger.get(aid)


def dispatch(ledger: Ledger, registry: Registry, op: str, aid: str) -> Any:
    d = Dispatcher(ledger, registry, settings=DispatchSettings(backoff=0.01), clock=Clock())
    return d.submit("api", op, {"to": "a@example.com", "action_id": aid}, action_id=aid)


# fault -> (final status with a deduplicating key, without one, effects applied)
FAULTS: dict[str, tuple[Status, Status, int]] = {
    "ok": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "drop": (Status.CONFIRMED, Status.DENIED_UNRESOLVED, -1),
    "timeout_before_apply": (Status.CONFIRMED, Status.DENIED_UNRESOLVED, -1),
    "5xx_before": (Status.CONFIRMED, Status.DENIED_UNRESOLVED, -1),
    "reject": (Status.FAILED, Status.FAILED, 0),
    "http:429": (Status.CONFIRMED, Status.DENIED_UNRESOLVED, -1),
    "http:404": (Status.FAILED, Status.FAILED, 0),
    "timeout_after_apply": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "reset_after_apply": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "5xx_after": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "garbage": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "badutf8": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "huge": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "lag:0.2": (Status.CONFIRMED, Status.CONFIRMED, 1),
    "lost_after_accept": (Status.DENIED_UNRESOLVED, Status.DENIED_UNRESOLVED, 0),
    "bounce": (Status.FAILED, Status.FAILED, 0),
}


@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "no-dedupe"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_reconcilable_send_under_every_fault(
    server: SimServer, ledger: Ledger, fault: str, dedupe: bool
) -> None:
    with_key, without_key, effects = FAULTS[fault]
    registry = Registry({"api": http_conf(server.url, dedupe, fault)}, source="test")
    try:
        server.plan("a1", fault)
        dispatch(ledger, registry, "send", "a1")
        final = settle(ledger, registry, "a1")
    finally:
        registry.close()
    assert final.status is (with_key if dedupe else without_key), final.reason
    seen = server.requests_for("a1")
    # What the server received: the key in the body field, the idempotency header only
    # when the operation declares it, and a repeat only when the repeat is safe.
    assert {r["reconciliation_key"] for r in seen} == {final.reconciliation_key}
    assert {r["idempotency_key"] for r in seen} == ({"a1:1"} if dedupe else {None})
    repeated = (
        dedupe
        and with_key is Status.CONFIRMED
        and fault not in ("ok", "garbage", "badutf8", "huge", "lag:0.2")
    )
    assert len(seen) == (2 if repeated else 1)
    applied = server.effects_for("a1")
    assert applied == (1 if (dedupe and effects == -1) else max(effects, 0))
    assert applied <= 1  # never twice
    if final.status is Status.CONFIRMED:
        assert applied == 1 and final.confirmed_by == "reconciliation"


@pytest.mark.parametrize(
    ("fault", "dedupe", "status", "confirmed_by"),
    [
        ("ok", False, Status.CONFIRMED, "provider"),
        ("lost_after_accept", True, Status.DENIED_UNRESOLVED, None),
        ("timeout_after_apply", False, Status.CONFIRMED, "reconciliation"),
        ("timeout_after_apply", True, Status.CONFIRMED, "provider"),
        ("garbage", False, Status.CONFIRMED, "reconciliation"),
    ],
)
def test_full_book_needs_the_reply_to_say_so(
    server: SimServer,
    ledger: Ledger,
    fault: str,
    dedupe: bool,
    status: Status,
    confirmed_by: str | None,
) -> None:
    registry = Registry({"api": http_conf(server.url, dedupe, fault)}, source="test")
    try:
        server.plan("b1", fault)
        report = dispatch(ledger, registry, "book", "b1")
        final = settle(ledger, registry, "b1")
    finally:
        registry.close()
    assert (final.status, final.confirmed_by) == (status, confirmed_by), final.reason
    assert server.effects_for("b1") == (0 if fault == "lost_after_accept" else 1)
    if fault == "lost_after_accept":  # 202 "queued" on a full op proves nothing
        assert report.record.status is Status.AWAITING_VERIFICATION
    if confirmed_by == "provider":
        assert final.provider_object_id and final.provider_object_id.startswith("bk-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_never_connected_is_repeated_within_the_one_budget(ledger: Ledger) -> None:
    registry = Registry({"api": http_conf(f"http://127.0.0.1:{free_port()}", False)})
    try:
        report = dispatch(ledger, registry, "send", "a1")
    finally:
        registry.close()
    assert report.record.status is Status.FAILED
    [outcome] = [e for e in ledger.events("a1") if e.kind == "outcome"]
    assert [t["wire"] for t in outcome.detail["tries"]] == ["not_connected"] * 3


# -- reading replies (fast unit tests on MockTransport) -----------------------------------


def provider_with(handler: Any, **op: Any) -> tuple[http_provider.HttpProvider, httpx.Client]:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    conf = {
        "base_url": "https://api.example.com",
        "operations": {"op": {"request": {"method": "POST", "path": "/things"}, **op}},
    }
    return http_provider.create("api", conf, client), client


def req(op: str = "op", key: str | None = "rk-1") -> Request:
    return Request("a1", op, {"x": 1}, "a1:1", key, 1, 1.0)


def target(key: str | None = "rk-1", oid: str | None = None) -> QueryTarget:
    return QueryTarget("a1", "op", {}, key, oid, None, 1)


@pytest.mark.parametrize(
    ("code", "body", "op", "applied"),
    [
        (201, {"id": "t1"}, {"tier": "full"}, True),
        (202, {"id": "t1"}, {"tier": "full"}, None),
        (200, "<html>", {"tier": "full"}, None),  # no object id in it: proves nothing (rule 19)
        (200, {"s": "done"}, {"tier": "full", "status": "/s", "applied": ["done"]}, True),
        (200, {"s": "queued"}, {"tier": "full", "status": "/s", "applied": ["done"]}, None),
        (
            200,
            {"s": "no"},
            {"tier": "full", "status": "/s", "applied": ["ok"], "not_applied": ["no"]},
            False,
        ),
        (200, {}, {"tier": "full", "status": "/s", "applied": ["done"]}, None),
        (200, {"s": True}, {"tier": "full", "status": "/s", "applied": [1]}, None),
        (200, {"s": "done"}, {"tier": "partial"}, None),
        (422, {"error": "bad"}, {"tier": "full"}, None),
    ],
)
def test_reply_reading(code: int, body: Any, op: dict[str, Any], applied: bool | None) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(code, content=body.encode())
        return httpx.Response(code, json=body)

    p, client = provider_with(handler, object_id="/id", **op)
    with client:
        r = p.execute(req())
    assert (r.wire, r.status_code, r.applied) == (Wire.ANSWERED, code, applied)
    if isinstance(body, dict) and "id" in body and 200 <= code < 300:
        assert r.object_id == "t1"


def test_request_carries_key_header_and_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"data": [{"id": 7}]})

    p, client = provider_with(
        handler,
        tier="reconcilable",
        idempotency_header="X-Idem",
        request={"method": "PUT", "path": "/things/{reconciliation_key}"},
        reconciliation_key_field="ref",
        object_id="/data/0/id",
        query={"path": "/things/{reconciliation_key}"},
    )
    with client:
        r = p.execute(req(key="a b?c"))
    assert r.object_id == "7"
    [sent] = seen
    assert sent.method == "PUT" and sent.url.raw_path == b"/things/a%20b%3Fc"
    assert sent.headers["X-Idem"] == "a1:1"
    assert json.loads(sent.content) == {"x": 1, "ref": "a b?c"}


@pytest.mark.parametrize(
    ("code", "body", "not_found", "seen"),
    [
        (200, {"state": "delivered"}, "pending", Seen.APPLIED),
        (200, {"state": "bounced"}, "pending", Seen.NOT_APPLIED),
        (200, {"state": "queued"}, "pending", Seen.NOT_YET),
        (200, {"other": 1}, "pending", Seen.UNKNOWN),
        (404, {}, "pending", Seen.NOT_YET),
        (404, {}, "not_applied", Seen.NOT_APPLIED),
        (503, {}, "pending", Seen.UNKNOWN),
    ],
)
def test_query_reading(code: int, body: Any, not_found: str, seen: Seen) -> None:
    p, client = provider_with(
        lambda r: httpx.Response(code, json=body),
        tier="reconcilable",
        reconciliation_key_field="ref",
        query={"path": "/q/{reconciliation_key}"},
        status="/state",
        applied=["delivered"],
        not_applied=["bounced"],
        not_found=not_found,
        **({"not_found_when": {"http_status": [404]}} if not_found == "not_applied" else {}),
    )
    with client:
        assert p.query(target()).seen is seen


def test_query_by_object_id_needs_the_reply() -> None:
    urls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(200, json={"id": "t 1"})

    p, client = provider_with(
        handler,
        tier="reconcilable",
        object_id="/id",
        query={"path": "/things/{provider_object_id}"},
    )
    with client:
        lost = p.query(target(oid=None))
        found = p.query(target(oid="t 1"))
        refused = p.query(target(oid=".."))
    assert lost.seen is Seen.UNKNOWN and "never arrived" in lost.detail
    assert found.seen is Seen.APPLIED and urls == ["https://api.example.com/things/t%201"]
    assert refused.seen is Seen.UNKNOWN and "another resource" in refused.detail
    assert p.operations()["op"].query_by_object_id


def test_declarations() -> None:
    p, client = provider_with(
        lambda r: httpx.Response(200),
        tier="full",
        attempts=2,
        idempotency_header="Idempotency-Key",
        timeout=1.5,
        object_id="/id",
    )
    client.close()
    spec = p.operations()["op"]
    assert (spec.tier, spec.attempts, spec.dedupes_keys, spec.timeout) == (Tier.FULL, 2, True, 1.5)
    assert not spec.queryable and not spec.carries_key
    assert "not 202" in spec.proof and "/id" in spec.proof


def test_tls_verification_stays_on(tmp_path: Path) -> None:
    """A self-signed certificate on loopback: nothing is sent, and it says why."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.path)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        conf = {
            "base_url": f"https://127.0.0.1:{server.server_address[1]}",
            "operations": {"op": {"tier": "full", "request": {"path": "/x"}, "object_id": "/id"}},
        }
        with Registry({"api": {"type": "http", **conf}}) as reg:
            result = reg.provider("api").execute(req())
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert result.wire is Wire.NOT_CONNECTED and "CERTIFICATE_VERIFY_FAILED" in result.detail
    assert received == []
