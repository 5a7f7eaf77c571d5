"""Every signing scheme from outside, as a user runs it: one real ``settled serve`` on
127.0.0.1 receives, for one provider per scheme, the callbacks the simulator posts over
real HTTP, signed by that scheme's signer, after ``settled dispatch`` (a real process)
sent each action (the callback overtakes the reply: kept, then matched by the
dispatcher); every record ends CONFIRMED by its callback, and the service logged
each answer without the body. Slack's ``url_verification`` is answered through the
same service, and an unsigned request is refused there. (That the service refuses a
request missing a required header before its body arrives is the service's to prove;
the core's ``Hooks.before_body`` gives the answer from the headers alone:
test_callbacks_conformance.py.)"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import process
from support import run_cli, sim_conf, write_config
from test_callbacks_conformance import SENDERS

from settled import Ledger
from settled.callbacks.schemes import SCHEMES, Message
from settled.callbacks.schemes.slack import Slack
from settled.model import Status
from settled.providers.sim_server import CallbackPlan, SimServer

pytestmark = pytest.mark.slow(seconds=40)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def provider(name: str) -> str:
    return "cb_" + name.replace("-", "_")


def variable(name: str) -> str:
    return "HOOK_SECRET_" + name.replace("-", "_").upper()


def test_every_scheme_settles_through_a_real_service(
    tmp_path: Path, sim: SimServer, db_path: Any
) -> None:
    port = free_port()  # the twilio scheme signs the hook's URL: it is known before start
    hooks = {name: f"http://127.0.0.1:{port}/hooks/{provider(name)}" for name in SCHEMES}
    providers: dict[str, dict[str, Any]] = {}
    env: dict[str, str] = {}
    for name, cls in SCHEMES.items():
        sender = SENDERS[name]
        options = {**sender.options, **({"url": hooks[name]} if "url" in sender.options else {})}
        table: dict[str, Any] = {
            "scheme": name,
            **options,
            "names": "provider_object_id",
            "key": "MessageSid" if cls.form else "/data/id",
            "status": "MessageStatus" if cls.form else "/data/status",
            "applied": ["delivered"],
            "not_applied": ["bounced"],
        }
        if cls.takes_secret:
            table["secret"] = f"${{{variable(name)}}}"
            env[variable(name)] = sender.secret
        providers[provider(name)] = {**sim_conf(sim), "callbacks": table}
    write_config(tmp_path / "settled.toml", providers)
    with process(env=env, listen=f"127.0.0.1:{port}") as svc:
        for name in SCHEMES:
            options = {**SENDERS[name].options, "url": hooks[name]}
            # "before": the callback is answered before the reply is written, so the
            # service keeps it (pending) and the dispatcher matches it after its outcome
            sim.callbacks = CallbackPlan(hooks[name], name, SENDERS[name].secret, "before", options)
            aid = f"via-{name}"
            out = run_cli(
                "dispatch", provider(name), "deliver", "--params", "{}", "--action-id", aid
            )
            assert out.returncode == 0, (name, out.stdout, out.stderr)  # confirmed
            sent = sim.callbacks_for(aid)
            assert [c["code"] for c in sent] == [200], (name, sent)
            assert json.loads(sent[0]["answer"]) == {"received": 1, "pending": 1}, name
        with Ledger.open(db_path) as led:
            for name in SCHEMES:
                rec = led.get(f"via-{name}")
                assert rec.status is Status.CONFIRMED, (name, rec.status)
                assert rec.confirmed_by == f"callback:{provider(name)}"

        slack = SCHEMES["slack"]
        assert slack is Slack
        challenge = json.dumps({"type": "url_verification", "challenge": "ch4ll3nge"}).encode()
        signed = Slack().sign(
            SENDERS["slack"].secret,
            Message(challenge, {"Content-Type": "application/json"}),
            url="",
            now=time.time(),
            event_id="",
        )
        url = f"{svc.url}/hooks/{provider('slack')}"
        got = httpx.post(url, content=challenge, headers=dict(signed.headers), timeout=30)
        assert (got.status_code, got.json()) == (200, {"challenge": "ch4ll3nge"})
        unsigned = httpx.post(url, content=challenge, headers={"Content-Type": "application/json"})
        assert (unsigned.status_code, unsigned.json()) == (401, {"error": "unauthorized"})
        assert svc.stop() == 0
        logged = [e for e in svc.rest() if e.get("route") == "/hooks/{provider}"]
        reasons = sorted((e["callback"]["provider"], e["callback"]["reason"]) for e in logged)
        expected = sorted(
            [(provider(n), "pending") for n in SCHEMES]
            + [(provider("slack"), "challenge"), (provider("slack"), "bad_signature")]
        )
        assert reasons == expected
        assert not any(SENDERS["slack"].secret in json.dumps(e) for e in svc.seen)
        assert not any("ch4ll3nge" in json.dumps(e) for e in logged)  # the body is never logged
