"""`settled providers`: registration by name and through the ``settled.providers``
entry-point group, what the listing shows, and secrets that never leave the process."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import run_cli, write_config

TINY = """
from settled.model import Tier
from settled.providers.base import BaseProvider, OperationSpec, Wire, WireResult


class Tiny(BaseProvider):
    def __init__(self, name, conf):
        self.name = name
        self.window = conf.get("window", 7.0)

    def operations(self):
        return {"ping": OperationSpec("ping", Tier.BLIND, consistency_window=self.window,
                                      verifies="nothing can")}

    def execute(self, request):
        return WireResult(Wire.ANSWERED, 204)


def create(name, conf, client):
    return Tiny(name, conf)
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A tiny installed distribution: a module plus its dist-info with entry_points.txt,
    exactly what pip leaves in site-packages."""
    site = tmp_path / "site"
    (site / "tiny_provider-0.1.dist-info").mkdir(parents=True)
    (site / "tiny_provider.py").write_text(TINY)
    info = site / "tiny_provider-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-provider\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[settled.providers]\ntiny = tiny_provider:create\n")
    return site


def test_entry_point_provider_is_registered(tmp_path: Path, plugin_dir: Path) -> None:
    write_config(tmp_path / "settled.toml", {"t": {"type": "tiny", "window": 3}})
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    listed = run_cli("providers", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["provider"], row["operation"], row["tier"], row["consistency_window"]) == (
        "t",
        "ping",
        "blind",
        3,
    )
    sent = run_cli("dispatch", "t", "ping", "--json", env=env)
    assert sent.returncode == 4  # blind: a person must verify
    assert json.loads(sent.stdout)["status"] == "DENIED_UNRESOLVED"
    missing = run_cli("providers")  # without the plug-in on the path
    assert missing.returncode == 1
    assert (
        "unknown provider type 'tiny'" in missing.stderr and "settled.providers" in missing.stderr
    )


def test_listing_shows_each_declaration(tmp_path: Path) -> None:
    conf = {
        "type": "http",
        "base_url": "https://api.example.com",
        "timeout": 2.5,
        "operations": {
            "send": {
                "tier": "reconcilable",
                "consistency_window": 12,
                "attempts": 2,
                "idempotency_header": "Idempotency-Key",
                "request": {"path": "/m"},
                "reconciliation_key_field": "ref",
                "query": {"path": "/m/{reconciliation_key}"},
                "status": "/s",
                "applied": ["ok"],
            },
            "ping": {"tier": "blind", "request": {"path": "/p"}, "timeout": 1},
        },
    }
    cal = {"type": "caldav", "url": "https://cal.example.com/alice/work/"}
    write_config(tmp_path / "settled.toml", {"mail": conf, "cal": cal})
    out = run_cli("providers", "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["provider"], r["operation"]): r for r in json.loads(out.stdout)}
    assert set(rows) == {
        ("mail", "send"),
        ("mail", "ping"),
        ("cal", "book"),
        ("cal", "move"),
        ("cal", "cancel"),
    }
    send = rows["mail", "send"]
    assert (send["tier"], send["consistency_window"], send["attempts"], send["timeout"]) == (
        "reconcilable",
        12.0,
        2,
        2.5,
    )
    assert (
        send["dedupes_keys"] is True
        and send["verifies"] == "GET /m/{reconciliation_key}: /s in ['ok']"
    )
    ping = rows["mail", "ping"]
    assert (ping["dedupes_keys"], ping["timeout"], ping["verifies"]) == (
        False,
        1.0,
        "nothing can: a person",
    )
    assert rows["cal", "book"]["tier"] == "full" and "412" in rows["cal", "book"]["proof"]
    text = run_cli("providers", env={"COLUMNS": "200"})
    assert text.returncode == 0 and "verified by" in text.stdout and "mail" in text.stdout


# -- secrets ------------------------------------------------------------------------------

CANARY = "canary-7f3a9c1e-do-not-leak"


class Echo(BaseHTTPRequestHandler):
    """Echoes the request's Authorization header back in every reply, as a careless
    API might in its error messages."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        return None

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization", "")
        Echo.seen.append(auth)
        if self.path == "/reject":
            return self._reply(422, {"error": f"token {auth} is not allowed here"})
        self._reply(202, {"id": auth, "status": "queued"})

    def do_GET(self) -> None:
        self._reply(200, {"status": self.headers.get("Authorization", "")})


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    Echo.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_canary_secret_never_leaves(tmp_path: Path, echo: str) -> None:
    op: dict[str, Any] = {
        "consistency_window": 0,
        "attempts": 1,
        "reconciliation_key_field": "ref",
        "object_id": "/id",
        "verify": {"interval": 0.05, "deadline": 0.3},
    }
    conf = {
        "type": "http",
        "base_url": echo,
        "timeout": 2,
        "headers": {"Authorization": "Bearer ${CANARY_TOKEN}", "X-Api-Key": "${CANARY_TOKEN}"},
        "operations": {
            "send": {
                **op,
                "tier": "reconcilable",
                "request": {"path": "/send"},
                "query": {"path": "/q/{reconciliation_key}"},
                "status": "/status",
                "applied": ["delivered"],
            },
            "reject": {**op, "tier": "full", "request": {"path": "/reject"}, "object_id": "/id"},
        },
    }
    cfg = write_config(tmp_path / "settled.toml", {"api": conf})
    env = {"CANARY_TOKEN": CANARY}
    outputs = [
        run_cli(
            "dispatch",
            "api",
            "send",
            "--action-id",
            "s1",
            "--json",
            "--wait",
            "--wait-timeout",
            "5",
            env=env,
        ),
        run_cli("dispatch", "api", "reject", "--action-id", "r1", "--json", env=env),
        run_cli("dispatch", "api", "reject", "--action-id", "r2", env=env),
        run_cli("show", "s1", "--json", env=env),
        run_cli("show", "r1", env=env),
        run_cli("queue", "--status", "all", "--json", env=env),
        run_cli("reconcile", "--due", "--json", env=env),
        run_cli("providers", "--json", env=env),
        run_cli("providers", "audit", "--json", env=env),
    ]
    assert [o.returncode for o in outputs[:3]] == [4, 5, 5], [o.stderr for o in outputs[:3]]
    assert Echo.seen and all(s == f"Bearer {CANARY}" for s in Echo.seen)  # it was sent
    shown = json.loads(outputs[3].stdout)
    assert shown["provider_object_id"] == "***"  # the echo was there, and masked
    reject = json.loads(outputs[1].stdout)
    assert "token *** is not allowed" in reject["reason"]
    for o in outputs:
        assert CANARY not in o.stdout and CANARY not in o.stderr
    db = Path(os.environ["SETTLED_DB"])
    for path in db.parent.glob(db.name + "*"):
        assert CANARY.encode() not in path.read_bytes(), path
    assert CANARY not in cfg.read_text()
