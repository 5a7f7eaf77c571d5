"""``${VAR}`` in a provider's URL is read from the environment at run time: the
cookbook's Twilio config, run for real against a Twilio-like API on loopback (the
account id in the path, Basic auth, a 404 that echoes the path as Twilio's does). The
value reaches the wire and never the ledger; an unset variable is one line naming it
(exit 1) and changes nothing; a path that tries ``${VAR}`` is refused with a pointer to
base_url; a CalDAV url takes ``${VAR}`` the same way."""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from invariants import dump
from support import ROOT, run_cli

from settled.errors import ConfigError
from settled.providers.caldav import CalDavProvider
from settled.providers.http import HttpProvider

SID = "AC7d3f9e2b1c0a4958e6d7c8b9a0f1e2d3"  # what the environment holds, never the docs' example
TOKEN = "twilio-auth-0b5e7c"
COOKBOOK = ROOT / "docs" / "cookbook" / "twilio-messages.md"


class Twilio:
    """Messages under /2010-04-01/Accounts/{sid}/: a create answers 201 queued, a read
    answers delivered; a wrong account, or a "to" of +1000, is Twilio's 404 with the
    path in its message."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # method, raw path, Authorization
        self.messages: dict[str, str] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self) -> None:
                self._reply(
                    404,
                    {
                        "code": 20404,
                        "status": 404,
                        "message": f"The requested resource {self.path} was not found",
                    },
                )

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                api.seen.append(("POST", self.path, self.headers.get("Authorization", "")))
                if self.path != f"/2010-04-01/Accounts/{SID}/Messages.json" or "To=%2B1000" in body:
                    return self._not_found()
                sid = f"SM{len(api.messages):032x}"
                api.messages[sid] = "delivered"
                self._reply(201, {"sid": sid, "status": "queued"})

            def do_GET(self) -> None:
                api.seen.append(("GET", self.path, self.headers.get("Authorization", "")))
                m = re.fullmatch(rf"/2010-04-01/Accounts/{SID}/Messages/(SM\w+)\.json", self.path)
                if m is None or m.group(1) not in api.messages:
                    return self._not_found()
                self._reply(200, {"sid": m.group(1), "status": api.messages[m.group(1)]})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def twilio() -> Iterator[Twilio]:
    api = Twilio()
    yield api
    api.close()


def cookbook_config(tmp_path: Path, api: Twilio, **faster: Any) -> Path:
    """The cookbook's TOML as written, pointed at the local API (only the host changes)."""
    toml = "\n".join(re.findall(r"```toml\n(.*?)```", COOKBOOK.read_text(), re.S))
    assert 'base_url = "https://api.twilio.com/2010-04-01/Accounts/${TWILIO_ACCOUNT_SID}"' in toml
    toml = toml.replace("https://api.twilio.com", api.url)
    toml = toml.replace("consistency_window = 10", "consistency_window = 0")
    toml = toml.replace(
        "verify = { interval = 15, deadline = 7200 }", "verify = { interval = 0.1, deadline = 30 }"
    )
    path = tmp_path / "settled.toml"
    path.write_text(toml)
    return path


ENV = {"TWILIO_ACCOUNT_SID": SID, "TWILIO_AUTH_TOKEN": TOKEN}
PARAMS = {"to": "+15558675310", "from": "+15017122661", "body": "Your code is 123456"}


def send(aid: str, params: dict[str, Any], env: dict[str, str]) -> Any:
    return run_cli(
        "dispatch",
        "twilio",
        "sms",
        "--action-id",
        aid,
        "--params",
        json.dumps(params),
        "--json",
        env=env,
    )


def test_the_account_is_read_from_the_environment_sent_and_never_stored(
    tmp_path: Path, twilio: Twilio, location: Any
) -> None:
    cookbook_config(tmp_path, twilio)
    out = send("otp-1", PARAMS, ENV)
    assert out.returncode == 3, out.stderr  # 201 queued: accepted, not yet observed
    assert twilio.seen[0][:2] == ("POST", f"/2010-04-01/Accounts/{SID}/Messages.json")
    basic = base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    assert twilio.seen[0][2] == f"Basic {basic}"
    done = run_cli("reconcile", "otp-1", "--json", env=ENV)
    assert done.returncode == 0, done.stderr  # the read saw "delivered"
    assert twilio.seen[-1][1].startswith(f"/2010-04-01/Accounts/{SID}/Messages/SM")

    # A 404 whose message echoes the path (so the account id) is stored masked.
    bad = send("otp-2", {**PARAMS, "to": "+1000"}, ENV)
    assert bad.returncode == 5, bad.stderr
    rec = json.loads(bad.stdout)
    assert "/Accounts/***/Messages.json was not found" in rec["reason"], rec["reason"]

    # Nothing ever went out with the reference itself, literal or percent-encoded.
    assert not [p for _m, p, _a in twilio.seen if "${" in p or "%7B" in p.upper()]
    # And no table of the ledger holds the value (nor the token, nor the credentials).
    stored = repr(dump(location))
    for secret in (SID, TOKEN, basic):
        assert secret not in stored
    shown = run_cli("show", "otp-2", env=ENV)
    assert shown.returncode == 0 and SID not in shown.stdout and "***" in shown.stdout


def test_an_unset_variable_is_one_line_naming_it_and_changes_nothing(
    tmp_path: Path, twilio: Twilio, location: Any
) -> None:
    assert "TWILIO_ACCOUNT_SID" not in os.environ
    cookbook_config(tmp_path, twilio)
    assert send("first", PARAMS, ENV).returncode == 3
    before = dump(location)
    for argv in (
        ["dispatch", "twilio", "sms", "--action-id", "otp-9", "--params", json.dumps(PARAMS)],
        ["providers"],
        ["daemon", "--once"],
    ):
        out = run_cli(*argv, env={"TWILIO_AUTH_TOKEN": TOKEN})
        assert out.returncode == 1, (argv, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1, out.stderr
        assert (
            "providers.twilio.base_url: environment variable TWILIO_ACCOUNT_SID is not set"
            in out.stderr
        )
        assert "Traceback" not in out.stderr and SID not in out.stderr
    assert dump(location) == before  # refused: nothing recorded, nothing sent
    assert len(twilio.seen) == 1


@pytest.mark.ledger_incidental
def test_a_variable_in_a_path_is_refused_with_a_pointer_to_base_url() -> None:
    conf = {
        "base_url": "https://api.example.com",
        "operations": {"send": {"tier": "full", "request": {"path": "/Accounts/${SID}/m"}}},
    }
    with pytest.raises(ConfigError, match=r"not in a path; put the part .* in base_url"):
        HttpProvider("x", conf, httpx.Client(), {"SID": "AC1"})


@pytest.mark.ledger_incidental
def test_a_bad_url_from_the_environment_is_refused_without_showing_the_value() -> None:
    conf = {
        "base_url": "${API_BASE}",
        "operations": {"s": {"tier": "full", "request": {"path": "/m"}, "object_id": "/id"}},
    }
    with pytest.raises(ConfigError) as err:
        HttpProvider("x", conf, httpx.Client(), {"API_BASE": "ftp://secret-host-42/"})
    assert "${API_BASE}" in str(err.value) and "secret-host-42" not in str(err.value)
    ok = HttpProvider("x", conf, httpx.Client(), {"API_BASE": "https://api.example.com/v2"})
    shown = ok.render("s", {}, action_id="a")
    assert shown["request"]["url"] == "***/m"  # the whole URL came from the environment


@pytest.mark.ledger_incidental
def test_a_caldav_url_takes_a_variable_too() -> None:
    conf = {
        "url": "https://cal.example.com/${CAL_USER}/work/",
        "username": "${CAL_USER}",
        "password": "${CAL_PASSWORD}",
    }
    env = {"CAL_USER": "alice-4f2c", "CAL_PASSWORD": "pw-9a7b"}
    p = CalDavProvider("cal", conf, httpx.Client(), env)
    assert p._url == "https://cal.example.com/alice-4f2c/work/"
    assert p._redact("GET https://cal.example.com/alice-4f2c/work/x.ics") == (
        "GET https://cal.example.com/***/work/x.ics"
    )
    with pytest.raises(ConfigError, match="url: environment variable CAL_USER is not set"):
        CalDavProvider("cal", conf, httpx.Client(), {"CAL_PASSWORD": "pw"})
