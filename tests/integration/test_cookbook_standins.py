"""Every docs/cookbook entry, as written, against a stand-in for its provider on
127.0.0.1 (``standins``) that answers as the provider documents, failure modes
included: the error inside a 200 (Slack), a temporary failure (Mailgun), a 202 with
no body (SendGrid, Graph), a search that lags (Stripe, Mailgun, Graph), a 404 from the
wrong host (PagerDuty), a duplicate id refused with 409 (Google Calendar), a reply lost
after the effect (GitHub, Shopify, Google). Each test checks what settled recorded
against what the stand-in did.

Only the entries' base URLs are changed (to the stand-ins'); time is a ``FakeClock``
moved to each record's next check, so windows of a minute cost nothing."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import standins
from standins import StandIn
from test_cookbook import toml_of

from settled import Ledger, config
from settled.clock import FakeClock, from_text
from settled.dispatch import Dispatcher, DispatchSettings
from settled.errors import ConfigError
from settled.model import Status
from settled.providers import Registry
from settled.reconcile import Reconciler

pytestmark = pytest.mark.ledger_incidental

ENV = {
    "SLACK_BOT_TOKEN": "xoxb-test-token",
    "MAILGUN_DOMAIN": "mg.example.com",
    "MAILGUN_API_KEY": "key-3ax6xnjp29jd6fds4gc373sgvjxteol0",
    "SENDGRID_API_KEY": "SG.test-key",
    "PAGERDUTY_ROUTING_KEY": "R0UTINGKEY0000000000000000000000",
    "PAGERDUTY_API_TOKEN": "pd-rest-token",
    "STRIPE_SECRET_KEY": "sk_test_standin",
    "GITHUB_TOKEN": "ghs_standin",
    "GOOGLE_ACCESS_TOKEN": "ya29.standin",
    "GRAPH_ACCESS_TOKEN": "eyJ0.standin",
    "SHOPIFY_SHOP": "standin",
    "SHOPIFY_ACCESS_TOKEN": "shpat_standin",
}


def localised(entry: str, hosts: dict[str, str]) -> str:
    """The entry's TOML with each real base URL replaced by a stand-in's."""
    text = toml_of(entry)
    for real, url in hosts.items():
        assert real in text, f"{entry} has no {real}"
        text = text.replace(real, url)
    return text


class World:
    """One entry's config against its stand-ins, a ledger, and a clock that moves only
    to a record's next check."""

    def __init__(self, ledger: Ledger, entry: str, hosts: dict[str, StandIn]) -> None:
        text = localised(entry, {real: h.url for real, h in hosts.items()})
        cfg = config.from_dict(tomllib.loads(text), source=entry)
        self.hosts = hosts
        self.registry = Registry(cfg.providers, source=entry)
        self.registry.load_all()
        self.ledger = ledger
        self.clock = FakeClock()
        self.dispatcher = Dispatcher(
            ledger, self.registry, clock=self.clock, settings=DispatchSettings(backoff=0.01)
        )
        self.reconciler = Reconciler(ledger, self.registry, clock=self.clock, lease=5.0)

    def send(self, provider: str, op: str, params: Any, aid: str) -> Any:
        return self.dispatcher.submit(provider, op, params, action_id=aid).record

    def settle(self, aid: str, checks: int = 40) -> Any:
        """Check ``aid`` at each of its due times until it is terminal or only a person
        can settle it (at most ``checks`` checks)."""
        for _ in range(checks):
            rec = self.ledger.get(aid)
            if rec.terminal or rec.next_check_at is None:
                return rec
            due = from_text(rec.next_check_at)
            assert due is not None
            if due > self.clock.now():
                self.clock.advance((due - self.clock.now()).total_seconds())
            self.reconciler.run_due()
        return self.ledger.get(aid)

    def close(self) -> None:
        self.registry.close()


@pytest.fixture
def world(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, dict[str, StandIn]], World]]:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    made: list[World] = []

    def make(entry: str, hosts: dict[str, StandIn]) -> World:
        made.append(World(ledger, entry, hosts))
        return made[-1]

    yield make
    for w in made:
        w.close()
        for h in w.hosts.values():
            h.close()


# -- Slack ----------------------------------------------------------------------------------

SLACK_MSG = {"channel": "C0123456789", "text": "Deploy 1.4.2 is live"}


def test_slack_ok_true_is_the_effect_and_ok_false_is_read_as_declared(world: Any) -> None:
    slack = standins.Slack()
    w = world("slack-chat.md", {"https://slack.com": StandIn(slack.handle)})
    rec = w.send("slack", "post", SLACK_MSG, "s-ok")
    assert rec.status is Status.CONFIRMED and rec.provider_object_id == slack.messages[0]["ts"]
    slack.plan = ["channel_not_found"]
    rec = w.send("slack", "post", SLACK_MSG, "s-gone")
    assert rec.status is Status.FAILED and "channel_not_found" in rec.reason
    slack.plan = ["some_new_error"]  # in neither list: unknown, the query decides
    assert w.send("slack", "post", SLACK_MSG, "s-new").status is Status.AWAITING_VERIFICATION
    assert len(slack.messages) == 1


def test_slack_an_error_that_may_follow_the_post_is_unknown_and_found_by_its_key(
    world: Any,
) -> None:
    """internal_error after the message was posted: never FAILED, never posted twice;
    the query finds it by the key in its metadata, past a page of newer messages."""
    slack = standins.Slack()
    host = StandIn(slack.handle)
    w = world("slack-chat.md", {"https://slack.com": host})
    slack.plan = ["+internal_error"]
    rec = w.send("slack", "post", SLACK_MSG, "s-int")
    assert rec.status is Status.DENIED_UNRESOLVED and "maybe_applied" in rec.reason
    for i in range(3):  # newer messages push it to the second page
        w.send("slack", "post", {**SLACK_MSG, "text": f"later {i}"}, f"s-later-{i}")
    rec = w.settle("s-int")
    assert rec.status is Status.CONFIRMED and rec.confirmed_by == "reconciliation"
    assert [m["text"] for m in slack.messages].count(SLACK_MSG["text"]) == 1
    history = [c for c in host.requests if c.path == "/api/conversations.history"]
    assert [c.q("cursor") for c in history] == ["", "2"]  # found on the second page


# -- Mailgun --------------------------------------------------------------------------------

MAIL = {"from": "shop@mg.example.com", "to": "ada@example.com", "subject": "Hi", "text": "x"}


def test_mailgun_a_temporary_failure_is_not_final_and_a_permanent_one_is(world: Any) -> None:
    mg = standins.Mailgun()
    w = world("mailgun-messages.md", {"https://api.mailgun.net": StandIn(mg.handle)})
    mg.plan = [["failed:temporary", "delivered"], ["failed:temporary"], ["failed:permanent"]]
    for aid in ("m-late", "m-temp", "m-perm"):
        assert w.send("mailgun", "send", MAIL, aid).status is Status.AWAITING_VERIFICATION
    late = w.settle("m-late")
    assert late.status is Status.CONFIRMED and late.checks >= 2  # the log lags one search
    temp = w.settle("m-temp", checks=3)
    assert temp.status is Status.AWAITING_VERIFICATION  # Mailgun may still deliver it
    w.clock.advance(86400)  # a day later, still only the temporary failure
    temp = w.settle("m-temp", checks=10)
    assert temp.status is Status.DENIED_UNRESOLVED and "never visible" in temp.reason
    perm = w.settle("m-perm")
    assert perm.status is Status.FAILED and "permanent" in perm.reason
    assert w.ledger.get("m-late").provider_object_id == mg.sent[0]["id"]  # without <>


# -- SendGrid -------------------------------------------------------------------------------


def test_sendgrid_a_202_without_a_body_is_delivery_only(world: Any) -> None:
    sg = standins.SendGrid()
    w = world("sendgrid-mail.md", {"https://api.sendgrid.com": StandIn(sg.handle)})
    params = {"to": "ada@example.com", "from": "shop@example.com", "subject": "s", "text": "t"}
    rec = w.send("sendgrid", "send", params, "sg-1")
    assert rec.status is Status.AWAITING_VERIFICATION and rec.requires_manual_verification
    assert rec.provider_object_id == sg.messages[0]["msg_id"].split(".")[0]  # X-Message-Id
    assert sg.messages[0]["custom_args"] == {"settled_key": rec.reconciliation_key}
    assert w.settle("sg-1").status is Status.DENIED_UNRESOLVED  # a person, or the webhook


def test_sendgrid_a_query_by_recipient_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The activity feed names no action: a match on to_email is refused (rule 19)."""
    monkeypatch.setenv("SENDGRID_API_KEY", ENV["SENDGRID_API_KEY"])
    text = localised("sendgrid-mail.md", {}).replace(
        'tier = "partial"',
        'tier = "reconcilable"\nquery = { path = "/v3/messages", query = { query = '
        '\'to_email="{params.to}"\' }, list = "/messages", match = { "/to_email" = '
        '"{params.to}" } }\nstatus = "/status"\napplied = ["delivered"]',
    )
    cfg = config.from_dict(tomllib.loads(text), source="settled.toml")
    with pytest.raises(ConfigError) as err, Registry(cfg.providers, source="settled.toml") as r:
        r.load_all()
    assert "query.match: names neither the reconciliation key nor the object id" in str(err.value)


# -- PagerDuty ------------------------------------------------------------------------------

PAGE = {"summary": "disk full on db-1", "source": "db-1", "severity": "critical"}


def test_pagerduty_the_incident_is_read_on_the_rest_host_with_its_own_token(world: Any) -> None:
    pd = standins.PagerDuty()
    events, rest = StandIn(pd.events), StandIn(pd.rest)
    w = world(
        "pagerduty-events.md",
        {"https://events.pagerduty.com": events, "https://api.pagerduty.com": rest},
    )
    rec = w.send("pagerduty", "trigger", PAGE, "pd-1")
    assert rec.status is Status.AWAITING_VERIFICATION
    [sent] = events.sent()
    assert sent.json()["dedup_key"] == rec.idempotency_key == "pd-1:1"
    assert sent.json()["routing_key"] == ENV["PAGERDUTY_ROUTING_KEY"]
    assert ENV["PAGERDUTY_ROUTING_KEY"] not in str(w.ledger.get("pd-1").to_json())
    rec = w.settle("pd-1")
    assert rec.status is Status.CONFIRMED
    [query] = rest.sent("GET")
    assert query.header("authorization") == "Token token=pd-rest-token"
    assert "authorization" not in {k.lower() for k in sent.headers}  # no REST token there
    shown = w.registry.provider("pagerduty").render("trigger", PAGE)
    assert '"routing_key":"***"' in shown["request"]["body"]


def test_pagerduty_an_invalid_event_is_final(world: Any) -> None:
    pd = standins.PagerDuty()
    w = world(
        "pagerduty-events.md",
        {
            "https://events.pagerduty.com": StandIn(pd.events),
            "https://api.pagerduty.com": StandIn(pd.rest),
        },
    )
    pd.plan = ["invalid"]
    rec = w.send("pagerduty", "trigger", PAGE, "pd-bad")
    assert rec.status is Status.FAILED and pd.incidents == []


# -- Stripe PaymentIntents -----------------------------------------------------------------

CHARGE = {"amount": 2000, "currency": "eur", "customer": "cus_1", "payment_method": "pm_1"}


def test_stripe_charge_succeeded_declined_and_a_search_that_lags(world: Any) -> None:
    stripe = standins.Stripe()
    w = world("stripe-payment-intents.md", {"https://api.stripe.com": StandIn(stripe.handle)})
    rec = w.send("stripe", "charge", CHARGE, "pi-ok")
    assert rec.status is Status.CONFIRMED and rec.provider_object_id == stripe.intents[0]["id"]
    stripe.plan = ["declined"]
    rec = w.send("stripe", "charge", CHARGE, "pi-declined")
    assert rec.status is Status.FAILED and "402" in rec.reason
    stripe.plan = ["processing"]
    rec = w.send("stripe", "charge", CHARGE, "pi-later")
    assert rec.status is Status.AWAITING_VERIFICATION
    stripe.intents[-1]["status"] = "succeeded"  # it settles; the search shows it a search late
    rec = w.settle("pi-later")
    assert rec.status is Status.CONFIRMED and rec.checks == 2
    assert stripe.intents[-1]["metadata"]["settled_key"] == rec.reconciliation_key


# -- GitHub check runs ----------------------------------------------------------------------

RUN = {
    "owner": "octo-org",
    "repo": "octo-repo",
    "head_sha": "ce587453ced02b1526dfb4cb910479d431683101",
    "name": "settled",
    "conclusion": "success",
    "title": "Deployed",
    "summary": "v1.4.2 is live",
}


def test_github_a_lost_reply_is_found_by_external_id_not_sent_twice(world: Any) -> None:
    gh = standins.GitHubChecks()
    w = world("github-check-runs.md", {"https://api.github.com": StandIn(gh.handle)})
    assert w.send("github", "check_run", RUN, "gh-ok").status is Status.CONFIRMED
    gh.plan = ["lost"]
    rec = w.send("github", "check_run", RUN, "gh-lost")
    assert rec.status is Status.DENIED_UNRESOLVED
    rec = w.settle("gh-lost")
    assert rec.status is Status.CONFIRMED and len(gh.runs) == 2
    assert gh.runs[1]["external_id"] == rec.reconciliation_key


# -- Google Calendar ------------------------------------------------------------------------

EVENT = {
    "calendar": "primary",
    "summary": "Dentist",
    "start": "2026-03-02T09:00:00+01:00",
    "end": "2026-03-02T09:30:00+01:00",
}


def test_google_the_key_is_a_base32hex_event_id(world: Any) -> None:
    cal = standins.GoogleCalendar()
    w = world("google-calendar-events.md", {"https://www.googleapis.com": StandIn(cal.handle)})
    rec = w.send("gcal", "insert", EVENT, "g-ok")
    assert rec.status is Status.CONFIRMED
    assert re.fullmatch(r"[0-9a-f]{32}", rec.reconciliation_key)
    assert list(cal.events) == [rec.reconciliation_key] == [rec.provider_object_id]


def test_google_a_lost_insert_is_confirmed_by_its_id_and_a_404_notfound_proves_absence(
    world: Any,
) -> None:
    cal = standins.GoogleCalendar()
    host = StandIn(cal.handle)
    w = world("google-calendar-events.md", {"https://www.googleapis.com": host})
    cal.plan = ["lost"]
    lost = w.send("gcal", "insert", EVENT, "g-lost")
    assert lost.status is Status.DENIED_UNRESOLVED
    assert w.settle("g-lost").status is Status.CONFIRMED and len(cal.events) == 1
    # A send that never made the event (Google answered 503 before creating it).
    original = cal.handle

    def refuse_once(c: standins.Call) -> standins.Reply:
        host.handle = original
        return standins.Reply(503, {"error": {"code": 503, "message": "Backend Error"}})

    host.handle = refuse_once
    gone = w.send("gcal", "insert", EVENT, "g-gone")
    assert gone.status is Status.DENIED_UNRESOLVED
    gone = w.settle("g-gone")
    assert gone.status is Status.FAILED and "not-found reply" in gone.reason
    assert len(cal.events) == 1


# -- Microsoft Graph ------------------------------------------------------------------------


def test_graph_a_202_is_confirmed_by_the_property_settled_set(world: Any) -> None:
    graph = standins.Graph()
    host = StandIn(graph.handle)
    w = world("graph-sendmail.md", {"https://graph.microsoft.com": host})
    params = {"from": "shop@contoso.com", "to": "ada@example.com", "subject": "s", "text": "t"}
    for i in range(3):
        assert w.send("graph", "send_mail", params, f"gr-{i}").status is (
            Status.AWAITING_VERIFICATION
        )
    rec = w.settle("gr-2")
    assert rec.status is Status.CONFIRMED
    assert any("$skip" in c.query for c in host.requests if c.method == "GET")  # paged


# -- Shopify --------------------------------------------------------------------------------

ORDER = {"email": "ada@example.com", "line_items": [{"variant_id": 447654529, "quantity": 1}]}


def test_shopify_a_lost_reply_is_found_through_the_link_pages(world: Any) -> None:
    shop = standins.Shopify()
    host = StandIn(shop.handle)
    w = world("shopify-orders.md", {"https://${SHOPIFY_SHOP}.myshopify.com": host})
    shop.plan = ["lost"]
    rec = w.send("shopify", "create_order", ORDER, "o-lost")
    assert rec.status is Status.DENIED_UNRESOLVED
    for i in range(3):
        assert w.send("shopify", "create_order", ORDER, f"o-{i}").status is Status.CONFIRMED
    rec = w.settle("o-lost")
    assert rec.status is Status.CONFIRMED and len(shop.orders) == 4
    pages = [c.q("page_info") for c in host.requests if c.method == "GET"]
    assert pages == ["", "2"]


RUNS = {
    "slack-chat.md",
    "mailgun-messages.md",
    "sendgrid-mail.md",
    "pagerduty-events.md",
    "stripe-payment-intents.md",
    "github-check-runs.md",
    "google-calendar-events.md",
    "graph-sendmail.md",
    "shopify-orders.md",
}


# -- the first entries -------------------------------------------------------------------------


def test_stripe_refund_pending_then_read_back_and_a_lost_reply_repeated_safely(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRIPE_SECRET_KEY", "sk_test_standin")
    stripe = standins.StripeRefunds()
    w = world("stripe-refunds.md", {"https://api.stripe.com": StandIn(stripe.handle)})
    assert w.send("stripe", "refund", {"payment_intent": "pi_1"}, "r-ok").status is (
        Status.CONFIRMED
    )
    stripe.plan = ["pending"]
    rec = w.send("stripe", "refund", {"payment_intent": "pi_2"}, "r-pending")
    assert rec.status is Status.AWAITING_VERIFICATION
    stripe.refunds[rec.provider_object_id]["status"] = "succeeded"
    assert w.settle("r-pending").status is Status.CONFIRMED
    stripe.drop_next = True  # applied, the reply lost: the same key is replayed
    rec = w.send("stripe", "refund", {"payment_intent": "pi_3"}, "r-lost")
    assert rec.status is Status.CONFIRMED and len(stripe.refunds) == 3


def test_marketing_cloud_queued_then_sent_or_not_sent(world: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("MC_ACCESS_TOKEN", "mc-token")
    mc = standins.MarketingCloud()
    w = world(
        "email-queued.md",
        {"https://YOUR-SUBDOMAIN.rest.marketingcloudapis.com": StandIn(mc.handle)},
    )
    params = {"definition": "order-shipped", "contact": "c-1", "to": "ada@example.com"}
    mc.plan = [["EmailQueued", "EmailSent"], ["EmailNotSent"]]
    for aid in ("mc-1", "mc-2"):
        assert w.send("mc", "send_email", params, aid).status is Status.AWAITING_VERIFICATION
    assert w.settle("mc-1").status is Status.CONFIRMED
    assert w.settle("mc-2").status is Status.FAILED


def test_twilio_queued_then_delivered_or_undelivered(world: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC5a1e0c4f7e2b9d8c3a6f1e0d9c8b7a6f")
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "twilio-auth-token-xyz")
    tw = standins.Twilio()
    w = world("twilio-messages.md", {"https://api.twilio.com": StandIn(tw.handle)})
    params = {"to": "+15558675310", "from": "+15017122661", "body": "hi"}
    tw.plan = [["sending", "sent", "delivered"], ["sent", "undelivered"]]
    for aid in ("t-1", "t-2"):
        assert w.send("twilio", "sms", params, aid).status is Status.AWAITING_VERIFICATION
    assert w.settle("t-1").status is Status.CONFIRMED
    assert w.settle("t-2").status is Status.FAILED


def test_github_issue_and_a_blind_webhook(world: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("HOOK_SECRET", "hook-secret-42")
    gh = standins.GitHubChecks()
    w = world("github-issues.md", {"https://api.github.com": StandIn(gh.handle)})
    params = {"owner": "octo-org", "repo": "octo-repo", "title": "Found a bug"}
    rec = w.send("github", "open_issue", params, "i-1")
    assert rec.status is Status.CONFIRMED and rec.provider_object_id == "1347"
    hook = standins.Webhook()
    w = world("webhook-blind.md", {"https://hooks.example.com": StandIn(hook.handle)})
    rec = w.send("hooks", "deploy_notice", {"text": "v1.2.3 is live"}, "h-1")
    assert rec.status is Status.DENIED_UNRESOLVED and len(hook.received) == 1


RUNS |= {
    "stripe-refunds.md",
    "email-queued.md",
    "twilio-messages.md",
    "github-issues.md",
    "webhook-blind.md",
}


def test_every_entry_runs_against_a_stand_in() -> None:
    from test_cookbook import COOKBOOK

    assert sorted(p.name for p in COOKBOOK.glob("*.md") if p.name != "README.md") == sorted(RUNS)
