"""The service's docs are checked: docs/api.md is the OpenAPI description rendered (it
fails when either drifts), the config blocks of docs/serve.md load, its log lines are
JSON, its systemd unit is Type=notify and as hardened as the daemon's, the proxies pass
what the service needs, and every route, error and log event is documented."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import ROOT

from settled.config import from_dict
from settled.serve.api import DOCUMENT, ENDPOINTS
from settled.serve.api.apidoc import render
from settled.serve.auth import Tokens
from settled.serve.problems import TITLES
from settled.serve.run import GRACE, KEEP_ALIVE

pytestmark = pytest.mark.ledger_incidental  # docs: no ledger involved

SERVE_DOC = (ROOT / "docs" / "serve.md").read_text()
API_DOC = ROOT / "docs" / "api.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SERVE_DOC, flags=re.S)


def test_the_api_reference_is_rendered_from_the_description() -> None:
    assert API_DOC.read_text() == render(DOCUMENT), (
        "docs/api.md differs from the OpenAPI description: run `python -m settled.serve.api.apidoc --write`"
    )


def test_every_route_is_documented_in_both_pages() -> None:
    api = API_DOC.read_text()
    for e in ENDPOINTS:
        assert f"`{e.op.method} /api/v1{e.op.path}`" in api
        if e.op.path != "/openapi.json":
            assert f"`{e.op.method} {e.op.path}`" in SERVE_DOC, e.op.path


def test_every_error_status_is_in_the_table() -> None:
    for status, (slug, _title) in TITLES.items():
        assert re.search(rf"^\| {status} \| `{slug}` \|", SERVE_DOC, flags=re.M), status


def test_the_config_blocks_load_and_their_tokens_read(monkeypatch: pytest.MonkeyPatch) -> None:
    toml = [b for b in blocks("toml")]
    assert len(toml) >= 2
    import tomllib

    monkeypatch.setenv("SETTLED_TOKEN_WEBAPP", "w" * 32)
    monkeypatch.setenv("SETTLED_TOKEN_SUPPORT", "s" * 32)
    for block in toml:
        cfg = from_dict(tomllib.loads(block), source="serve.md")
        assert len(Tokens.from_config(cfg)) == len(cfg.serve.tokens)


def test_the_log_examples_are_json_with_the_documented_events() -> None:
    lines = [json.loads(line) for b in blocks("json") for line in b.splitlines() if line.strip()]
    assert {e["event"] for e in lines} == {"listening", "request"}
    firsts = [row.split("|")[1] for row in SERVE_DOC.splitlines() if row.startswith("| `")]
    for event in ("listening", "request", "warning", "error", "library", "stopping", "stopped"):
        assert any(f"`{event}`" in cell for cell in firsts), event


def test_the_proxies_pass_host_scheme_and_the_raw_path() -> None:
    (nginx,) = blocks("nginx")
    assert "proxy_set_header Host $host;" in nginx
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in nginx
    assert re.search(
        r"proxy_pass http://127\.0\.0\.1:8780;", nginx
    )  # no URI part: the path as sent
    assert "client_max_body_size 1m;" in nginx
    (caddy,) = blocks("caddy")
    assert "reverse_proxy 127.0.0.1:8780" in caddy
    assert KEEP_ALIVE > 60  # longer than nginx's upstream keep-alive


def unit() -> str:
    return next(b for b in blocks("ini") if "ExecStart=" in b)


def test_the_unit_is_type_notify_and_waits_for_requests_in_hand() -> None:
    u = unit()
    assert "Type=notify" in u and "WatchdogSec=" in u and " serve " in u
    stop = int(re.search(r"TimeoutStopSec=(\d+)", u).group(1))  # type: ignore[union-attr]
    assert stop > GRACE
    daemon = re.findall(r"```ini\n(.*?)```", (ROOT / "docs" / "daemon.md").read_text(), flags=re.S)[
        0
    ]
    hardening = {
        line
        for line in daemon.splitlines()
        if "=" in line
        and line.split("=")[0]
        in (
            "NoNewPrivileges",
            "ProtectSystem",
            "SystemCallFilter",
            "RestrictAddressFamilies",
            "MemoryDenyWriteExecute",
            "PrivateUsers",
            "CapabilityBoundingSet",
            "ProtectProc",
        )
    }
    assert hardening and hardening <= set(u.splitlines())


def test_the_unit_leaves_descriptors_for_every_connection_it_allows() -> None:
    from settled.config import DEFAULT_MAX_CONNECTIONS
    from settled.serve.run import RESERVED_FDS

    m = re.search(r"^LimitNOFILE=(\d+)$", unit(), flags=re.M)
    assert m is not None, "the unit sets no LimitNOFILE: the service would run at 1,024"
    assert int(m.group(1)) >= DEFAULT_MAX_CONNECTIONS + RESERVED_FDS


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_the_unit_is_rated_as_the_daemons(tmp_path: Path) -> None:
    (tmp_path / "settled-serve.service").write_text(unit())
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "settled-serve.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    m = re.search(r"Overall exposure level for settled-serve.service: (\d+\.\d+)", out.stdout)
    if m is None:
        pytest.skip(f"this systemd-analyze cannot rate a unit file offline: {out.stderr[:200]}")
    assert float(m.group(1)) <= 2.0, out.stdout
