"""What a verified callback does to the record it names (rule 16, ``policy.callback``),
through the core function and a real ledger, on both backends: declared values only;
``applied`` settles whatever the tier; ``delivered`` moves nothing past it; a
later-stage status never moves a record back; a contradiction is flagged; a callback
that comes before the outcome (or names an object not known yet) is kept and matched
when it can be, never on the wrong record; a batch's bad event drops no other; and
every refused request leaves the ledger as it was."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from hookkit import (
    T0,
    answer,
    body,
    hmac_headers,
    hooks,
    in_flight,
    sent,
    snapshot,
)

from settled import policy
from settled.clock import to_text
from settled.model import Delivery, Status, Tier
from settled.providers import Registry
from settled.reconcile import Reconciler
from settled.storage import Ledger, Move

ENV = {"HM": "hmac-secret"}
TABLE: dict[str, Any] = {
    "scheme": "hmac-sha256",
    "secret": "${HM}",
    "header": "X-Signature",
    "names": "provider_object_id",
    "key": "/id",
    "status": "/event",
    "event_id": "/eid",
    "applied": ["delivered"],
    "not_applied": ["bounced", "failed"],
    "delivered": ["sent"],
}


def post(h: Any, **fields: Any) -> Any:
    payload = body(**fields)
    return h.handle("p", "POST", hmac_headers(payload, ENV["HM"]), payload)


def test_applied_settles_a_partial_action_confirmed_by_callback(ledger: Ledger) -> None:
    sent(ledger, object_id="m-1", tier=Tier.PARTIAL)
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-1", event="delivered", eid="e-1").reason == "matched"
    rec = ledger.get("a-1")
    assert (rec.status, rec.confirmed_by, rec.acceptance.value) == (
        Status.CONFIRMED,
        "callback:p",
        "ACCEPTED",
    )
    event = ledger.events("a-1")[-1]
    assert (event.kind, event.actor, event.from_status, event.to_status) == (
        "callback",
        "callback:p",
        "AWAITING_VERIFICATION",
        "CONFIRMED",
    )
    detail = event.detail
    assert {k: detail[k] for k in ("scheme", "event_id", "status", "reported")} == {
        "scheme": "hmac-sha256",
        "event_id": "e-1",
        "status": "delivered",
        "reported": "applied",
    }
    assert len(detail["body_sha256"]) == 64 and "hmac-secret" not in json.dumps(detail)


def test_applied_settles_a_blind_action_named_by_its_id(ledger: Ledger) -> None:
    rec, taken = in_flight(ledger, tier=Tier.BLIND)
    rec = answer(ledger, rec, taken, object_id=None, code=204)
    assert rec.status is Status.DENIED_UNRESOLVED
    h, _ = hooks(ledger, ENV, **{**TABLE, "names": "action_id", "key": "/action"})
    assert post(h, action="a-1", event="delivered", eid="e-1").reason == "matched"
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_delivered_moves_nothing_past_the_tier(ledger: Ledger) -> None:
    sent(ledger, "a-1", object_id="m-1", tier=Tier.PARTIAL)
    rec, _taken = in_flight(ledger, "a-2", tier=Tier.PARTIAL)
    expired = policy.expire(
        rec, rec.declared, T0 + timedelta(seconds=99), actor="t", problem="", recheck=1.0
    )
    assert ledger.move(expired) is not None  # the dispatcher was lost: delivery unknown
    ledger.move(
        Move(
            "a-2",
            Status.DENIED_UNRESOLVED,
            Status.DENIED_UNRESOLVED,
            to_text(T0),
            "t",
            None,
            values={"provider_object_id": "m-2"},
        )
    )
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-1", event="sent", eid="e-1").reason == "matched"
    assert post(h, id="m-2", event="sent", eid="e-2").reason == "matched"
    one, two = ledger.get("a-1"), ledger.get("a-2")
    assert one.status is Status.AWAITING_VERIFICATION and one.confirmed_by is None
    assert two.status is Status.DENIED_UNRESOLVED and two.delivery is Delivery.DELIVERED
    assert two.acceptance.value == "UNKNOWN"


def test_not_applied_fails_at_once_it_is_a_report_not_an_absence(ledger: Ledger) -> None:
    """Rule 9 holds an absence back until the request can no longer land; a provider's
    explicit report about the object the request made is not an absence."""
    rec = sent(ledger, object_id="m-1", tier=Tier.RECONCILABLE)
    assert rec.lands_by is not None and rec.lands_by > to_text(T0)
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-1", event="bounced", eid="e-1").reason == "matched"
    rec = ledger.get("a-1")
    assert rec.status is Status.FAILED and rec.acceptance.value == "REJECTED"
    assert "bounced" in (rec.reason or "") and rec.next_check_at is None


def test_a_later_stage_never_moves_a_record_back(ledger: Ledger) -> None:
    sent(ledger, object_id="m-1")
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-1", event="delivered", eid="e-2").reason == "matched"
    assert post(h, id="m-1", event="sent", eid="e-1").reason == "matched"  # reordered
    assert post(h, id="m-1", event="queued", eid="e-0").reason == "matched"  # no declared value
    rec = ledger.get("a-1")
    assert rec.status is Status.CONFIRMED and rec.contradiction is None
    kinds = [(e.kind, e.to_status) for e in ledger.events("a-1")][-3:]
    assert kinds == [("callback", "CONFIRMED")] * 3


def test_a_callback_that_contradicts_a_settled_status_is_flagged(ledger: Ledger) -> None:
    sent(ledger, "a-1", object_id="m-1")
    sent(ledger, "a-2", object_id="m-2")
    h, _ = hooks(ledger, ENV, **TABLE)
    post(h, id="m-1", event="delivered", eid="e-1")
    post(h, id="m-1", event="failed", eid="e-2")
    post(h, id="m-2", event="bounced", eid="e-3")
    post(h, id="m-2", event="delivered", eid="e-4")
    one, two = ledger.get("a-1"), ledger.get("a-2")
    assert one.status is Status.CONFIRMED and "although the effect was observed" in (
        one.contradiction or ""
    )
    assert two.status is Status.FAILED and "before any retry" in (two.contradiction or "")
    from settled.storage import Selection

    flagged = ledger.records(Selection(statuses=["DENIED_UNRESOLVED"], also_contradicted=True))
    assert {r.action_id for r in flagged} == {"a-1", "a-2"}  # shown in the queue


def test_a_callback_before_the_outcome_is_kept_and_matched_when_it_lands(ledger: Ledger) -> None:
    rec, taken = in_flight(ledger)
    h, _ = hooks(ledger, ENV, **{**TABLE, "names": "reconciliation_key", "key": "/ref"})
    got = post(h, ref=rec.reconciliation_key, event="delivered", eid="e-1")
    assert got.reason == "pending"
    assert ledger.get("a-1").status is Status.IN_FLIGHT
    assert ledger.pending_callbacks(ledger.get("a-1")) == 1
    written = answer(ledger, rec, taken, object_id="m-1")
    assert written.status is Status.AWAITING_VERIFICATION
    moves = ledger.match_callbacks(written, policy.callback, now=T0)
    assert [m.to for m in moves] == [Status.CONFIRMED]
    assert ledger.get("a-1").confirmed_by == "callback:p"
    assert ledger.pending_callbacks(ledger.get("a-1")) == 0
    assert ledger.callback_figures()["p"].matched == 1


def test_an_object_id_not_known_yet_is_matched_once_the_reply_is_written(ledger: Ledger) -> None:
    rec, taken = in_flight(ledger)
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-77", event="sent", eid="e-1").reason == "pending"
    assert post(h, id="m-77", event="delivered", eid="e-2").reason == "pending"
    written = answer(ledger, rec, taken, object_id="m-77")
    moves = ledger.match_callbacks(written, policy.callback, now=T0)
    assert [m.to for m in moves] == [Status.AWAITING_VERIFICATION, Status.CONFIRMED]
    assert ledger.get("a-1").status is Status.CONFIRMED


def test_a_pending_callback_never_matches_the_wrong_record(ledger: Ledger) -> None:
    """Two records hold the value it names: it is kept (ambiguous), and neither moves;
    another record's outcome does not take it."""
    sent(ledger, "a-1", object_id="dup")
    sent(ledger, "a-2", object_id="dup")
    rec, taken = in_flight(ledger, "a-3")
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="dup", event="delivered", eid="e-1").reason == "ambiguous"
    assert post(h, id="m-9", event="delivered", eid="e-2").reason == "pending"
    written = answer(ledger, rec, taken, object_id="m-3")
    assert ledger.match_callbacks(written, policy.callback, now=T0) == []
    assert [ledger.get(a).status for a in ("a-1", "a-2", "a-3")] == [
        Status.AWAITING_VERIFICATION
    ] * 3
    assert ledger.callback_figures()["p"].pending == 2


def test_a_callback_about_an_earlier_attempt_is_flagged_not_applied(ledger: Ledger) -> None:
    """Kept while attempt 1 was in flight, not matched before a retry opened attempt 2:
    it is about attempt 1, so it never settles attempt 2; "applied" flags both."""
    rec, taken = in_flight(ledger, tier=Tier.RECONCILABLE)
    h, _ = hooks(ledger, ENV, **{**TABLE, "names": "action_id", "key": "/action"})
    assert post(h, action="a-1", event="delivered", eid="e-1").reason == "pending"
    failed = answer(ledger, rec, taken, verdict=policy.ReplyProof.REJECTED, code=422)
    assert failed.status is Status.FAILED  # written by a dispatcher that did not match
    reopened = ledger.move(policy.reopen(failed, failed.declared, T0, actor="t"))
    assert reopened is not None and reopened.attempt == 2
    claim = policy.claim(
        reopened, reopened.declared, T0, actor="t", grace=1.0, default_backoff=0.05
    )
    assert ledger.move(claim.move) is not None
    sweep = ledger.sweep_callbacks(policy.callback, now=T0 + timedelta(seconds=10), size=10)
    assert len(sweep.matched) == 1
    now = ledger.get("a-1")
    assert now.status is Status.IN_FLIGHT and now.attempt == 2
    assert "attempt 1" in (now.contradiction or "")


def test_a_callback_for_an_action_never_sent_moves_nothing(ledger: Ledger) -> None:
    from hookkit import declared

    ledger.record(
        policy.new_record(
            action_id="a-1",
            provider="p",
            operation="send",
            params={},
            declared=declared(Tier.PARTIAL),
            now=T0,
        ),
        actor="t",
    )
    h, _ = hooks(ledger, ENV, **{**TABLE, "names": "action_id", "key": "/action"})
    assert post(h, action="a-1", event="delivered", eid="e-1").reason == "matched"
    rec = ledger.get("a-1")
    assert rec.status is Status.PENDING and rec.confirmed_by is None
    assert "never sent" in ledger.events("a-1")[-1].detail["reason"]


def test_kept_callbacks_expire_visibly(ledger: Ledger) -> None:
    h, _clock = hooks(ledger, ENV, **{**TABLE, "pending_expiry": 60})
    assert post(h, id="nobody", event="delivered", eid="e-1").reason == "pending"
    early = ledger.sweep_callbacks(policy.callback, now=T0 + timedelta(seconds=30), size=10)
    assert (early.examined, early.expired) == (1, 0)
    late = ledger.sweep_callbacks(policy.callback, now=T0 + timedelta(seconds=3600), size=10)
    assert late.expired == 1
    figures = ledger.callback_figures()["p"]
    assert (figures.pending, figures.expired) == (0, 1)
    # a redelivery of an expired event is still a duplicate: it was recorded once
    assert post(h, id="nobody", event="delivered", eid="e-1").reason == "duplicate"


def test_a_pass_matches_what_the_dispatcher_did_not(ledger: Ledger) -> None:
    """The outcome was written (by a dispatcher that died before matching, or without
    this provider's callbacks configured): the next reconciler pass matches the kept
    callback, reports the move, and the record ends as the callback says."""
    rec, taken = in_flight(ledger, tier=Tier.PARTIAL)
    h, _ = hooks(ledger, ENV, **TABLE)
    assert post(h, id="m-5", event="delivered", eid="e-1").reason == "pending"
    answer(ledger, rec, taken, object_id="m-5")
    from settled.clock import FakeClock

    seen: list[Any] = []
    with Registry({}) as reg:
        r = Reconciler(
            ledger, reg, clock=FakeClock(T0 + timedelta(seconds=5)), on_change=seen.append
        )
        report = r.run_due()
    assert [(c.kind, c.to_status) for c in report.changes] == [("callback", "CONFIRMED")]
    assert [c.kind for c in seen] == ["callback"]
    assert ledger.get("a-1").confirmed_by == "callback:p"


def test_a_batch_with_one_bad_event_keeps_the_others(ledger: Ledger) -> None:
    """SendGrid and Mailgun post arrays: each item is an event. A bad one is counted and
    dropped; the sender gets 200, since sending the batch again could not mend it."""
    sent(ledger, "a-1", object_id="m-1")
    sent(ledger, "a-2", object_id="m-2")
    h, _ = hooks(ledger, ENV, **TABLE)
    items = [
        {"id": "m-1", "event": "delivered", "eid": "e-1"},
        42,  # not an event
        {"event": "delivered", "eid": "e-2"},  # names nothing: another kind of event
        {"id": {"deep": True}, "event": "delivered", "eid": "e-3"},  # a key that is no id
        {"id": "m-2", "event": "bounced", "eid": "e-4"},
        {"id": "m-3", "event": "delivered"},  # no event id where one is configured
    ]
    payload = json.dumps(items).encode()
    got = h.handle("p", "POST", hmac_headers(payload, ENV["HM"]), payload)
    assert (got.status, got.reason) == (200, "batch")
    assert got.counts == {"matched": 2, "malformed": 3, "ignored": 1}
    assert got.body == {"received": 6, "matched": 2, "malformed": 3, "ignored": 1}
    assert [ledger.get(a).status for a in ("a-1", "a-2")] == [Status.CONFIRMED, Status.FAILED]
    assert [e.detail["item"] for e in (ledger.events("a-1")[-1], ledger.events("a-2")[-1])] == [
        0,
        4,
    ]
    again = h.handle("p", "POST", hmac_headers(payload, ENV["HM"]), payload)
    assert again.counts == {"duplicate": 2, "malformed": 3, "ignored": 1}


def test_refused_requests_change_nothing(ledger: Ledger) -> None:
    sent(ledger, object_id="m-1")
    h, _ = hooks(ledger, ENV, max_body=100, **TABLE)
    before = snapshot(ledger, "a-1")
    good = body(id="m-1", event="delivered", eid="e-1")
    sig = hmac_headers(good, ENV["HM"])
    big = json.dumps({"id": "m-1", "event": "delivered", "eid": "e-1", "pad": "x" * 200}).encode()
    answers = [
        h.handle("q", "POST", sig, good),
        h.handle("p", "GET", sig, good),
        h.handle("p", "POST", hmac_headers(big, ENV["HM"]), big),
        h.handle("p", "POST", hmac_headers(b"{not json", ENV["HM"]), b"{not json"),
        h.handle("p", "POST", hmac_headers(b"[]", ENV["HM"]), b"[]"),
        h.handle("p", "POST", hmac_headers(b'"text"', ENV["HM"]), b'"text"'),
        h.handle("p", "POST", {**hmac_headers(good, ENV["HM"]), "Content-Type": "text/xml"}, good),
        h.handle("p", "POST", hmac_headers(b"\xff\xfe", ENV["HM"]), b"\xff\xfe"),
        h.handle("p", "POST", {}, good),
    ]
    assert [(a.status, a.reason) for a in answers] == [
        (404, "unknown_provider"),
        (405, "method"),
        (413, "too_large"),
        (400, "malformed"),
        (400, "malformed"),
        (400, "malformed"),
        (400, "malformed"),
        (400, "malformed"),
        (401, "bad_signature"),
    ]
    assert all("m-1" not in json.dumps(a.body) for a in answers)  # no body echoed back
    assert snapshot(ledger, "a-1") == before


def test_headers_as_asgi_pairs(ledger: Ledger) -> None:
    sent(ledger, object_id="m-1")
    h, _ = hooks(ledger, ENV, **TABLE)
    good = body(id="m-1", event="delivered", eid="e-1")
    pairs = [(k.lower().encode(), v.encode()) for k, v in hmac_headers(good, ENV["HM"]).items()]
    got = h.handle("p", "POST", pairs, good)
    assert got.reason == "matched" and got.content() == b'{"received":1,"matched":1}'
