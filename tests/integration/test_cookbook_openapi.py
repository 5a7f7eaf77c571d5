"""Each request a cookbook entry builds, validated with openapi-core against the
provider's own published OpenAPI description (the excerpts under
``tests/vendor/openapi/``, with their source, commit and licence in its README): the
path and method exist, the parameters and the body fit the schemas, the credentials go
where the description says. The send and, where the entry has one, the query.

Providers without a published OpenAPI description are not here, and the README there
says what checks them instead (Google's discovery document, for Calendar)."""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_core import OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest
from openapi_core.exceptions import OpenAPIError
from test_cookbook_standins import ENV as STANDIN_ENV
from test_cookbook_standins import toml_of
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request as WerkzeugRequest

from settled import config
from settled.providers import Registry
from settled.providers.base import QueryTarget, Request

pytestmark = pytest.mark.ledger_free

VENDOR = Path(__file__).resolve().parents[1] / "vendor" / "openapi"
ENV = {
    **STANDIN_ENV,
    "TWILIO_ACCOUNT_SID": "AC5a1e0c4f7e2b9d8c3a6f1e0d9c8b7a6f",
    "TWILIO_AUTH_TOKEN": "twilio-auth-token-xyz",
}


def description(name: str, **servers: str) -> OpenAPI:
    return _description(name, tuple(servers.values()))


@functools.lru_cache(maxsize=16)  # checking a description once is most of the cost
def _description(name: str, servers: tuple[str, ...]) -> OpenAPI:
    spec = json.loads((VENDOR / name).read_text())
    for url in servers:
        spec["servers"] = [*spec.get("servers", []), {"url": url}]
    return OpenAPI.from_dict(spec)


def validate(api: OpenAPI, sent: httpx.Request) -> None:
    """``sent`` as the provider would receive it, validated against ``api``."""
    url = sent.url
    environ = EnvironBuilder(
        method=sent.method,
        base_url=f"{url.scheme}://{url.netloc.decode()}",
        path=url.path,
        query_string=url.query.decode(),
        headers=[(k.decode(), v.decode()) for k, v in sent.headers.raw],
        data=sent.content or None,
    ).get_environ()
    api.validate_request(WerkzeugOpenAPIRequest(WerkzeugRequest(environ)))


class Capture:
    def __init__(self, replies: list[httpx.Response]) -> None:
        self.replies = replies
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.seen.append(request)
        return self.replies.pop(0) if self.replies else httpx.Response(200, json={})


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


def built(
    entry: str, provider: str, op: str, params: Any, reply: httpx.Response
) -> Iterator[httpx.Request]:
    """The send this entry builds for ``params`` and then its query, as on the wire."""
    wire = Capture([reply])
    cfg = config.from_dict(tomllib.loads(toml_of(entry)), source=entry)
    client = httpx.Client(transport=httpx.MockTransport(wire))
    with Registry(cfg.providers, source=entry, client=client) as reg:
        p = reg.provider(provider)
        p.check_params(op, params)  # type: ignore[attr-defined]
        key = "0123456789abcdef0123456789abcdef"
        result = p.execute(Request("act-1", op, params, "act-1:1", key, 1, 5.0))
        yield wire.seen[0]
        if reg.operation(provider, op).queryable:
            target = QueryTarget("act-1", op, params, key, result.object_id, None, 1)
            p.query(target)
            yield wire.seen[1]
    client.close()


CASES = [
    pytest.param(
        "twilio-messages.md",
        "twilio",
        "sms",
        {"to": "+15558675310", "from": "+15017122661", "body": "Your code is 123456"},
        httpx.Response(201, json={"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}),
        "twilio.json",
        {},
        id="twilio-sms",
    ),
    pytest.param(
        "pagerduty-events.md",
        "pagerduty",
        "trigger",
        {"summary": "disk full on db-1", "source": "db-1", "severity": "critical"},
        httpx.Response(202, json={"status": "success", "dedup_key": "act-1:1"}),
        ("pagerduty-events.json", "pagerduty-rest.json"),
        {},
        id="pagerduty-trigger",
    ),
    pytest.param(
        "sendgrid-mail.md",
        "sendgrid",
        "send",
        {"to": "ada@example.com", "from": "shop@example.com", "subject": "Hi", "text": "x"},
        httpx.Response(202, headers={"X-Message-Id": "abc"}),
        "sendgrid.json",
        # The description lists its server as http://; the API is served over https.
        {"https": "https://api.sendgrid.com/v3"},
        id="sendgrid-mail-send",
    ),
    pytest.param(
        "slack-chat.md",
        "slack",
        "post",
        {"channel": "C0123456789", "text": "Deploy 1.4.2 is live"},
        httpx.Response(200, json={"ok": False, "error": "internal_error"}),
        "slack.json",
        {},
        id="slack-chat-postmessage",
    ),
    pytest.param(
        "github-issues.md",
        "github",
        "open_issue",
        {"owner": "octo-org", "repo": "octo-repo", "title": "Found a bug", "labels": ["bug"]},
        httpx.Response(201, json={"number": 1347, "state": "open"}),
        "github.json",
        {},
        id="github-open-issue",
    ),
    pytest.param(
        "github-check-runs.md",
        "github",
        "check_run",
        {
            "owner": "octo-org",
            "repo": "octo-repo",
            "head_sha": "ce587453ced02b1526dfb4cb910479d431683101",
            "name": "settled",
            "conclusion": "success",
            "title": "Deployed",
            "summary": "v1.4.2 is live",
        },
        httpx.Response(201, json={"id": 4, "status": "completed"}),
        "github.json",
        {},
        id="github-check-run",
    ),
]


@pytest.mark.parametrize(("entry", "provider", "op", "params", "reply", "spec", "servers"), CASES)
def test_each_request_fits_the_providers_own_description(
    entry: str,
    provider: str,
    op: str,
    params: Any,
    reply: httpx.Response,
    spec: str | tuple[str, ...],
    servers: dict[str, str],
) -> None:
    specs = [spec] if isinstance(spec, str) else list(spec)
    requests = list(built(entry, provider, op, params, reply))
    assert requests, "nothing was built"
    for i, sent in enumerate(requests):
        validate(description(specs[min(i, len(specs) - 1)], **servers), sent)


def test_a_request_the_description_refuses_is_refused() -> None:
    """The check can fail: a Twilio send without its To is not what Twilio describes."""
    [sent, *_] = built(
        "twilio-messages.md",
        "twilio",
        "sms",
        {"to": "+15558675310", "from": "+15017122661", "body": "x"},
        httpx.Response(201, json={"sid": "SM1", "status": "queued"}),
    )
    broken = httpx.Request(
        sent.method, sent.url, headers=sent.headers, content=b"From=%2B15017122661&Body=x"
    )
    with pytest.raises(OpenAPIError) as err:
        validate(description("twilio.json"), broken)
    assert "To" in repr(err.value.__cause__ or err.value) or "body" in str(err.value).lower()
