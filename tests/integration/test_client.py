"""The shared httpx client, by its behaviour: plain http:// works without loading the
CA bundle, and https:// verifies certificates (a self-signed one is refused before
anything is sent) once it has loaded the bundle."""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from settled.providers import make_client
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_free


@pytest.fixture
def ca_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every CA bundle loaded into a TLS context from here on (the public
    ``SSLContext.load_verify_locations`` and ``load_default_certs``)."""
    seen: list[str] = []
    verify, default = ssl.SSLContext.load_verify_locations, ssl.SSLContext.load_default_certs

    def counting_verify(self: ssl.SSLContext, *args: Any, **kw: Any) -> None:
        seen.append("verify_locations")
        verify(self, *args, **kw)

    def counting_default(self: ssl.SSLContext, *args: Any, **kw: Any) -> None:
        seen.append("default_certs")
        default(self, *args, **kw)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting_verify)
    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", counting_default)
    return seen


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """An https server on loopback with a self-signed certificate."""
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
        def do_GET(self) -> None:
            received.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_plain_http_works_and_loads_no_ca_bundle(ca_loads: list[str]) -> None:
    with SimServer() as server, make_client() as client:
        assert client.get(f"{server.url}/v1/settings/x").status_code == 200
        assert client.get(f"{server.url}/v1/settings/y").status_code == 200
    assert ca_loads == []


def test_https_loads_the_bundle_once_and_refuses_a_self_signed_server(
    ca_loads: list[str], tls_server: tuple[str, list[str]]
) -> None:
    url, received = tls_server
    with make_client() as client:
        for _ in range(2):
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                client.get(f"{url}/x")
    assert received == []  # refused before any request was sent
    assert len(ca_loads) == 1  # loaded on the first https request, and only then
