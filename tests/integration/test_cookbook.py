"""Every docs/cookbook entry loads, and builds exactly the request its API documents:
method, URL, headers and body, checked byte for byte with ``httpx.MockTransport`` (no
network). The verifying query and the reading of its replies are checked too."""

from __future__ import annotations

import base64
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
from support import run_cli

from settled import config
from settled.model import Tier
from settled.providers import Registry
from settled.providers.base import QueryTarget, Request, Seen, Wire

pytestmark = pytest.mark.ledger_free

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK = ROOT / "docs" / "cookbook"
ENV = {
    "STRIPE_SECRET_KEY": "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "MC_ACCESS_TOKEN": "mc-token-0123456789",
    "TWILIO_ACCOUNT_SID": "AC5a1e0c4f7e2b9d8c3a6f1e0d9c8b7a6f",  # not the docs' example
    "TWILIO_AUTH_TOKEN": "twilio-auth-token-xyz",
    "GITHUB_TOKEN": "github_pat_11AAAAAA",
    "HOOK_SECRET": "hook-secret-42",
}


def toml_of(entry: str) -> str:
    text = (COOKBOOK / entry).read_text()
    return "\n".join(re.findall(r"```toml\n(.*?)```", text, re.S))


class Wire_:
    """A mock API: answers each request with the next queued reply; keeps what it got."""

    def __init__(self) -> None:
        self.replies: list[httpx.Response] = []
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.seen.append(request)
        return self.replies.pop(0)


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], tuple[Registry, Wire_]]]:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    opened: list[Registry] = []

    def load(entry: str) -> tuple[Registry, Wire_]:
        wire = Wire_()
        cfg = config.from_dict(tomllib.loads(toml_of(entry)), source=entry)
        reg = Registry(
            cfg.providers, source=entry, client=httpx.Client(transport=httpx.MockTransport(wire))
        )
        reg.load_all()
        opened.append(reg)
        return reg, wire

    yield load
    for reg in opened:
        reg.close()
        reg.client.close()


def send(reg: Registry, provider: str, op: str, params: Any, key: str | None = None) -> Any:
    p = reg.provider(provider)
    p.check_params(op, params)  # type: ignore[attr-defined]
    return p.execute(Request("act-1", op, params, "act-1:1", key, 1, 5.0))


def query(
    reg: Registry, provider: str, op: str, params: Any, key: str | None, oid: str | None
) -> Any:
    return reg.provider(provider).query(QueryTarget("act-1", op, params, key, oid, None, 1))


def form(request: httpx.Request) -> list[tuple[str, str]]:
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    return parse_qsl(request.content.decode(), keep_blank_values=True)


def test_every_entry_is_tested_and_listed() -> None:
    entries = sorted(p.name for p in COOKBOOK.glob("*.md") if p.name != "README.md")
    readme = (COOKBOOK / "README.md").read_text()
    from test_cookbook_standins import RUNS

    assert entries == sorted({*ENTRY_TESTS, *RUNS})
    assert all(f"]({e})" in readme for e in entries)


def test_stripe_refund(api: Callable[[str], tuple[Registry, Wire_]]) -> None:
    reg, wire = api("stripe-refunds.md")
    spec = reg.operation("stripe", "refund")
    assert (spec.tier, spec.dedupes_keys, spec.conflict_statuses) == (Tier.FULL, True, (409,))
    wire.replies.append(
        httpx.Response(200, json={"id": "re_1", "object": "refund", "status": "succeeded"})
    )
    r = send(reg, "stripe", "refund", {"payment_intent": "pi_123", "amount": 500})
    [sent] = wire.seen
    assert (sent.method, str(sent.url)) == ("POST", "https://api.stripe.com/v1/refunds")
    assert sent.headers["authorization"] == "Bearer " + ENV["STRIPE_SECRET_KEY"]
    assert sent.headers["idempotency-key"] == "act-1:1"
    assert sent.headers["stripe-version"] == "2024-06-20"
    assert form(sent) == [
        ("payment_intent", "pi_123"),
        ("amount", "500"),
        ("metadata[settled_action]", "act-1"),
    ]
    assert (r.applied, r.object_id) == (True, "re_1")
    wire.replies.append(httpx.Response(200, json={"id": "re_2", "status": "pending"}))
    assert send(reg, "stripe", "refund", {"payment_intent": "pi_9"}).applied is None
    wire.replies.append(httpx.Response(409, json={"error": {"type": "idempotency_error"}}))
    assert send(reg, "stripe", "refund", {"payment_intent": "pi_9"}).conflict is True
    wire.replies.append(httpx.Response(200, json={"id": "re_2", "status": "failed"}))
    o = query(reg, "stripe", "refund", {}, None, "re_2")
    assert (
        o.seen is Seen.NOT_APPLIED
        and str(wire.seen[-1].url) == "https://api.stripe.com/v1/refunds/re_2"
    )


def test_email_queued(api: Callable[[str], tuple[Registry, Wire_]]) -> None:
    reg, wire = api("email-queued.md")
    params = {"definition": "order-shipped", "contact": "c-1", "to": "ada@example.com"}
    wire.replies.append(
        httpx.Response(202, json={"requestId": "r1", "responses": [{"messageKey": "stl-k1"}]})
    )
    r = send(reg, "mc", "send_email", params, key="stl-k1")
    [sent] = wire.seen
    assert str(sent.url) == (
        "https://your-subdomain.rest.marketingcloudapis.com/messaging/v1/email/messages/stl-k1"
    )
    assert sent.headers["authorization"] == "Bearer " + ENV["MC_ACCESS_TOKEN"]
    assert json.loads(sent.content) == {
        "definitionKey": "order-shipped",
        "recipient": {"contactKey": "c-1", "to": "ada@example.com"},
    }
    assert "idempotency-key" not in sent.headers
    assert (r.wire, r.status_code, r.applied) == (Wire.ANSWERED, 202, None)
    for body, seen in (
        ({"eventCategoryType": "TransactionalSendEvents.EmailQueued"}, Seen.NOT_YET),
        ({"eventCategoryType": "TransactionalSendEvents.EmailSent"}, Seen.APPLIED),
        ({"eventCategoryType": "TransactionalSendEvents.EmailNotSent"}, Seen.NOT_APPLIED),
    ):
        wire.replies.append(
            httpx.Response(200, json={"requestId": "r2", "messageKey": "stl-k1", **body})
        )
        assert query(reg, "mc", "send_email", params, "stl-k1", None).seen is seen
    assert wire.seen[-1].url.path == "/messaging/v1/email/messages/stl-k1"


def test_twilio_sms(api: Callable[[str], tuple[Registry, Wire_]]) -> None:
    reg, wire = api("twilio-messages.md")
    params = {
        "to": "+15558675310",
        "from": "+15017122661",
        "body": "Hi",
        "media": ["https://x.test/a.png", "https://x.test/b.png"],
    }
    wire.replies.append(httpx.Response(201, json={"sid": "SM1", "status": "queued"}))
    r = send(reg, "twilio", "sms", params, key="stl-k1")
    [sent] = wire.seen
    sid = ENV["TWILIO_ACCOUNT_SID"]
    assert str(sent.url) == f"https://api.twilio.com/2010-04-01/Accounts/{sid}/Messages.json"
    basic = base64.b64encode(f"{sid}:{ENV['TWILIO_AUTH_TOKEN']}".encode()).decode()
    assert sent.headers["authorization"] == f"Basic {basic}"
    assert form(sent) == [
        ("To", "+15558675310"),
        ("From", "+15017122661"),
        ("Body", "Hi"),
        ("MediaUrl", "https://x.test/a.png"),
        ("MediaUrl", "https://x.test/b.png"),
    ]
    assert (r.status_code, r.applied, r.object_id) == (201, None, "SM1")
    for status, seen in (
        ("sending", Seen.NOT_YET),
        ("sent", Seen.NOT_YET),
        ("delivered", Seen.APPLIED),
        ("undelivered", Seen.NOT_APPLIED),
        ("failed", Seen.NOT_APPLIED),
    ):
        wire.replies.append(httpx.Response(200, json={"sid": "SM1", "status": status}))
        assert query(reg, "twilio", "sms", params, None, "SM1").seen is seen
    assert str(wire.seen[-1].url).endswith(f"/Accounts/{sid}/Messages/SM1.json")


def test_twilio_takes_the_account_from_the_environment(
    api: Callable[[str], tuple[Registry, Wire_]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry says to set the account and sends no placeholder: the SID comes from
    ${TWILIO_ACCOUNT_SID}, and without it settled refuses with one line naming it."""
    text = (COOKBOOK / "twilio-messages.md").read_text()
    conf = toml_of("twilio-messages.md")
    assert "${TWILIO_ACCOUNT_SID}" in re.search(r'base_url = "([^"]+)"', conf).group(1)  # type: ignore[union-attr]
    assert not re.search(r"AC[X0-9a-f]{32}", conf), "a literal account id in the config"
    assert "Set your own account" in text and "TWILIO_ACCOUNT_SID" in text
    monkeypatch.delenv("TWILIO_ACCOUNT_SID")
    cfg = config.from_dict(tomllib.loads(conf), source="settled.toml")
    reg = Registry(cfg.providers, source="settled.toml")
    with pytest.raises(
        Exception, match="base_url: environment variable TWILIO_ACCOUNT_SID is not set"
    ) as err:
        reg.load_all()
    assert "\n" not in str(err.value)
    reg.close()


def test_github_issue(api: Callable[[str], tuple[Registry, Wire_]]) -> None:
    reg, wire = api("github-issues.md")
    params = {"owner": "octo-org", "repo": "octo-repo", "title": "Found a bug", "labels": ["bug"]}
    wire.replies.append(httpx.Response(201, json={"id": 1, "number": 1347, "state": "open"}))
    r = send(reg, "github", "open_issue", params)
    [sent] = wire.seen
    assert str(sent.url) == "https://api.github.com/repos/octo-org/octo-repo/issues"
    assert sent.headers["accept"] == "application/vnd.github+json"
    assert sent.headers["x-github-api-version"] == "2022-11-28"
    assert sent.headers["authorization"] == "Bearer " + ENV["GITHUB_TOKEN"]
    assert json.loads(sent.content) == {"title": "Found a bug", "labels": ["bug"]}
    assert (r.status_code, r.applied, r.object_id) == (201, True, "1347")
    spec = reg.operation("github", "open_issue")
    assert (spec.tier, spec.queryable, spec.dedupes_keys) == (Tier.FULL, False, False)
    with pytest.raises(Exception, match="another resource"):
        reg.provider("github").check_params("open_issue", {**params, "repo": ".."})  # type: ignore[attr-defined]


def test_blind_webhook(api: Callable[[str], tuple[Registry, Wire_]]) -> None:
    reg, wire = api("webhook-blind.md")
    wire.replies.append(httpx.Response(204))
    r = send(reg, "hooks", "deploy_notice", {"text": "v1.2.3 is live"})
    [sent] = wire.seen
    assert str(sent.url) == "https://hooks.example.com/incoming/deploys"
    assert sent.headers["x-hook-secret"] == ENV["HOOK_SECRET"]
    assert json.loads(sent.content) == {
        "text": "v1.2.3 is live",
        "source": "settled",
        "action": "act-1",
    }
    spec = reg.operation("hooks", "deploy_notice")
    assert (spec.tier, spec.attempts, spec.carries_key) == (Tier.BLIND, 1, False)
    assert r.status_code == 204


ENTRY_TESTS = {
    "stripe-refunds.md": test_stripe_refund,
    "email-queued.md": test_email_queued,
    "twilio-messages.md": test_twilio_sms,
    "github-issues.md": test_github_issue,
    "webhook-blind.md": test_blind_webhook,
}


@pytest.mark.parametrize(
    ("entry", "provider", "op", "params"),
    [
        ("stripe-refunds.md", "stripe", "refund", {"payment_intent": "pi_123", "amount": 500}),
        (
            "twilio-messages.md",
            "twilio",
            "sms",
            {"to": "+1555", "from": "+1501", "body": "[bold]x[/]\x1b[2J"},
        ),
    ],
)
def test_render_shows_what_execute_sends(
    api: Callable[[str], tuple[Registry, Wire_]], entry: str, provider: str, op: str, params: Any
) -> None:
    reg, wire = api(entry)
    shown = reg.provider(provider).render(op, params, action_id="act-1")  # type: ignore[attr-defined]
    wire.replies.append(httpx.Response(201, json={"id": "x", "sid": "x", "status": "queued"}))
    send(reg, provider, op, params, key="stl-KEY")
    [sent] = wire.seen
    # The account SID came from ${TWILIO_ACCOUNT_SID}: a secret wherever it appears.
    url = str(sent.url).replace(ENV["TWILIO_ACCOUNT_SID"], "***")
    assert shown["request"]["url"] == url and shown["request"]["method"] == sent.method
    assert shown["request"]["body"] == sent.content.decode()
    headers = dict(shown["request"]["headers"])
    assert headers["Authorization"].endswith("***")
    assert not any(v in json.dumps(shown) for v in ENV.values())


def test_providers_render_command(tmp_path: Path) -> None:
    (tmp_path / "settled.toml").write_text(toml_of("stripe-refunds.md"))
    env = {**ENV, "SETTLED_CONFIG": str(tmp_path / "settled.toml")}
    params = '{"payment_intent": "pi_[red]1[/]", "amount": 500}'
    out = run_cli("providers", "render", "stripe", "refund", "--params", params, env=env)
    assert out.returncode == 0, out.stderr
    assert "request: POST https://api.stripe.com/v1/refunds" in out.stdout
    assert "Authorization: Bearer ***" in out.stdout and ENV["STRIPE_SECRET_KEY"] not in out.stdout
    assert "payment_intent=pi_%5Bred%5D1%5B%2F%5D&amount=500" in out.stdout  # data, not markup
    assert "query: GET https://api.stripe.com/v1/refunds/OBJECT-ID" in out.stdout
    js = run_cli("providers", "render", "stripe", "refund", "--params", params, "--json", env=env)
    assert js.returncode == 0 and json.loads(js.stdout)["request"]["method"] == "POST"
    bad = run_cli("providers", "render", "stripe", "refund", "--params", "{}", env=env)
    assert bad.returncode == 1 and "params need 'payment_intent'" in bad.stderr
    assert not Path(env["SETTLED_CONFIG"]).with_name("ledger.db").exists()
