"""The API fuzzed from its own OpenAPI description (schemathesis, positive and negative
cases): no 5xx, no status, content type or body outside the description, auth that is
enforced, and no change at all to the ledger's records and events from a request the
API refused (4xx). Bounded: ``FUZZ_EXAMPLES`` per operation, times SETTLED_TEST_BUDGET."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from invariants import scaled
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from serving import auth, token_env, write_serve_config

from settled import Ledger
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=20)

FUZZ_EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def dump() -> list[Any]:
    with Ledger.open(os.environ["SETTLED_DB"], create=False) as led:
        return [(r.to_json(), [e.to_json() for e in evs]) for r, evs in led.export(limit=100_000)]


@pytest.fixture
def api_schema(tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from settled.serve.asgi import build
    from settled.serve.run import open_service

    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    # schemathesis's ASGI client names the host "testserver"
    write_serve_config(tmp_path / "settled.toml", sim, hosts=["testserver"], max_body=65536)
    service = open_service(host="127.0.0.1", port=8780, pool=2, log=lambda _entry: None)
    try:
        app = build(service)
        from starlette.testclient import TestClient

        with TestClient(app, base_url="http://testserver") as seed:  # what positive cases can find
            for aid, op in (("order-42-mail", "notify"), ("seen", "book"), ("sent", "send")):
                r = seed.post(
                    "/api/v1/actions",
                    headers=auth("app"),
                    json={"provider": "sim", "operation": op, "action_id": aid},
                )
                assert r.status_code == 201, r.text
            schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
            # every case is sent with a good token (``send``): a negative case that only
            # drops the Authorization header is then no longer negative, and its 200 is
            # right. Refused tokens are tested in test_serve_auth.
            schema.config.generation.update(with_security_parameters=False)
            yield schema, seed
    finally:
        service.close()


def cases() -> list[tuple[str, str]]:
    """Every operation of the description, by method and path, with valid and with
    invalid input (one test each; the description itself takes no input to spoil)."""
    from settled.serve.api import ENDPOINTS

    ops = [f"{e.op.method} {e.op.path}" for e in ENDPOINTS]
    return [
        (m, o)
        for m in ("positive", "negative")
        for o in ops
        if m == "positive" or o != "GET /openapi.json"
    ]


# The fuzzing is driven through schemathesis's strategies with Hypothesis directly, and
# each case is sent through Starlette's TestClient: schemathesis's pytest plugin reads a
# private attribute this pytest no longer has, and its requests transport does not work
# with the urllib3 installed beside it.
def send(client: Any, case: Any) -> Any:
    from schemathesis.core.transport import Response

    kw = case.as_transport_kwargs(base_url="http://testserver/api/v1", headers=auth("app"))
    body: dict[str, Any] = {}
    if "json" in kw:
        body["json"] = kw["json"]
    elif kw.get("data") is not None:
        body["content"] = kw["data"]
    reply = client.request(
        kw["method"], kw["url"], headers=kw["headers"], params=kw.get("params"), **body
    )
    return Response.from_httpx(reply, verify=False)


@pytest.mark.parametrize(("mode", "which"), cases())
def test_the_api_holds_to_its_description(api_schema: Any, which: str, mode: str) -> None:
    from hypothesis import given
    from schemathesis import GenerationMode

    schema, client = api_schema
    method, path = which.split(" ", 1)
    operation = schema[path][method]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))

    @given(case=strategy)
    @settings(
        max_examples=scaled(FUZZ_EXAMPLES),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def one(case: Any) -> None:
        before = dump()
        response = send(client, case)
        case.validate_response(response, checks=CHECKS)
        if 400 <= response.status_code < 500:
            assert dump() == before, (
                f"{case.method} {case.formatted_path} refused with {response.status_code} "
                "but changed the ledger"
            )

    one()
