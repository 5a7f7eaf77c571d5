"""The ledger's reads written once (``storage.statements``, ``storage.audit_sql``):
each statement renders in both dialects with the same parameters, and the reads that
used to be two copies answer alike on both backends."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from ledger_rows import add

from settled import Ledger
from settled.clock import plus, to_text, utcnow
from settled.model import EventKind, Status
from settled.storage import Move, audit_sql, statements
from settled.storage.postgres import DIALECT as PG
from settled.storage.sqlite import DIALECT as SQLITE

NOW = utcnow()


def _marks(sql: str, mark: str) -> int:
    return len(re.findall(re.escape(mark), sql))


NAMED = [("reads", f.name) for f in fields(statements.Reads)] + [
    ("writes", f.name) for f in fields(statements.Writes)
]


@pytest.mark.parametrize(("group", "name"), NAMED)
def test_each_statement_renders_with_the_same_parameters_in_both_dialects(
    group: str, name: str
) -> None:
    make = getattr(statements, group)
    lite, pg = getattr(make(SQLITE), name), getattr(make(PG), name)
    if group == "writes" and "{names}" in lite:
        lite = statements.named_records(make(SQLITE))["action_id"]
        pg = statements.named_records(make(PG))["action_id"]
    assert "{" not in lite + pg and "%s" not in lite and "?" not in pg
    assert _marks(lite, "?") == _marks(pg, "%s")
    assert lite.replace("?", "%s") == pg.replace("::timestamptz", "").replace(
        " FOR UPDATE SKIP LOCKED", ""
    ).replace(" FOR UPDATE", "").replace("pg_backend_pid()", "0").replace(
        "pg_current_snapshot()::text", "NULL"
    )


def test_a_moves_update_is_guarded_alike_in_both_dialects() -> None:
    m = Move(
        "a",
        Status.IN_FLIGHT,
        Status.AWAITING_VERIFICATION,
        "t",
        "me",
        EventKind.OUTCOME,
        values={"reason": "r"},
        owner="me",
        attempt=2,
    )
    lite, args = statements.move_update(m, SQLITE)
    pg, pg_args = statements.move_update(m, PG)
    assert lite == (
        "UPDATE actions SET reason = ?, status = ?, updated_at = ? WHERE action_id = ?"
        " AND status = ? AND lease_owner = ? AND attempt = ?"
    )
    assert pg == lite.replace("?", "%s") and args == pg_args
    assert args == ["r", "AWAITING_VERIFICATION", "t", "a", "IN_FLIGHT", "me", 2]


def test_the_audit_statements_bind_every_parameter_they_mark() -> None:
    for d in (SQLITE, PG):
        for sql, args in audit_sql.statements(d):
            assert _marks(sql, d.mark) == len(args), sql
            assert "%" not in sql.replace("%s", "")  # a LIKE pattern is bound, never written


def test_render_refuses_a_percent_sign() -> None:
    with pytest.raises(AssertionError):
        statements.render("SELECT 1 WHERE reason LIKE 'x%'", PG)


def _at(seconds: float) -> str:
    return str(to_text(plus(NOW, seconds)))


def _set(ledger: Ledger, aid: str, **values: object) -> None:
    rec = ledger.get(aid)
    assert ledger.move(Move(aid, rec.status, rec.status, _at(0), "t", None, values=values))


def test_rivals_read_alike_on_both_backends(ledger: Ledger) -> None:
    same = {"to": "same"}
    for i, aid in enumerate(["target", "sent", "seen-before", "seen-after", "unsent", "other"]):
        add(
            ledger,
            aid,
            params={"to": "else"} if aid == "other" else same,
            age=600 - i,
            status=Status.PENDING if aid == "unsent" else Status.DENIED_UNRESOLVED,
            now=NOW,
        )
    _set(ledger, "target", dispatched_at=_at(-100))
    _set(ledger, "seen-before", confirmed_at=_at(-200))  # observed before the target was sent
    _set(ledger, "seen-after", confirmed_at=_at(-50))
    target = ledger.get("target")
    assert ledger.rivals(target) == ["sent", "seen-after"]
    assert ledger.rivals(target, limit=1) == ["sent"]
    # a record never sent has no time to compare with: every sent rival counts
    _set(ledger, "target", dispatched_at=None)
    assert ledger.rivals(ledger.get("target")) == ["sent", "seen-before", "seen-after"]


def test_the_small_reads_answer_alike_on_both_backends(ledger: Ledger) -> None:
    for aid, provider in (("ab-1", "sim"), ("ab-2", "mail"), ("b-1", "sim")):
        add(ledger, aid, provider=provider, now=NOW)
    _set(ledger, "b-1", check_error="unreachable")
    _set(
        ledger, "ab-2", check_error="paused: mail answered HTTP 503; not checked until it recovers"
    )
    assert ledger.ids("ab") == ["ab-1", "ab-2"]
    assert ledger.ids("ab", limit=1) == ["ab-1"]
    assert ledger.ids("") == ["ab-1", "ab-2", "b-1"]
    assert ledger.names() == [("mail", "notify"), ("sim", "notify")]
    assert ledger.status_counts() == {
        ("DENIED_UNRESOLVED", "sim"): 2,
        ("DENIED_UNRESOLVED", "mail"): 1,
    }
    assert ledger.check_failures() == {"sim": 1, "mail": 1}
    assert ledger.paused_checks() == {"mail": 1}  # a pause, not a broken verifier
    page = ledger.export(after="ab-1", limit=1)
    assert [(rec.action_id, [e.kind for e in log]) for rec, log in page] == [
        ("ab-2", ["recorded", "claimed", "outcome"]),
    ]
