"""The console's trust in proxies, through a real `settled serve` process on 127.0.0.1:
a proxy's user header is believed only from the address the socket saw (never from
an address ``X-Forwarded-For`` claims), and ``X-Forwarded-Proto: https`` from a
trusted proxy makes the session cookie Secure."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import TOKENS, env_name, process
from support import sim_conf, write_config

from settled.providers.sim_server import SimServer

pytestmark = [
    pytest.mark.sqlite_only,
    pytest.mark.slow,
]  # about the HTTP edge, not the ledger's backend

UI_SECRET = "u" * 32


def configure(tmp_path: Path, sim: SimServer, **ui: Any) -> None:
    sections: dict[str, dict[str, Any]] = {}
    for name, (_secret, roles) in TOKENS.items():
        sections[f"serve.tokens.{name}"] = {"secret": f"${{{env_name(name)}}}", "roles": roles}
    sections["serve.ui"] = {"session_secret": "${SETTLED_TEST_UI_SECRET}", **ui}
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)}, **sections)


def person(page: httpx.Response) -> str | None:
    m = re.search(r'data-testid="person">([^<]*)<', page.text)
    return m.group(1) if m else None


def test_a_forwarded_for_address_does_not_make_a_proxy_trusted(
    tmp_path: Path, sim: SimServer
) -> None:
    configure(tmp_path, sim, trusted_proxies=["10.0.0.1"], proxy_roles=["operate"])
    with (
        process(env={"SETTLED_TEST_UI_SECRET": UI_SECRET}) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as c,
    ):
        spoofed = c.get(
            "/ui/", headers={"X-Forwarded-For": "10.0.0.1", "X-Forwarded-User": "mallory"}
        )
        assert spoofed.status_code == 303 and spoofed.headers["location"] == "/ui/login"
        assert "set-cookie" not in spoofed.headers


def test_the_trusted_proxy_names_the_person(tmp_path: Path, sim: SimServer) -> None:
    configure(tmp_path, sim, trusted_proxies=["127.0.0.1"])
    with (
        process(env={"SETTLED_TEST_UI_SECRET": UI_SECRET}) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as c,
    ):
        page = c.get("/ui/", headers={"X-Forwarded-User": "carol", "X-Forwarded-Proto": "https"})
        assert page.status_code == 200 and person(page) == "carol"
        assert "(read only)" in page.text  # proxy_roles defaults to read
        cookie = page.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie
        # the proxy's header with a control character names nobody
        bad = c.get("/ui/", headers={"X-Forwarded-User": "carol\tadmin"})
        assert bad.status_code == 403 and "user header" in bad.text


def test_login_behind_tls_sets_a_secure_cookie(tmp_path: Path, sim: SimServer) -> None:
    configure(tmp_path, sim)
    with (
        process(env={"SETTLED_TEST_UI_SECRET": UI_SECRET}) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as c,
    ):
        https = {"X-Forwarded-Proto": "https"}
        form = c.get("/ui/login", headers=https)
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce is not None
        host = svc.url.removeprefix("http://")
        r = c.post(
            "/ui/login",
            data={"nonce": nonce.group(1), "token": TOKENS["ops"][0]},
            headers={**https, "Origin": f"https://{host}"},
        )
        assert r.status_code == 303, r.text
        assert "Secure" in r.headers["set-cookie"]
        plain = c.post(
            "/ui/login",
            data={"nonce": nonce.group(1), "token": TOKENS["ops"][0]},
            headers={**https, "Origin": f"http://{host}"},
        )
        assert plain.status_code == 403  # an http:// page posting to the https:// service
        assert svc.stop() == 0
        assert all(TOKENS["ops"][0] not in str(e) for e in svc.rest())


def test_two_services_on_one_ledger_share_sessions_and_csrf_tokens(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    """Nothing is held in one process's memory: a login on one service is a session on
    another with the same key, and a form from one is accepted by the other."""
    from ledger_rows import add

    from settled import Ledger

    configure(tmp_path, sim)  # the key is derived from nothing but the config and secrets
    with Ledger.open(db_path) as led:
        add(led, "shared-1")
    env = {"SETTLED_TEST_UI_SECRET": UI_SECRET}
    with process(env=env) as a, process(env=env) as b, httpx.Client(timeout=30) as c:
        form = c.get(a.url + "/ui/login")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce is not None
        r = c.post(
            a.url + "/ui/login",
            headers={"Origin": a.url},
            data={"nonce": nonce.group(1), "token": TOKENS["ops"][0], "name": "alice"},
        )
        assert r.status_code == 303, r.text
        page = c.get(a.url + "/ui/actions/shared-1")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        # another client, with nothing but the cookie a's login set
        cookie = {"Cookie": f"settled_session={r.cookies['settled_session']}"}
        with httpx.Client(timeout=30) as other:
            on_b = other.get(b.url + "/ui/", headers=cookie)
            assert person(on_b) == "alice"
            done = other.post(
                b.url + "/ui/actions/shared-1",
                headers={**cookie, "Origin": b.url},
                data={
                    "csrf": token.group(1),
                    "do": "resolve",
                    "verdict": "applied",
                    "reason": "seen in the CRM",
                },
            )
            assert done.status_code == 303, done.text
    with Ledger.open(db_path, create=False) as led:
        rec = led.get("shared-1")
        assert str(rec.status) == "CONFIRMED" and str(rec.confirmed_by).startswith(
            "operator:alice via ui:"
        )


def test_a_missing_or_short_session_secret_stops_the_service_at_start(
    tmp_path: Path, sim: SimServer
) -> None:
    from serving import token_env
    from support import run_cli

    configure(tmp_path, sim)
    for value, words in ((None, "SETTLED_TEST_UI_SECRET is not set"), ("q7Zp-w9", "at least 16")):
        env = {**token_env()}
        if value is not None:
            env["SETTLED_TEST_UI_SECRET"] = value
        p = run_cli("serve", "--listen", "127.0.0.1:0", env=env, timeout=120)
        assert p.returncode == 1, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "serve.ui.session_secret" in lines[0]
        assert "Traceback" not in p.stderr
        if value is not None:
            assert value not in lines[0]  # the secret itself is never shown
