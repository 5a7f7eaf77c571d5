"""Bad callbacks through a real ``settled serve`` on 127.0.0.1: a wrong or missing
signature and a stale or future timestamp are 401 with no detail, an unknown provider
404, a body over ``[serve] max_body`` 413 (announced or streamed), a signed body that
cannot be read 400, another method 405. None of them changes the ledger; each is
counted in ``settled_callbacks_total{provider,reason}`` and named in its log line,
which never holds the body. Then one good callback does move the record, and that is
counted too (the checks above could not pass by a service that counts nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hookkit import STD_SECRET, body, sent, snapshot, std_headers
from serving import Running, auth, env_name, process
from support import run_cli, sim_conf, write_config

from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.storage import Ledger

MARK = "body-text-that-must-never-be-logged"
TABLE = {
    "scheme": "standard-webhooks",
    "secret": "${STD_HOOK_SECRET}",
    "names": "provider_object_id",
    "key": "/data/id",
    "status": "/data/status",
    "applied": ["delivered"],
    "not_applied": ["bounced"],
    "delivered": ["sent"],
}
ENV = {"STD_HOOK_SECRET": STD_SECRET}


def callback_counts(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "settled_callbacks_total":
                out[(s.labels["provider"], s.labels["reason"])] = s.value
    return out


def transitions(url: str) -> dict[tuple[str, str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (s.labels["from_status"], s.labels["to_status"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "settled_transitions_total"
    }


@pytest.fixture
def service(tmp_path: Path, sim: SimServer) -> Iterator[Running]:
    reader = {"secret": f"${{{env_name('reader')}}}", "roles": ["read"]}
    write_config(
        tmp_path / "settled.toml",
        {"sim": {**sim_conf(sim), "callbacks": TABLE}},
        **{"serve.tokens.reader": reader},
    )
    with process(env=ENV) as svc:
        yield svc


def now() -> datetime:
    return datetime.now(UTC)


def test_refused_callbacks_change_nothing_and_are_counted_and_logged(
    service: Running, ledger: Ledger
) -> None:
    sent(ledger, "a-1", object_id="m-1", provider="sim")
    before = snapshot(ledger, "a-1")
    url = f"{service.url}/hooks/sim"
    good = body(type="x", data={"id": "m-1", "status": "delivered", "note": MARK})
    signed = std_headers(good, ts=now())
    wrong = std_headers(good, ts=now(), secret="whsec_" + "d3Jvbmctc2VjcmV0LWZvci10ZXN0cw==")
    missing = {k: v for k, v in signed.items() if k != "webhook-signature"}
    tampered = good.replace(b"delivered", b"bounced__")
    stale = std_headers(good, ts=now() - timedelta(seconds=400), msg_id="msg_stale")
    future = std_headers(good, ts=now() + timedelta(seconds=400), msg_id="msg_future")
    unreadable = f"not json {MARK}".encode()
    huge = b"{" + b" " * (1024 * 1024) + b"}"

    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * 65536  # 1.06 MiB with no Content-Length: refused as it streams

    cases: list[tuple[str, int, str, dict[str, Any]]] = [
        ("wrong secret", 401, "bad_signature", {"content": good, "headers": wrong}),
        ("missing signature", 401, "bad_signature", {"content": good, "headers": missing}),
        ("tampered body", 401, "bad_signature", {"content": tampered, "headers": signed}),
        ("stale", 401, "stale", {"content": good, "headers": stale}),
        ("future", 401, "stale", {"content": good, "headers": future}),
        (
            "malformed",
            400,
            "malformed",
            {"content": unreadable, "headers": std_headers(unreadable, ts=now(), msg_id="msg_bad")},
        ),
        ("announced too large", 413, "too_large", {"content": huge, "headers": signed}),
        ("streamed too large", 413, "too_large", {"content": chunks(), "headers": signed}),
    ]
    with httpx.Client(timeout=60) as c:
        for what, code, _reason, kw in cases:
            r = c.post(url, **kw)
            assert r.status_code == code, (what, r.text)
            if code == 401:  # no detail: nothing tells a forger what was wrong
                assert r.json() == {"error": "unauthorized"}, what
            assert MARK not in r.text
        r = c.post(f"{service.url}/hooks/{MARK}", content=good, headers=signed)
        assert r.status_code == 404, r.text
        r = c.get(url)
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = c.get(f"{service.url}/hooks/{MARK}")  # the sender's path text is no label
        assert r.status_code == 405
        assert snapshot(ledger, "a-1") == before  # none of them changed the ledger

        counts = callback_counts(service.url)
        assert MARK not in c.get(f"{service.url}/metrics").text
        assert counts == {
            ("sim", "bad_signature"): 3,
            ("sim", "stale"): 2,
            ("sim", "malformed"): 1,
            ("sim", "too_large"): 2,
            ("-", "unknown_provider"): 1,
            ("sim", "method"): 1,
            ("-", "method"): 1,
        }

        # the same body, signed and fresh, is evidence: it moves the record and counts
        r = c.post(url, content=good, headers=std_headers(good, ts=now(), msg_id="msg_ok"))
        assert r.status_code == 200 and r.json() == {"received": 1, "matched": 1}, r.text
        again = c.post(url, content=good, headers=std_headers(good, ts=now(), msg_id="msg_ok"))
        assert again.status_code == 200 and again.json() == {"received": 1, "duplicate": 1}
        assert callback_counts(service.url)[("sim", "matched")] == 1
        assert callback_counts(service.url)[("sim", "duplicate")] == 1
        moved = transitions(service.url)
        assert moved[("AWAITING_VERIFICATION", "CONFIRMED", "callback")] == 1
        # "confirmed by callback" wherever a record is read: the API, show, the audit
        shown = c.get(f"{service.url}/api/v1/actions/a-1", headers=auth("reader")).json()
        assert shown["status"] == "CONFIRMED" and shown["confirmed_by"] == "callback:sim"
        assert [e["kind"] for e in shown["events"]][-1] == "callback"
    rec = ledger.get("a-1")
    assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:sim"
    assert json.loads(run_cli("show", "a-1", "--json").stdout)["confirmed_by"] == "callback:sim"
    report = json.loads(run_cli("providers", "audit", "--json").stdout)
    ops = {o["operation"]: o for o in report["operations"] if o["provider"] == "sim"}
    assert ops["send"]["figures"]["confirmed_by_callback"] == 1
    assert report["callbacks"]["sim"]["matched"] == 1
    assert "confirmed by callback 1" in run_cli("providers", "audit").stdout

    assert service.stop() == 0
    lines = [e for e in service.rest() if e.get("event") == "request"]
    hooks = [e for e in lines if e["route"] == "/hooks/{provider}"]
    reasons = [(e["status"], e["callback"]["reason"], e["callback"]["provider"]) for e in hooks]
    assert reasons == [
        (401, "bad_signature", "sim"),
        (401, "bad_signature", "sim"),
        (401, "bad_signature", "sim"),
        (401, "stale", "sim"),
        (401, "stale", "sim"),
        (400, "malformed", "sim"),
        (413, "too_large", "sim"),
        (413, "too_large", "sim"),
        (404, "unknown_provider", "-"),
        (405, "method", "sim"),
        (405, "method", "-"),
        (200, "matched", "sim"),
        (200, "duplicate", "sim"),
    ]
    logged = json.dumps(service.seen)
    assert MARK not in logged and STD_SECRET not in logged
    assert STD_SECRET.removeprefix("whsec_") not in logged


@pytest.mark.parametrize(
    ("scheme", "extra", "headers"),
    [
        ("standard-webhooks", {}, {"webhook-id", "webhook-timestamp", "webhook-signature"}),
        ("stripe", {}, {"stripe-signature"}),
        ("github", {}, {"x-hub-signature-256", "x-github-delivery"}),
        ("twilio", {"url": "https://hooks.example.com/hooks/p"}, {"x-twilio-signature"}),
        ("hmac-sha256", {"header": "X-Signature"}, {"x-signature"}),
        ("token", {}, set()),
    ],
)
def test_a_callback_without_its_schemes_signature_header_is_refused_unread(
    scheme: str, extra: dict[str, Any], headers: set[str]
) -> None:
    """The headers whose absence refuses a callback before its body is read are the
    ones its verifier refuses without: taking any one away is a refusal."""
    from hookkit import callbacks_config

    from settled.callbacks.verify import Refused, Verifier, required_headers

    table = {**TABLE, "scheme": scheme, "secret": "${S}", **extra}
    cfg = callbacks_config("p", **table)["p"]
    assert {h.lower() for h in required_headers(cfg)} == headers
    verifier = Verifier(cfg, STD_SECRET)
    full = {h: "x" for h in headers}
    for name in headers:
        with pytest.raises(Refused):
            verifier.check({k: v for k, v in full.items() if k != name}, b"{}", "", now())
