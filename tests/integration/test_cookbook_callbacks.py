"""The cookbook's callbacks, from outside: for each entry whose provider calls back
(Slack, Mailgun, SendGrid, PagerDuty, Shopify, Stripe PaymentIntents), its TOML as
written (only the base URLs, and SendGrid's public key, which is the account's own,
are changed) is served by a real ``settled serve`` on 127.0.0.1; ``settled dispatch``
(a real process) sends to the provider's stand-in (``standins``), and the stand-in
then calls back over real HTTP as the provider documents its webhooks, signed by the
scheme's own signer. Each test checks what the record became against what the stand-in
did: Slack's event confirming a message whose reply was an ``internal_error``, and its
``url_verification`` answered; Mailgun's temporary failure leaving the record unknown
and its permanent failure making it FAILED; SendGrid's batch with a bounce; PagerDuty's
two signatures during a rotation; a Shopify order whose reply was lost, and the same
event delivered twice; Stripe's events signed with the old secret, the new one, and
both, while the secret is rolled.

The ledger is on the way here (the callback paths are proven on both backends by the
``test_callbacks_*`` files): these run once, on SQLite."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import standins
from hookkit import p256
from serving import Running, process
from standins import Hook, StandIn
from support import run_cli
from test_cookbook_standins import ENV, localised

from settled import Ledger
from settled.callbacks.schemes import Message
from settled.callbacks.schemes.slack import Slack
from settled.model import Status

pytestmark = [pytest.mark.slow(seconds=60), pytest.mark.ledger_incidental]

SECRETS = {
    "SLACK_SIGNING_SECRET": "8f742231b10e8888abcd99yyyzzz85a5",
    "MAILGUN_WEBHOOK_SIGNING_KEY": "key-6f2c1e0d9b8a7f6e5d4c3b2a19080706",
    "PAGERDUTY_WEBHOOK_SECRET": "pd-webhook-new-secret",
    "SHOPIFY_CLIENT_SECRET": "shpss_0123456789abcdef0123456789abcdef",
    "STRIPE_WEBHOOK_SECRET_OLD": "whsec_old0123456789",
    "STRIPE_WEBHOOK_SECRET": "whsec_new0123456789",
}
COOKBOOK_SENDGRID_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7"
    "yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="
)


@contextmanager
def served(
    tmp_path: Path, entry: str, hosts: dict[str, StandIn], *, key: str | None = None
) -> Iterator[Running]:
    """``entry`` as settled.toml (its base URLs the stand-ins'; ``key``: SendGrid's
    public key in place of the entry's), served by a real ``settled serve``."""
    text = localised(entry, {real: h.url for real, h in hosts.items()})
    if key is not None:
        assert COOKBOOK_SENDGRID_KEY in text
        text = text.replace(COOKBOOK_SENDGRID_KEY, key)
    (tmp_path / "settled.toml").write_text(text)
    try:
        with process(env={**ENV, **SECRETS}) as svc:
            yield svc
            assert svc.stop() == 0
            logged = json.dumps(svc.rest())
            assert not any(secret in logged for secret in SECRETS.values())
    finally:
        for host in hosts.values():
            host.close()


def dispatch(provider: str, op: str, params: Any, aid: str) -> int:
    out = run_cli(
        "dispatch", provider, op, "--params", json.dumps(params), "--action-id", aid,
        env={**ENV, **SECRETS},
    )  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode


def record(db_path: Any, aid: str) -> Any:
    with Ledger.open(db_path) as led:
        return led.get(aid)


def answers(posted: list[standins.Posted]) -> list[tuple[int, Any]]:
    return [(p.status, p.answer) for p in posted]


# -- Slack ----------------------------------------------------------------------------------


def test_slack_an_internal_error_is_confirmed_by_its_event(tmp_path: Path, db_path: Any) -> None:
    hook = Hook("slack", SECRETS["SLACK_SIGNING_SECRET"])
    slack = standins.Slack(hook)
    host = StandIn(slack.handle)
    with served(tmp_path, "slack-chat.md", {"https://slack.com": host}) as svc:
        hook.url = f"{svc.url}/hooks/slack"
        # Setting the Request URL: Slack's signed challenge is answered, an unsigned one not
        challenge = json.dumps({"type": "url_verification", "challenge": "3eZbrw1aBm2rZgRNF"})
        made = Slack().sign(
            SECRETS["SLACK_SIGNING_SECRET"],
            Message(challenge.encode(), {"Content-Type": "application/json"}),
            url=hook.url,
            now=time.time(),
            event_id="",
        )
        got = hook.send(made.body, made.headers)
        assert (got.status, got.answer) == (200, {"challenge": "3eZbrw1aBm2rZgRNF"})
        unsigned = hook.send(challenge.encode(), {"Content-Type": "application/json"})
        assert unsigned.status == 401

        slack.plan = ["+internal_error"]  # posted, then an error Slack says may follow it
        msg = {"channel": "C0123456789", "text": "Deploy 1.4.2 is live"}
        assert dispatch("slack", "post", msg, "s-int") == 4  # DENIED_UNRESOLVED
        assert record(db_path, "s-int").status is Status.DENIED_UNRESOLVED
        [event] = hook.flush()
        assert (event.status, event.answer) == (200, {"received": 1, "matched": 1})
        rec = record(db_path, "s-int")
        assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:slack"
        assert json.loads(event.body)["event"]["message_ts"] == slack.messages[0]["ts"]
        again = hook.again(event, **{"X-Slack-Retry-Num": "1"})  # Slack retries: one event
        assert (again.status, again.answer) == (200, {"received": 1, "duplicate": 1})
        assert len(slack.messages) == 1


# -- Mailgun --------------------------------------------------------------------------------

MAIL = {"from": "shop@mg.example.com", "to": "ada@example.com", "subject": "Hi", "text": "x"}


def test_mailgun_a_temporary_failure_is_unknown_and_a_permanent_one_final(
    tmp_path: Path, db_path: Any
) -> None:
    hook = Hook("mailgun", SECRETS["MAILGUN_WEBHOOK_SIGNING_KEY"])
    mg = standins.Mailgun(hook=hook)
    host = StandIn(mg.handle)
    with served(tmp_path, "mailgun-messages.md", {"https://api.mailgun.net": host}) as svc:
        hook.url = f"{svc.url}/hooks/mailgun"
        mg.plan = [["failed:temporary", "delivered"], ["failed:permanent"]]
        assert dispatch("mailgun", "send", MAIL, "m-temp") == 3
        assert dispatch("mailgun", "send", MAIL, "m-perm") == 3
        # the first message: accepted, then a temporary failure
        assert answers(hook.flush(2)) == [(200, {"received": 1, "matched": 1})] * 2
        temp = record(db_path, "m-temp")
        assert temp.status is Status.AWAITING_VERIFICATION  # Mailgun retries: unknown
        # the second: accepted, then a permanent failure (the first's delivery still queued)
        delivered_later = hook.queue.pop(0)
        assert answers(hook.flush()) == [(200, {"received": 1, "matched": 1})] * 2
        perm = record(db_path, "m-perm")
        assert perm.status is Status.FAILED and "not applied" in (perm.reason or "")
        assert record(db_path, "m-temp").status is Status.AWAITING_VERIFICATION
        # Mailgun's retry delivered the first
        hook.queue.append(delivered_later)
        hook.flush()
        temp = record(db_path, "m-temp")
        assert temp.status is Status.CONFIRMED and temp.confirmed_by == "callback:mailgun"
        assert [e["event"] for e in mg.events] == [
            "accepted",
            "failed",
            "delivered",
            "accepted",
            "failed",
        ]


# -- SendGrid -------------------------------------------------------------------------------


def test_sendgrid_a_batch_with_a_bounce(tmp_path: Path, db_path: Any) -> None:
    private, public = p256()  # the account's key pair: SendGrid keeps the private half
    hook = Hook("sendgrid", private, batch=True)
    sg = standins.SendGrid(hook)
    host = StandIn(sg.handle)
    hosts = {"https://api.sendgrid.com": host}
    with served(tmp_path, "sendgrid-mail.md", hosts, key=public) as svc:
        hook.url = f"{svc.url}/hooks/sendgrid"
        sg.plan = ["bounce", "delivered"]
        params = {"to": "ada@example.com", "from": "shop@example.com", "subject": "s", "text": "t"}
        assert dispatch("sendgrid", "send", params, "sg-bounce") == 3
        assert dispatch("sendgrid", "send", params, "sg-ok") == 3
        [batch] = hook.flush()
        assert (batch.status, batch.answer) == (200, {"received": 4, "matched": 4})
        assert [e["event"] for e in json.loads(batch.body)] == [
            "processed",
            "bounce",
            "processed",
            "delivered",
        ]
        bounced, ok = record(db_path, "sg-bounce"), record(db_path, "sg-ok")
        assert bounced.status is Status.FAILED and "'bounce'" in (bounced.reason or "")
        assert ok.status is Status.CONFIRMED and ok.confirmed_by == "callback:sendgrid"
        forged = Hook("sendgrid", p256()[0], batch=True)  # another key: refused
        forged.url = hook.url
        forged.enqueue({"event": "delivered", "settled_key": bounced.reconciliation_key})
        assert [p.status for p in forged.flush()] == [401]
        assert record(db_path, "sg-bounce").status is Status.FAILED


# -- PagerDuty ------------------------------------------------------------------------------

PAGE = {"summary": "disk full on db-1", "source": "db-1", "severity": "critical"}


def test_pagerduty_several_signatures_while_a_secret_rotates(tmp_path: Path, db_path: Any) -> None:
    hook = Hook("pagerduty", "pd-webhook-old-secret", SECRETS["PAGERDUTY_WEBHOOK_SECRET"])
    pd = standins.PagerDuty(hook)
    events, rest = StandIn(pd.events), StandIn(pd.rest)
    hosts = {"https://events.pagerduty.com": events, "https://api.pagerduty.com": rest}
    with served(tmp_path, "pagerduty-events.md", hosts) as svc:
        hook.url = f"{svc.url}/hooks/pagerduty"
        assert dispatch("pagerduty", "trigger", PAGE, "pd-1") == 3
        [event] = hook.flush()
        signatures = event.headers["X-PagerDuty-Signature"].split(",")
        assert len(signatures) == 2 and all(s.startswith("v1=") for s in signatures)
        assert (event.status, event.answer) == (200, {"received": 1, "matched": 1})
        rec = record(db_path, "pd-1")
        assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:pagerduty"
        assert json.loads(event.body)["event"]["data"]["incident_key"] == rec.provider_object_id
        old_only = Hook("pagerduty", "pd-webhook-old-secret")  # the old secret alone: refused
        old_only.url = hook.url
        assert old_only.post(json.loads(event.body)).status == 401


# -- Shopify --------------------------------------------------------------------------------

ORDER = {"email": "ada@example.com", "line_items": [{"variant_id": 447654529, "quantity": 1}]}


def test_shopify_a_lost_reply_is_confirmed_by_its_order_webhook(
    tmp_path: Path, db_path: Any
) -> None:
    hook = Hook("shopify", SECRETS["SHOPIFY_CLIENT_SECRET"])
    shop = standins.Shopify(hook)
    hosts = {"https://${SHOPIFY_SHOP}.myshopify.com": StandIn(shop.handle)}
    with served(tmp_path, "shopify-orders.md", hosts) as svc:
        hook.url = f"{svc.url}/hooks/shopify"
        shop.plan = ["lost"]  # the order is made, its reply is a 504
        assert dispatch("shopify", "create_order", ORDER, "o-lost") == 4
        [delivery] = hook.flush()
        assert (delivery.status, delivery.answer) == (200, {"received": 1, "matched": 1})
        rec = record(db_path, "o-lost")
        assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:shopify"
        # a retry of the delivery, and the same event to a second subscription: taken once
        retry = hook.again(delivery)
        second = hook.again(delivery, **{"X-Shopify-Webhook-Id": "another-delivery"})
        assert answers([retry, second]) == [(200, {"received": 1, "duplicate": 1})] * 2
        assert len(shop.orders) == 1


# -- Stripe ---------------------------------------------------------------------------------

CHARGE = {"amount": 2000, "currency": "eur", "customer": "cus_1", "payment_method": "pm_1"}


def test_stripe_events_while_the_endpoint_secret_is_rolled(tmp_path: Path, db_path: Any) -> None:
    old, new = SECRETS["STRIPE_WEBHOOK_SECRET_OLD"], SECRETS["STRIPE_WEBHOOK_SECRET"]
    hook = Hook("stripe", old)
    stripe = standins.Stripe(hook)
    host = StandIn(stripe.handle)
    with served(tmp_path, "stripe-payment-intents.md", {"https://api.stripe.com": host}) as svc:
        hook.url = f"{svc.url}/hooks/stripe"
        stripe.plan = ["processing", "processing", "processing"]
        for aid in ("pi-a", "pi-b", "pi-c"):
            assert dispatch("stripe", "charge", CHARGE, aid) == 3
        # before the roll, signed with the old secret: created and processing move nothing
        assert [p.status for p in hook.flush()] == [200] * 6
        assert record(db_path, "pi-a").status is Status.AWAITING_VERIFICATION
        stripe.settle(stripe.intents[0]["id"], "succeeded")
        [a] = hook.flush()
        hook.secrets = (old, new)  # rolled: Stripe signs with both until the old expires
        stripe.settle(stripe.intents[1]["id"], "canceled")
        [b] = hook.flush()
        assert b.headers["Stripe-Signature"].count("v1=") == 2
        hook.secrets = (new,)  # the old one expired
        stripe.settle(stripe.intents[2]["id"], "succeeded")
        [c] = hook.flush()
        assert answers([a, b, c]) == [(200, {"received": 1, "matched": 1})] * 3
        assert [record(db_path, x).status for x in ("pi-a", "pi-b", "pi-c")] == [
            Status.CONFIRMED,
            Status.FAILED,
            Status.CONFIRMED,
        ]
        assert record(db_path, "pi-c").confirmed_by == "callback:stripe"
        hook.secrets = ("whsec_someone_else",)
        assert hook.post({"id": "evt_x", "type": "payment_intent.succeeded"}).status == 401
