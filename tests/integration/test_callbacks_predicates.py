"""A callback's ``applied``, ``not_applied`` and ``delivered`` read through the http
provider's predicate grammar (rules 16 and 20): several fields at once (Mailgun's
``event = failed`` *and* ``severity = permanent``), alternatives, JSON pointers and
JMESPath, a form's fields by name; the simple list form reads as it always did. An
event the predicates do not recognise is recorded and moves nothing; one that both
``applied`` and ``not_applied`` hold proves neither. Through the core, on both
backends, with signatures made as each provider documents them (hookkit,
test_callbacks_mailgun)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hookkit import T0, callbacks_config, hooks, sent, snapshot, twilio_request
from test_callbacks_mailgun import ENV, TABLE, signature

from settled.callbacks.events import read
from settled.model import Reported, Status
from settled.storage import Ledger

JSON = {"Content-Type": "application/json"}
PERMANENT = {
    "all": [
        {"path": "/event-data/event", "is": "failed"},
        {"path": "/event-data/severity", "is": "permanent"},
    ]
}
MAILGUN = {**TABLE, "not_applied": PERMANENT}


def mailgun(key: str, event: str, token: str, **more: Any) -> bytes:
    """A Mailgun webhook (JSON), signed as Mailgun's docs say."""
    stamp = str(int(T0.timestamp()))
    data = {"event": event, "id": token[:22], "user-variables": {"settled_key": key}, **more}
    return json.dumps({"signature": signature(stamp, token), "event-data": data}).encode()


def token(n: int) -> str:
    return f"{n:050d}"


def test_a_permanent_failure_is_final_and_a_temporary_one_moves_nothing(ledger: Ledger) -> None:
    temp = sent(ledger, "a-temp", object_id=None)
    perm = sent(ledger, "a-perm", object_id=None)
    assert temp.reconciliation_key and perm.reconciliation_key
    h, _ = hooks(ledger, ENV, **MAILGUN)
    temporary = mailgun(temp.reconciliation_key, "failed", token(1), severity="temporary")
    got = h.handle("p", "POST", JSON, temporary)
    assert (got.status, got.reason) == (200, "matched")
    rec = ledger.get("a-temp")
    assert rec.status is Status.AWAITING_VERIFICATION  # Mailgun retries: it may deliver yet
    said = ledger.events("a-temp")[-1]
    assert (said.detail["status"], said.detail["reported"]) == ("failed", "other")
    assert "none of applied, not_applied, delivered" in said.detail["reason"]

    permanent = mailgun(perm.reconciliation_key, "failed", token(2), severity="permanent")
    got = h.handle("p", "POST", JSON, permanent)
    assert got.reason == "matched"
    rec = ledger.get("a-perm")
    assert rec.status is Status.FAILED and "not applied" in (rec.reason or "")
    assert ledger.events("a-perm")[-1].detail["reported"] == "not_applied"

    # the temporary failure was not final: Mailgun delivered it on a later try
    got = h.handle("p", "POST", JSON, mailgun(temp.reconciliation_key, "delivered", token(3)))
    assert got.reason == "matched"
    assert ledger.get("a-temp").status is Status.CONFIRMED


def test_a_failure_without_its_severity_is_not_final(ledger: Ledger) -> None:
    """``all`` needs every part: a field that is absent, null or of another type does
    not hold, so a failure that does not say it is permanent proves nothing."""
    rec = sent(ledger, object_id=None)
    key = rec.reconciliation_key
    assert key
    h, _ = hooks(ledger, ENV, **MAILGUN)
    before = ledger.get("a-1").status
    for n, more in enumerate([{}, {"severity": None}, {"severity": ["permanent"]}]):
        got = h.handle("p", "POST", JSON, mailgun(key, "failed", token(10 + n), **more))
        assert got.status == 200
    assert ledger.get("a-1").status is before is Status.AWAITING_VERIFICATION
    assert [e.detail["reported"] for e in ledger.events("a-1")[-3:]] == ["other"] * 3


def test_predicates_that_both_hold_prove_neither(ledger: Ledger) -> None:
    """An applied and a not_applied that hold together say nothing the operator can
    rely on: the event is recorded, and the record does not move."""
    rec = sent(ledger, object_id=None)
    key = rec.reconciliation_key
    assert key
    table = {
        **TABLE,
        "applied": {"path": "/event-data/event", "in": ["delivered", "failed"]},
        "not_applied": PERMANENT,
    }
    h, _ = hooks(ledger, ENV, **table)
    before = snapshot(ledger, "a-1")[0]
    body = mailgun(key, "failed", token(20), severity="permanent")
    assert h.handle("p", "POST", JSON, body).reason == "matched"
    assert snapshot(ledger, "a-1")[0] == before
    assert ledger.events("a-1")[-1].detail["reported"] == "other"


def test_any_and_jmespath_over_a_batch(ledger: Ledger) -> None:
    """SendGrid-shaped events (an array, each read on its own), the signature made by
    an HMAC sender; ``any`` of two conditions, one a JMESPath expression."""
    from hookkit import hmac_headers

    for aid in ("a-bounce", "a-drop", "a-ok"):
        sent(ledger, aid, object_id=f"m-{aid}")
    table = {
        "scheme": "hmac-sha256",
        "secret": "${HOOK}",
        "header": "X-Signature",
        "names": "provider_object_id",
        "key": "/sg_message_id",
        "event_id": "/sg_event_id",
        "status": "/event",
        "applied": {"path": "event", "is": "delivered"},
        "not_applied": {
            "any": [
                {"path": "/event", "is": "dropped"},
                {"path": "event == 'bounce' && type == 'bounce'", "is": True},
            ]
        },
    }
    h, _ = hooks(ledger, {"HOOK": "s3cret"}, **table)
    events = [
        {"sg_message_id": "m-a-bounce", "sg_event_id": "e1", "event": "bounce", "type": "bounce"},
        {"sg_message_id": "m-a-drop", "sg_event_id": "e2", "event": "dropped"},
        {"sg_message_id": "m-a-ok", "sg_event_id": "e3", "event": "delivered"},
    ]
    payload = json.dumps(events).encode()
    got = h.handle("p", "POST", hmac_headers(payload, "s3cret"), payload)
    assert (got.status, got.counts) == (200, {"matched": 3})
    assert [ledger.get(a).status for a in ("a-bounce", "a-drop", "a-ok")] == [
        Status.FAILED,
        Status.FAILED,
        Status.CONFIRMED,
    ]


def test_a_form_is_read_by_field_name(ledger: Ledger) -> None:
    """Twilio posts a form: a condition's path is a field's name (as ``status`` and
    ``key`` are), and the bare list beside it reads at ``status`` as before."""
    sent(ledger, object_id="SM1")
    sent(ledger, "a-2", object_id="SM2")
    url = "https://hooks.example.com/hooks/p"
    table = {
        "scheme": "twilio",
        "secret": "${TWILIO_AUTH_TOKEN}",
        "url": url,
        "names": "provider_object_id",
        "key": "MessageSid",
        "status": "MessageStatus",
        "applied": ["delivered"],
        "not_applied": {
            "all": [
                {"path": "MessageStatus", "is": "undelivered"},
                {"path": "ErrorCode", "in": ["30003", "30005", "30006"]},
            ]
        },
    }
    env = {"TWILIO_AUTH_TOKEN": "tw-token"}
    h, _ = hooks(ledger, env, **table)
    for sid, status, code in (("SM1", "undelivered", "30005"), ("SM2", "undelivered", "30008")):
        fields = {"MessageSid": sid, "MessageStatus": status, "ErrorCode": code}
        headers, body = twilio_request(fields, "tw-token", url=url)
        assert h.handle("p", "POST", headers, body).reason == "matched"
    assert ledger.get("a-1").status is Status.FAILED  # unknown destination: final
    assert ledger.get("a-2").status is Status.AWAITING_VERIFICATION  # 30008: not declared


# -- ledger-free: what one event means --------------------------------------------------------

LIST = [True, 1, 1.5, "delivered"]
MEANS: list[tuple[Any, Reported]] = [
    (True, Reported.APPLIED),
    (False, Reported.OTHER),
    (1, Reported.APPLIED),
    (1.0, Reported.APPLIED),  # 1 and 1.0 are one number
    (0, Reported.OTHER),
    (1.5, Reported.APPLIED),
    ("delivered", Reported.APPLIED),
    ("Delivered", Reported.OTHER),  # text is compared exactly
    ("1", Reported.OTHER),
    ("true", Reported.OTHER),
    (None, Reported.OTHER),
    ({}, Reported.OTHER),
]


@pytest.mark.ledger_free
@pytest.mark.parametrize(("value", "means"), MEANS, ids=[repr(v) for v, _ in MEANS])
def test_the_list_form_reads_as_before_and_as_its_condition(value: Any, means: Reported) -> None:
    """``applied = [...]`` is ``{ path = STATUS, in = [...] }``: JSON true is never 1
    (nor 1 true), 1 and 1.0 are equal, text is compared exactly: what the value lists
    meant before predicates."""
    listed = callbacks_config(**{**TABLE, "status": "/s", "applied": LIST})["p"]
    cond = callbacks_config(**{**TABLE, "status": "/s", "applied": {"path": "/s", "in": LIST}})
    body = json.dumps({"s": value, "event-data": {"user-variables": {"settled_key": "k"}}})
    for cfg in (listed, cond["p"]):
        [item] = read(cfg, body.encode(), "application/json", "", None, T0)
        assert item.callback is not None
        assert item.callback.reported is means


@pytest.mark.ledger_free
def test_audit_words_say_what_each_predicate_reads() -> None:
    cfg = callbacks_config(**MAILGUN)["p"]
    words = cfg.describe()
    assert "applied when /event-data/event in ['delivered']" in words
    assert (
        "not_applied when /event-data/event = 'failed' and /event-data/severity = 'permanent'"
    ) in words
    assert "delivered when /event-data/event in ['accepted']" in words


@pytest.mark.ledger_free
def test_a_callbacks_table_of_pointers_loads_no_jmespath() -> None:
    """settled.toml's callbacks tables are read by every command: JMESPath is loaded
    only where a path is written in it (cold start)."""
    from test_imports import loaded_after

    load = (
        "from settled import config\n"
        "t = {'scheme': 'mailgun', 'secret': '${K}', 'names': 'action_id', 'key': '/k',"
        " 'status': '/e', 'applied': ['delivered'],"
        " 'not_applied': {'all': [{'path': '/e', 'is': 'failed'}, {'path': '/s', 'is': 'p'}]}}\n"
        "p = {'type': 'sim', 'base_url': 'http://127.0.0.1:9', 'callbacks': t}\n"
        "config.from_dict({'providers': {'p': p}}, source='s')\n"
    )
    assert loaded_after(load, "jmespath") == []
    assert loaded_after(load.replace("'/s'", "'severity'"), "jmespath") == ["jmespath"]
