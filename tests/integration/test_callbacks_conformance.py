"""Every registered signing scheme holds to the same promises, through the core on both
backends, with callbacks made as the simulator makes them (``CallbackPlan``: the
scheme's own signer): its signature is accepted; a wrong secret, a request with no
signature, a changed body (where the scheme signs the body), a stale or future
timestamp (where it signs one) and each missing required header are 401 and change
nothing, the last answered from the headers alone, before any body; a replay is 2xx
and changes nothing; several secrets rotate. A scheme added without its row here fails
``test_every_scheme_has_a_sender``. Each scheme's own tests check it against what its
provider's SDK or published vectors make (test_callbacks_schemes.py and
test_callbacks_<scheme>.py)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from hookkit import STD_SECRET, T0, hooks, p256, sent, snapshot

from settled.callbacks import Answer
from settled.callbacks.schemes import SCHEMES
from settled.model import Status
from settled.providers.sim_server import CallbackPlan, SimServer
from settled.storage import Ledger

HOOK = "https://hooks.example.com/hooks/p"


SG_OLD, SG_OLD_PUBLIC = p256()
SG_NEW, SG_NEW_PUBLIC = p256()
SG_OTHER, _ = p256()


@dataclass(frozen=True)
class Sender:
    """What a scheme's sender holds (the secret it signs with, another one that is
    wrong, a third for a rotation) and the scheme's own keys in the receiver's table."""

    secret: str
    wrong: str
    old: str
    options: dict[str, Any] = field(default_factory=dict)
    rotated: dict[str, Any] = field(default_factory=dict)  # options naming old and new keys


def whsec(text: str) -> str:
    return "whsec_" + base64.b64encode(text.encode()).decode()


SENDERS = {
    "standard-webhooks": Sender(STD_SECRET, whsec("wrong"), whsec("old")),
    "stripe": Sender("whsec_new", "whsec_wrong", "whsec_old"),
    "github": Sender("gh-new", "gh-wrong", "gh-old"),
    "twilio": Sender("tw-new", "tw-wrong", "tw-old", {"url": HOOK}),
    "hmac-sha256": Sender(
        "hm-new", "hm-wrong", "hm-old", {"header": "X-Signature", "event_id_header": "X-Event-Id"}
    ),
    "token": Sender("tok-new", "tok-wrong", "tok-old"),
    "slack": Sender("slack-new", "slack-wrong", "slack-old"),
    "mailgun": Sender("mg-new", "mg-wrong", "mg-old"),
    "sendgrid": Sender(
        SG_NEW,
        SG_OTHER,
        SG_OLD,
        {"public_key": SG_NEW_PUBLIC},
        {"public_keys": [SG_OLD_PUBLIC, SG_NEW_PUBLIC]},
    ),
    "pagerduty": Sender("pd-new", "pd-wrong", "pd-old"),
    "shopify": Sender("shp-new", "shp-wrong", "shp-old"),
}


def table(name: str, *, rotated: bool = False) -> dict[str, Any]:
    """The receiver's ``[providers.p.callbacks]`` for the simulator's callbacks."""
    cls = SCHEMES[name]
    sender = SENDERS[name]
    form = cls.form
    own = sender.rotated if rotated and sender.rotated else sender.options
    out: dict[str, Any] = {
        "scheme": name,
        **own,
        "names": "provider_object_id",
        "key": "MessageSid" if form else "/data/id",
        "status": "MessageStatus" if form else "/data/status",
        "applied": ["delivered"],
        "not_applied": ["bounced"],
    }
    if cls.takes_secret:
        out.update({"secrets": ["${OLD}", "${NEW}"]} if rotated else {"secret": "${NEW}"})
    return out


def env(name: str) -> dict[str, str]:
    sender = SENDERS[name]
    return {"NEW": sender.secret, "OLD": sender.old}


def effect(object_id: str, status: str = "delivered") -> dict[str, Any]:
    return {"id": object_id, "action_id": "a-1", "reconciliation_key": "k-1", "status": status}


def plan(name: str, secret: str) -> CallbackPlan:
    return CallbackPlan(HOOK, name, secret, "after", SENDERS[name].options)


def post(h: Any, made: tuple[str, bytes, dict[str, str]], **change: Any) -> Answer:
    """Hand a callback the simulator made to the core, as a server would."""
    target, body, headers = made
    return h.handle(  # type: ignore[no-any-return]
        "p",
        "POST",
        change.get("headers", headers),
        change.get("body", body),
        urlsplit(target).query,
    )


def at(offset: float) -> float:
    return (T0 + timedelta(seconds=offset)).timestamp()


@pytest.mark.ledger_free
def test_every_scheme_has_a_sender() -> None:
    assert set(SENDERS) == set(SCHEMES)


@pytest.mark.parametrize("name", list(SCHEMES))
def test_each_scheme_accepts_its_signature_and_refuses_the_rest(ledger: Ledger, name: str) -> None:
    cls = SCHEMES[name]
    sent(ledger, object_id="obj-1")
    h, _ = hooks(ledger, env(name), **table(name))
    good = plan(name, SENDERS[name].secret)
    before = snapshot(ledger, "a-1")
    made = good.request(effect("obj-1"), at(0))
    bare = good.unsigned(effect("obj-1"), "evt-1")  # what the sender posts, before signing
    refused = {
        "wrong secret": post(h, plan(name, SENDERS[name].wrong).request(effect("obj-1"), at(0))),
        "no signature": h.handle("p", "POST", bare.headers, bare.body, bare.query),
    }
    if not cls.weaker:  # it signs the body: a changed body is refused
        refused["changed body"] = post(h, made, body=made[1].replace(b"delivered", b"bounced"))
    if cls.timestamped:
        refused["stale"] = post(h, good.request(effect("obj-1"), at(-301)))
        refused["future"] = post(h, good.request(effect("obj-1"), at(301)))
    for header in cls.parse(table(name), _never).required_headers():
        kept = {k: v for k, v in made[2].items() if k.lower() != header}
        assert len(kept) == len(made[2]) - 1, (header, made[2])  # the sender does send it
        # answered from the headers alone: no body is needed to refuse it
        early = h.before_body("p", "POST", kept)
        assert early is not None and (early.status, early.reason) == (401, "bad_signature")
        refused[f"no {header}"] = post(h, made, headers=kept)
    assert h.before_body("p", "POST", made[2]) is None  # a signed request's body is read
    expected = {
        what: (401, "stale" if what in ("stale", "future") else "bad_signature") for what in refused
    }
    assert {what: (a.status, a.reason) for what, a in refused.items()} == expected
    assert all(a.body == {"error": "unauthorized"} for a in refused.values())
    assert snapshot(ledger, "a-1") == before

    edge = good.request(effect("obj-1"), at(300 if cls.timestamped else 0))
    got = post(h, edge)
    assert (got.status, got.reason) == (200, "matched"), got
    rec = ledger.get("a-1")
    assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:p"
    settled = snapshot(ledger, "a-1")
    again = post(h, edge)  # the very request, delivered again
    assert (again.status, again.reason) == (200, "duplicate")
    assert snapshot(ledger, "a-1") == settled


@pytest.mark.parametrize("name", list(SCHEMES))
def test_each_scheme_takes_an_old_and_a_new_key_while_one_is_rotated(
    ledger: Ledger, name: str
) -> None:
    sent(ledger, "a-1", object_id="obj-1")
    sent(ledger, "a-2", object_id="obj-2")
    h, _ = hooks(ledger, env(name), **table(name, rotated=True))
    sender = SENDERS[name]
    assert post(h, plan(name, sender.wrong).request(effect("obj-1"), at(0))).status == 401
    assert post(h, plan(name, sender.old).request(effect("obj-1"), at(0))).reason == "matched"
    assert post(h, plan(name, sender.secret).request(effect("obj-2"), at(0))).reason == "matched"
    assert [ledger.get(a).status for a in ("a-1", "a-2")] == [Status.CONFIRMED] * 2


def _never(key: str, problem: str) -> Exception:
    raise AssertionError(f"{key}: {problem}")


@pytest.mark.ledger_free
def test_the_simulator_refuses_a_plan_it_cannot_sign(sim: SimServer) -> None:
    """A scheme's options and secret are checked when the plan is made, by the scheme
    itself, over the simulator's HTTP control too: never in a handler, mid-test."""
    import httpx

    with pytest.raises(ValueError, match="callback option header: missing"):
        CallbackPlan(HOOK, "hmac-sha256", "s")
    with pytest.raises(ValueError, match="sendgrid cannot sign with it"):
        CallbackPlan(HOOK, "sendgrid", "not a key", options=SENDERS["sendgrid"].options)
    with pytest.raises(ValueError, match="standard-webhooks cannot sign with it"):
        CallbackPlan(HOOK, "standard-webhooks", "whsec_***")
    bad = httpx.post(
        f"{sim.url}/_callbacks", json={"url": HOOK, "scheme": "mailgun", "options": []}
    )
    assert (bad.status_code, bad.json()) == (400, {"error": '"options" must be an object'})
    refused = httpx.post(f"{sim.url}/_callbacks", json={"url": HOOK, "scheme": "hmac-sha256"})
    assert refused.status_code == 400 and "callback option header" in refused.json()["error"]
    ok = httpx.post(
        f"{sim.url}/_callbacks",
        json={"url": HOOK, "scheme": "hmac-sha256", "secret": "s", "options": {"header": "X-S"}},
    )
    assert ok.status_code == 200 and sim.callbacks is not None
    assert sim.callbacks.signer.required_headers() == ("x-s",)
