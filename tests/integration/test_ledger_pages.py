"""Keyset paging of a listing, on both backends: following ``next`` cursors visits every
selected row once, in the listing's order, for every sort and direction; ``before``
reads the page ahead of a cursor; a cursor of another order, or not a cursor at all,
is refused with a sentence; and a page is read from an index in its order, never by
skipping rows (no OFFSET)."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ledger_rows import add

from settled import Ledger
from settled.clock import plus, to_text, utcnow
from settled.model import Status
from settled.storage import Move, Selection
from settled.storage.query import SORT_FIELDS, cursor, read_cursor

NOW = utcnow()
STATUSES = (
    Status.DENIED_UNRESOLVED,
    Status.PENDING,
    Status.AWAITING_VERIFICATION,
    Status.IN_FLIGHT,
)


@pytest.fixture
def staged(ledger: Ledger) -> Ledger:
    """60 records: four statuses, three providers, some sharing a creation time (ties go
    by id), some with a check time and some without, three contradicted."""
    for i in range(60):
        add(
            ledger,
            f"r{i:02d}",
            provider=("mail", "sim", "Zeta")[i % 3],
            operation="send",
            age=600 - 10 * (i // 2),  # pairs created at the same instant
            status=STATUSES[i % 4],
            reason=f"reason {i % 5}",
            now=NOW,
        )
    for aid in ("r05", "r17", "r42"):
        rec = ledger.get(aid)
        values: dict[str, Any] = {"next_check_at": to_text(plus(NOW, int(aid[1:])))}
        if aid != "r17":
            values["contradiction"] = "a later signed callback says it was delivered"
        assert ledger.move(
            Move(aid, rec.status, rec.status, to_text(NOW), "t", None, values=values)
        )
    return ledger


def walk(ledger: Ledger, sel: Selection, size: int) -> list[str]:
    """Every row of ``sel``, a page of ``size`` at a time, by ``next`` cursors."""
    seen: list[str] = []
    after = None
    for _ in range(200):  # bounded: 60 rows in pages of >= 1
        page = ledger.records(replace(sel, limit=size, after=after))
        seen += [r.action_id for r in page]
        if len(page) < size:
            return seen
        after = read_cursor(sel, cursor(sel, page[-1]))
    raise AssertionError("paging did not end")


@pytest.mark.parametrize("field", SORT_FIELDS)
def test_next_cursors_visit_every_row_once_in_order_on_both_backends(
    staged: Ledger, field: str
) -> None:
    for reverse in (False, True):
        sel = Selection(sort=field, reverse=reverse)
        everything = [r.action_id for r in staged.records(sel)]
        assert len(everything) == 60
        for size in (1, 7, 60):
            assert walk(staged, sel, size) == everything, (field, reverse, size)


def test_before_reads_the_page_ahead_of_a_cursor_in_the_same_order(staged: Ledger) -> None:
    sel = Selection(statuses=["DENIED_UNRESOLVED"], also_contradicted=True, sort="triage")
    everything = [r.action_id for r in staged.records(sel)]
    assert everything[:3] == ["r05", "r42", "r00"]  # contradicted first, then by age
    rows = staged.records(sel)
    at = read_cursor(sel, cursor(sel, rows[10]))
    assert [r.action_id for r in staged.records(replace(sel, before=at, limit=4))] == everything[
        6:10
    ]
    assert [r.action_id for r in staged.records(replace(sel, after=at, limit=4))] == everything[
        11:15
    ]
    first = read_cursor(sel, cursor(sel, rows[0]))
    assert staged.records(replace(sel, before=first, limit=4)) == []
    assert staged.count(replace(sel, after=at)) == len(everything)  # the count is the filter's


def test_a_cursor_of_another_order_or_none_at_all_is_refused(staged: Ledger) -> None:
    sel = Selection(sort="triage")
    made = cursor(sel, staged.records(sel)[0])
    with pytest.raises(ValueError, match="another order"):
        read_cursor(Selection(sort="created_at"), made)
    with pytest.raises(ValueError, match="another order"):
        read_cursor(Selection(sort="triage", reverse=True), made)
    for junk in ("", "not a cursor", "eyJrIjpbMV19", "W10", "%%%"):
        with pytest.raises(ValueError, match="not one a listing gave"):
            read_cursor(sel, junk)
    with pytest.raises(ValueError, match="not both"):
        Selection(after=[0, "x", "y"], before=[0, "x", "y"])


def test_a_page_is_read_from_the_index_in_its_order(tmp_path: Path) -> None:
    """SQLite's plan of every read of a page after a cursor: the order's index, searched
    at the cursor (never scanned from its start), and no sort of the rows (no temporary
    B-tree); the reads together give the page."""
    from settled.storage import query
    from settled.storage.sqlite import DIALECT

    path = tmp_path / "l.db"
    with Ledger.open(path) as led:
        for i in range(30):
            add(led, f"p{i:02d}", age=300 - i, now=NOW)
        for field, index in (("created_at", "actions_created"), ("triage", "actions_triage")):
            sel = Selection(sort=field, limit=10)
            after = read_cursor(sel, cursor(sel, led.records(sel)[-1]))
            parts, backward = query.seek_parts(replace(sel, after=after), DIALECT)
            assert not backward
            db = sqlite3.connect(path)
            got: list[str] = []
            for past, args, order in parts:
                sql = f"SELECT action_id FROM actions WHERE {past}{order} LIMIT 10"
                plan = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", args))
                assert re.search(f"SEARCH actions USING (COVERING )?INDEX {index} ", plan), plan
                assert "TEMP B-TREE" not in plan, plan
                got += [r[0] for r in db.execute(sql, args)]
            db.close()
            assert got[:10] == [r.action_id for r in led.records(replace(sel, after=after))]
