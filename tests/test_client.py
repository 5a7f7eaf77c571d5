"""The shared httpx client: plain http:// works without loading the CA bundle, and
https:// always verifies certificates and host names."""

from __future__ import annotations

import ssl

from settled.providers import make_client
from settled.providers.sim_server import SimServer


def _context(transport: object) -> ssl.SSLContext:
    return transport._pool._ssl_context  # type: ignore[attr-defined,no-any-return]


def test_https_verifies_with_the_ca_bundle() -> None:
    with make_client() as client:
        t = client._transport.for_scheme("https")  # type: ignore[attr-defined]
        ctx = _context(t)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.cert_store_stats()["x509_ca"] > 0
        assert client._transport.for_scheme("https") is t  # type: ignore[attr-defined]


def test_plain_http_works_and_loads_no_ca() -> None:
    with SimServer() as server, make_client() as client:
        resp = client.get(f"{server.url}/v1/settings/x")
        assert resp.status_code == 200
        transport = client._transport  # type: ignore[attr-defined]
        assert transport._tls is None  # the CA bundle was never loaded
        ctx = _context(transport.for_scheme("http"))
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.cert_store_stats()["x509_ca"] == 0
