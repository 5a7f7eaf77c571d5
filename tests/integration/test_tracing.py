"""OpenTelemetry traces: spans for each dispatch, try, check, callback and verdict with
the action's attributes, HTTP client spans named as the semantic conventions say, the
W3C traceparent a stand-in provider on 127.0.0.1 received, and a caller's traceparent
continued by `settled serve`. Read through the SDK's own InMemorySpanExporter."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from standins import Call, Reply, StandIn, ok

from settled import Ledger, tracing
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.reconcile import Reconciler
from settled.resolve import resolve

TOKEN = "s3cr3t-token-4242"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


class Mail:
    """A mail API: POST /v1/messages queues (202), GET /v1/messages/{key} tells."""

    def __init__(self) -> None:
        self.status = "delivered"
        self.down = False

    def __call__(self, call: Call) -> Reply:
        if call.method == "POST":
            return ok({"id": "msg-1", "status": "queued"}, 202)
        if self.down:
            return Reply(503, {"error": "unavailable"})
        return ok({"status": self.status})


def mail_conf(url: str) -> dict[str, Any]:
    return {
        "type": "http",
        "base_url": url,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "operations": {
            "send": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "request": {"method": "POST", "path": "/v1/messages", "query": {"key": TOKEN}},
                "reconciliation_key_field": "reconciliation_key",
                "query": {"method": "GET", "path": "/v1/messages/{reconciliation_key}"},
                "status": "/status",
                "applied": ["delivered"],
                "not_applied": ["bounced"],
                "verify": {"interval": 0.01, "deadline": 600.0, "min_checks": 1},
            }
        },
    }


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def no_secret_in(exporter: InMemorySpanExporter) -> None:
    for s in exporter.get_finished_spans():
        assert TOKEN not in repr(dict(s.attributes or {})), s.name


def test_a_dispatch_is_a_span_with_its_tries_and_their_http_requests(
    spans: InMemorySpanExporter, ledger: Ledger
) -> None:
    mail = Mail()
    host = StandIn(mail)
    try:
        with Registry({"mail": mail_conf(host.url)}, source="test") as reg:
            report = Dispatcher(ledger, reg).submit("mail", "send", {"to": "a@b"}, action_id="o-1")
        (sent,) = host.sent("POST")
    finally:
        host.close()
    assert report.record is not None and report.record.status is Status.AWAITING_VERIFICATION
    (dispatch,) = by_name(spans, "settled.dispatch")
    (attempt,) = by_name(spans, "settled.try")
    (http,) = by_name(spans, "POST")
    assert dict(dispatch.attributes or {}) == {
        "settled.action_id": "o-1",
        "settled.provider": "mail",
        "settled.operation": "send",
        "settled.tier": "reconcilable",
        "settled.attempt": 1,
        "settled.outcome": "dispatched",
        "settled.status": "AWAITING_VERIFICATION",
        "settled.result": "accepted",
    }
    assert attempt.parent is not None and attempt.parent.span_id == dispatch.context.span_id
    assert (attempt.attributes or {})["settled.try"] == 1
    assert (attempt.attributes or {})["settled.outcome"] == "accepted"
    # the HTTP client span, as the semantic conventions name it
    assert http.kind is SpanKind.CLIENT
    assert http.parent is not None and http.parent.span_id == attempt.context.span_id
    port = int(host.url.rsplit(":", 1)[1])
    assert dict(http.attributes or {}) == {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "url.full": f"http://127.0.0.1:{port}/v1/messages?key=REDACTED",
        "http.response.status_code": 202,
    }
    # the provider got the W3C traceparent of that very request's span
    m = TRACEPARENT.fullmatch(sent.header("traceparent"))
    assert m, sent.headers
    assert m.group(1) == f"{http.context.trace_id:032x}"
    assert m.group(2) == f"{http.context.span_id:016x}"
    assert {s.context.trace_id for s in (dispatch, attempt, http)} == {http.context.trace_id}
    no_secret_in(spans)


def test_each_check_is_a_span_with_what_it_saw(spans: InMemorySpanExporter, ledger: Ledger) -> None:
    mail = Mail()
    host = StandIn(mail)
    try:
        with Registry({"mail": mail_conf(host.url)}, source="test") as reg:
            Dispatcher(ledger, reg).submit("mail", "send", {"to": "a@b"}, action_id="o-2")
            spans.clear()
            mail.down = True
            Reconciler(ledger, reg).run_ids(["o-2"])
            mail.down = False
            Reconciler(ledger, reg).run_ids(["o-2"])
        queries = host.sent("GET")
    finally:
        host.close()
    assert ledger.get("o-2").status is Status.CONFIRMED
    checks = by_name(spans, "settled.check")
    assert [(c.attributes or {})["settled.outcome"] for c in checks] == ["paused", "applied"]
    for c in checks:
        assert (c.attributes or {})["settled.action_id"] == "o-2"
        assert (c.attributes or {})["settled.tier"] == "reconcilable"
    gets = by_name(spans, "GET")
    assert [(g.attributes or {})["http.response.status_code"] for g in gets] == [503, 200]
    assert gets[0].status.status_code is StatusCode.ERROR
    assert (gets[0].attributes or {})["error.type"] == "503"
    assert [g.parent.span_id for g in gets if g.parent] == [c.context.span_id for c in checks]
    assert [q.header("traceparent")[3:35] for q in queries] == [
        f"{g.context.trace_id:032x}" for g in gets
    ]
    no_secret_in(spans)


def test_an_unreachable_provider_is_a_client_span_with_its_error_type(
    spans: InMemorySpanExporter, ledger: Ledger
) -> None:
    host = StandIn(Mail())
    url = host.url
    host.close()  # nothing listens there now: the connection is refused
    with Registry({"mail": mail_conf(url)}, source="test") as reg:
        report = Dispatcher(ledger, reg).submit("mail", "send", {"to": "a@b"}, action_id="o-3")
    assert report.record is not None
    posts = by_name(spans, "POST")
    assert posts and all(p.status.status_code is StatusCode.ERROR for p in posts)
    assert {(p.attributes or {}).get("error.type") for p in posts} == {"ConnectError"}
    assert all("http.response.status_code" not in (p.attributes or {}) for p in posts)


def test_a_verdict_is_a_span_refused_or_recorded(
    spans: InMemorySpanExporter, ledger: Ledger
) -> None:
    from settled.errors import TransitionNotAllowed

    mail = Mail()
    host = StandIn(mail)
    try:
        with Registry({"mail": mail_conf(host.url)}, source="test") as reg:
            Dispatcher(ledger, reg).submit("mail", "send", {"to": "a@b"}, action_id="o-4")
            now = ledger.clock().now()
            with pytest.raises(TransitionNotAllowed):  # it is verified automatically
                resolve(ledger, "o-4", applied=True, reason="seen", by="ana", now=now)
    finally:
        host.close()
    (refused,) = by_name(spans, "settled.verdict")
    assert (refused.attributes or {})["settled.outcome"] == "refused"
    assert (refused.attributes or {})["error.type"] == "TransitionNotAllowed"


def test_a_person_s_verdict_is_a_span_with_the_status_it_made(
    spans: InMemorySpanExporter, ledger: Ledger, sim: Any
) -> None:
    from support import sim_conf

    sim.plan("v-1", "timeout_after_apply")
    with Registry({"sim": sim_conf(sim)}, source="test") as reg:
        rec = Dispatcher(ledger, reg).submit("sim", "notify", {}, action_id="v-1").record
        assert rec is not None and rec.status is Status.DENIED_UNRESOLVED
        resolve(
            ledger,
            "v-1",
            applied=True,
            reason="the customer has it",
            by="ana",
            now=ledger.clock().now(),
        )
    (verdict,) = by_name(spans, "settled.verdict")
    assert dict(verdict.attributes or {}) == {
        "settled.action_id": "v-1",
        "settled.provider": "sim",
        "settled.operation": "notify",
        "settled.tier": "blind",
        "settled.applied": True,
        "settled.outcome": "recorded",
        "settled.status": "CONFIRMED",
    }


@pytest.mark.ledger_free
def test_url_full_keeps_no_user_info_and_no_query_value() -> None:
    assert (
        tracing.url_full("https://u:pw@api.example.com:8443/v1/x?token=abc&n=2#frag")
        == "https://REDACTED:REDACTED@api.example.com:8443/v1/x?token=REDACTED&n=REDACTED"
    )
    assert tracing.url_full("http://h/p") == "http://h/p"


def test_serve_continues_the_callers_trace(
    spans: InMemorySpanExporter, tmp_path: Path, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving import auth, in_process, token_env, write_serve_config

    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    write_serve_config(tmp_path / "settled.toml", sim)
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with in_process() as (client, _lines):
        r = client.post(
            "/api/v1/actions",
            json={"provider": "sim", "operation": "book", "action_id": "t-1", "params": {}},
            headers={**auth("sender"), "traceparent": f"00-{caller_trace}-{caller_span}-01"},
        )
        assert r.status_code == 201, r.text
        plain = client.post(
            "/api/v1/actions",
            json={"provider": "sim", "operation": "book", "action_id": "t-2", "params": {}},
            headers=auth("sender"),
        )
        assert plain.status_code == 201
    first, second = by_name(spans, "settled.dispatch")
    assert (first.attributes or {})["settled.action_id"] == "t-1"
    assert f"{first.context.trace_id:032x}" == caller_trace
    assert first.parent is not None and f"{first.parent.span_id:016x}" == caller_span
    assert second.parent is None  # no traceparent: a trace of its own
    assert second.context.trace_id != first.context.trace_id


def test_without_the_package_nothing_is_imported_and_no_header_is_sent(tmp_path: Path) -> None:
    """A process where opentelemetry cannot be imported (the extra not installed)
    dispatches as before: no traceparent reaches the provider, and importing the
    core never tries the package (its first span would)."""
    import subprocess
    import sys

    host = StandIn(Mail())
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
import settled.dispatch, settled.reconcile, settled.providers._wire, settled.tracing
assert not settled.tracing._state, "nothing tried before a span"
from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
conf = {mail_conf(host.url)!r}
with Ledger.open({str(tmp_path / "l.db")!r}) as led, Registry({{"mail": conf}}, source="t") as reg:
    Dispatcher(led, reg).submit("mail", "send", {{"to": "a@b"}}, action_id="n-1")
assert not settled.tracing.enabled()
"""
    try:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
        (sent,) = host.sent("POST")
    finally:
        host.close()
    assert out.returncode == 0, out.stderr
    assert sent.header("traceparent") == ""


def test_each_callback_event_is_a_span_with_what_became_of_it(
    spans: InMemorySpanExporter, ledger: Ledger
) -> None:
    from hookkit import body, hmac_headers, hooks, sent
    from test_callbacks import ENV, TABLE

    from settled.model import Tier

    sent(ledger, object_id="m-1", tier=Tier.PARTIAL)
    h, _ = hooks(ledger, ENV, **TABLE)
    for eid in ("e-1", "e-1"):  # the second delivery of the same event is a duplicate
        payload = body(id="m-1", event="delivered", eid=eid)
        h.handle("p", "POST", hmac_headers(payload, ENV["HM"]), payload)
    first, again = by_name(spans, "settled.callback")
    assert dict(first.attributes or {}) == {
        "settled.provider": "p",
        "settled.callback.event_id": "e-1",
        "settled.callback.status": "delivered",
        "settled.outcome": "matched",
        "settled.action_id": "a-1",
    }
    assert (again.attributes or {})["settled.outcome"] == "duplicate"
    assert "hmac-secret" not in repr([dict(s.attributes or {}) for s in spans.get_finished_spans()])
