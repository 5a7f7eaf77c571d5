"""Callbacks as people and scripts see them: ``show`` (the callback event, confirmed
by callback, the callbacks waiting), ``providers audit`` (which operations callbacks
settle, the token scheme named weaker, kept callbacks by state), and hostile callback
bodies, which are data: nothing breaks, nothing renders as markup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hookkit import body, hmac_headers, hooks, in_flight, sent
from support import run_cli, sim_conf, write_config

from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.storage import Ledger

ENV = {"HM": "hmac-secret"}
TABLE: dict[str, Any] = {
    "scheme": "hmac-sha256",
    "secret": "${HM}",
    "header": "X-Signature",
    "names": "provider_object_id",
    "key": "/id",
    "status": "/event",
    "applied": ["delivered"],
    "not_applied": ["bounced"],
    "delivered": ["sent"],
}


def post(h: Any, payload: bytes) -> Any:
    return h.handle("sim", "POST", hmac_headers(payload, ENV["HM"]), payload)


@pytest.fixture
def configured(tmp_path: Path, sim: SimServer) -> Path:
    return write_config(tmp_path / "settled.toml", {"sim": {**sim_conf(sim), "callbacks": TABLE}})


def test_show_and_audit_speak_of_callbacks(configured: Path, ledger: Ledger) -> None:
    sent(ledger, "a-1", object_id="m-1", provider="sim")
    in_flight(ledger, "a-2", provider="sim")
    h, _ = hooks(ledger, ENV, provider="sim", **TABLE)
    assert post(h, body(id="m-1", event="delivered")).reason == "matched"
    named = {**TABLE, "names": "action_id", "key": "/action"}
    h2, _ = hooks(ledger, ENV, provider="sim", **named)
    assert post(h2, body(action="a-2", event="delivered")).reason == "pending"
    assert post(h, body(id="nobody", event="sent")).reason == "pending"

    shown = run_cli("show", "a-1")
    assert shown.returncode == 0, shown.stderr
    assert (
        "by callback:sim" in shown.stdout
        and "callback  AWAITING_VERIFICATION → CONFIRMED" in shown.stdout
    )
    assert "body sha256: " in shown.stdout
    data = json.loads(run_cli("show", "a-2", "--json").stdout)
    assert data["pending_callbacks"] == 1 and data["status"] == "IN_FLIGHT"
    assert "callbacks kept" in run_cli("show", "a-2").stdout

    audit = run_cli("providers", "audit", "--json")
    report = json.loads(audit.stdout)
    assert report["callbacks"]["sim"] == {
        "scheme": "hmac-sha256",
        "weaker": False,
        "matched": 1,
        "pending": 2,
        "expired": 0,
        "oldest_pending": report["callbacks"]["sim"]["oldest_pending"],
    }
    ops = {o["operation"]: o for o in report["operations"]}
    assert (
        "settled by signed callbacks once its reply's object id is recorded"
        in ops["deliver"]["callbacks"]
    )
    q2 = next(a for a in ops["deliver"]["answers"] if a["question"] == "q2")
    assert q2["answer"] == "yes" and "hmac-sha256 callback reports the terminal state" in q2["why"]
    assert ops["send"]["figures"]["confirmed_by_callback"] == 1
    text = run_cli("providers", "audit").stdout
    assert "callbacks of sim: hmac-sha256" in text and "pending 2" in text


def test_the_token_scheme_is_named_weaker(tmp_path: Path, sim: SimServer, ledger: Ledger) -> None:
    token = {
        "scheme": "token",
        "secret": "${TOK}",
        "names": "action_id",
        "key": "/a",
        "status": "/s",
        "applied": ["done"],
    }
    write_config(tmp_path / "settled.toml", {"sim": {**sim_conf(sim), "callbacks": token}})
    report = json.loads(run_cli("providers", "audit", "--json").stdout)
    assert report["callbacks"]["sim"]["weaker"] is True
    deliver = next(o for o in report["operations"] if o["operation"] == "deliver")
    q2 = next(a for a in deliver["answers"] if a["question"] == "q2")
    assert q2["answer"] == "partly" and "weaker" in q2["why"]
    assert any("token scheme" in s and "weaker" in s for s in deliver["suggestions"])


HOSTILE = [
    ("markup", {"id": "m-1", "event": "[bold red]delivered[/] \x1b[31m<script>x</script>"}),
    ("bidi", {"id": "m-1", "event": "\u202edereviled\u202c"}),
    ("huge number", {"id": "m-1", "event": 10**300}),
    ("infinity", None),
    ("deep", None),
    ("surrogate", None),
    ("key of markup", {"id": "[link=file:///etc/passwd]m-1[/link]", "event": "delivered"}),
]


def hostile_body(name: str, fields: Any) -> bytes:
    if name == "infinity":
        return b'{"id": "m-1", "event": 1e999}'
    if name == "deep":
        return b'{"id": "m-1", "event": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if name == "surrogate":
        return b'{"id": "m-1\\ud800", "event": "\\udfff"}'
    return json.dumps(fields).encode()


@pytest.mark.parametrize(("name", "fields"), HOSTILE, ids=[n for n, _ in HOSTILE])
def test_a_hostile_callback_body_is_data(
    configured: Path, ledger: Ledger, name: str, fields: Any
) -> None:
    sent(ledger, "a-1", object_id="m-1", provider="sim")
    h, _ = hooks(ledger, ENV, provider="sim", max_body=1024 * 1024, **TABLE)
    got = post(h, hostile_body(name, fields))
    assert got.status in (200, 400), got  # read as data, or refused as malformed
    rec = ledger.get("a-1")
    assert rec.status is Status.AWAITING_VERIFICATION  # no declared value was reported
    shown = run_cli("show", "a-1")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr
    assert "\x1b" not in shown.stdout and "\u202e" not in shown.stdout
    as_json = run_cli("show", "a-1", "--json")
    events = json.loads(as_json.stdout)["events"]
    for e in events:
        if e["kind"] == "callback":
            assert len(e["detail"]["status"]) <= 200
            assert e["detail"]["status"] in (
                "[bold red]delivered[/] \x1b[31m<script>x</script>",
                "\u202edereviled\u202c",
                "(a huge number)",
                "Infinity",
            )
    if name == "markup":
        assert "[bold red]delivered[/]" in shown.stdout and "\\x1b" in shown.stdout
    if name == "bidi":
        assert "\\u202e" in shown.stdout
