"""The console's queue on a staged day, in process (the real ASGI app and a real
ledger): triage order by default, tiles, the cause table and the list counting the
same records (contradicted ones and held ones included), and next / previous links
that visit every row once; a forged page link is one clear refusal."""

from __future__ import annotations

import html
import re
from typing import Any

from ledger_rows import add
from test_console import login, ui  # noqa: F401  (the console's fixture and login)

from settled import Ledger
from settled.clock import to_text, utcnow
from settled.model import Status
from settled.storage import Move

NOW = utcnow()
UNRESOLVED, HELD, CHECKING, CONTRADICTED = 230, 14, 9, 3


def staged_day(db: Any) -> None:
    """A few hundred actions: verdicts awaited, held ones, ones the checks work on,
    confirmed ones, and confirmed ones a later callback contradicts."""
    with Ledger.open(db) as led:
        for i in range(UNRESOLVED):
            reason = (
                "HTTP 503 from the relay" if i % 3 else "verification budget spent after 3 check(s)"
            )
            add(
                led,
                f"order-{10000 + i}",
                operation="send",
                age=7200 - i * 20,
                reason=reason,
                now=NOW,
            )
        for i in range(HELD):
            add(
                led,
                f"booking-{i:02d}",
                operation="book",
                age=3000 - i,
                status=Status.PENDING,
                now=NOW,
            )
        for i in range(CHECKING):
            add(led, f"check-{i}", age=100 + i, status=Status.AWAITING_VERIFICATION, now=NOW)
        for i in range(40):
            add(led, f"done-{i:02d}", age=5000 + i, status=Status.CONFIRMED, now=NOW)
        for i in range(CONTRADICTED):
            rec = led.get(f"done-{i:02d}")
            assert led.move(
                Move(
                    rec.action_id,
                    rec.status,
                    rec.status,
                    to_text(NOW),
                    "t",
                    None,
                    values={"contradiction": f"a signed callback at {i} says it bounced"},
                )
            )


def tile(text: str, key: str) -> int:
    m = re.search(rf'data-testid="count-{key.lower()}">(\d+)<', text)
    assert m is not None, key
    return int(m.group(1))


def row_ids(text: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'data-testid="row-link">([^<]+)<', text)]


def test_tiles_causes_and_list_count_the_same_records(ui: Any, db_path: Any) -> None:  # noqa: F811
    staged_day(db_path)
    login(ui)
    page = ui.get("/ui/").text
    total = int(re.search(r'data-testid="total">(\d+)<', page).group(1))  # type: ignore[union-attr]
    assert total == UNRESOLVED + HELD + CONTRADICTED
    assert tile(page, "contradicted") == CONTRADICTED
    assert tile(page, "DENIED_UNRESOLVED") == UNRESOLVED
    assert tile(page, "PENDING") == HELD
    assert tile(page, "AWAITING_VERIFICATION") == CHECKING
    assert (
        tile(page, "contradicted") + tile(page, "DENIED_UNRESOLVED") + tile(page, "PENDING")
        == total
    )
    causes = re.search(r'data-testid="causes">(.*?)</table>', page, re.S).group(1)  # type: ignore[union-attr]
    counts = [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', causes)]
    assert sum(counts) == total
    assert "CONTRADICTED" in causes and "held for a person" in causes  # each has its row
    # each tile's link lists exactly as many as the tile says
    for key in ("contradicted", "DENIED_UNRESOLVED", "PENDING", "AWAITING_VERIFICATION", "FAILED"):
        listed = ui.get("/ui/", params={"status": key}).text
        shown = int(re.search(r'data-testid="total">(\d+)<', listed).group(1))  # type: ignore[union-attr]
        assert shown == tile(page, key), key


def test_triage_order_and_pages_that_visit_every_row_once(ui: Any, db_path: Any) -> None:  # noqa: F811
    staged_day(db_path)
    login(ui)
    seen: list[str] = []
    url = "/ui/"
    for _ in range(10):  # 247 rows, 100 a page: three pages
        page = ui.get(url)
        assert page.status_code == 200
        seen += row_ids(page.text)
        nxt = re.search(r'href="([^"]+)" rel="next"', page.text)
        if nxt is None:
            break
        url = html.unescape(nxt.group(1))
    assert len(seen) == len(set(seen)) == UNRESOLVED + HELD + CONTRADICTED
    # contradicted first, then verdicts awaited (oldest first), then the held ones
    assert seen[:CONTRADICTED] == ["done-02", "done-01", "done-00"]
    assert seen[CONTRADICTED : CONTRADICTED + 2] == ["order-10000", "order-10001"]
    assert seen[-HELD:] == [f"booking-{i:02d}" for i in range(HELD)]
    # the previous link of the last page reads the page before it, in the same order
    prev = re.search(r'href="([^"]+)" rel="prev"', page.text)
    assert prev is not None
    back = row_ids(ui.get(html.unescape(prev.group(1))).text)
    assert back == seen[100:200]


def test_a_forged_page_link_is_one_clear_refusal(ui: Any, db_path: Any) -> None:  # noqa: F811
    staged_day(db_path)
    login(ui)
    page = ui.get("/ui/", params={"after": "forged"})
    assert page.status_code == 422 and "the cursor is not one a listing gave" in page.text
    first = ui.get("/ui/").text
    nxt = html.unescape(re.search(r'href="([^"]+)" rel="next"', first).group(1))  # type: ignore[union-attr]
    other = ui.get(nxt + "&sort=age")
    assert other.status_code == 422 and "another order" in other.text


def test_export_gives_every_row_of_the_filter_as_csv_and_json(ui: Any, db_path: Any) -> None:  # noqa: F811
    import csv
    import io
    import json

    staged_day(db_path)
    with Ledger.open(db_path) as led:
        add(led, "=cmd|' /C calc'!A0", reason="+1 formula", now=NOW)
    login(ui)
    pages: list[str] = []
    url = "/ui/"
    for _ in range(10):
        text = ui.get(url).text
        pages += row_ids(text)
        nxt = re.search(r'href="([^"]+)" rel="next"', text)
        if nxt is None:
            break
        url = html.unescape(nxt.group(1))
    got = ui.get("/ui/export", params={"format": "csv"})
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/csv")
    assert got.headers["content-disposition"].startswith('attachment; filename="settled-queue-')
    rows = list(csv.DictReader(io.StringIO(got.text)))
    assert [r["action_id"] for r in rows] == [
        "'" + a if a.startswith("=") else a for a in pages
    ]  # the same rows in the same order; a formula is text
    assert rows[0]["contradicted"] == "yes" and rows[0]["status"] == "CONFIRMED"
    data = json.loads(ui.get("/ui/export", params={"format": "json"}).text)
    assert [d["action_id"] for d in data] == pages and all("next" in d for d in data)
    only = ui.get("/ui/export", params={"format": "json", "status": "PENDING"}).json()
    assert len(only) == HELD and {d["status"] for d in only} == {"PENDING"}
    assert ui.get("/ui/export", params={"format": "xml"}).status_code == 422
    ui.cookies.clear()
    assert ui.get("/ui/export", follow_redirects=False).status_code == 303  # log in first


def test_rows_picked_by_hand_are_exactly_what_the_sealed_bulk_changes(
    ui: Any,  # noqa: F811
    db_path: Any,
) -> None:
    import json

    from invariants import dump
    from test_console import csrf_of, post, record, sealed_form

    staged_day(db_path)
    login(ui, "ops", "alice")
    page = ui.get("/ui/").text
    boxes = re.findall(r'name="pick" value="([^"]+)" form="bulk-form"', page)
    assert len(boxes) == 100  # one a row of the page
    assert boxes[0] == "done-02" and all(b.isascii() for b in boxes)
    picked = ["order-10004", "order-10010", "booking-03"]  # booking-03: held, not resolvable
    q: list[tuple[str, str]] = [("do", "resolve_not_applied"), *[("pick", p) for p in picked]]
    preview = ui.get("/ui/bulk", params=q)
    # the held one is left alone, with why
    assert '<span data-testid="bulk-count">2</span> of 3 actions' in preview.text
    fields = {"csrf": csrf_of(preview.text), "step": "review", "do": "resolve_not_applied"}
    fields["ids"] = json.dumps(sorted(picked))
    review = post(ui, "/ui/bulk", {**fields, "reason": "bounced: the relay's report 77"})
    form = sealed_form(review.text)
    assert json.loads(form["ids"]) == sorted(picked)  # the seal covers the picked ids
    before = dump(db_path)
    # another id slipped into the picked rows: refused, nothing done
    forged = {**form, "ids": json.dumps(sorted([*picked, "order-10020"])), "typed": "3"}
    refused = post(ui, "/ui/bulk", forged)
    assert refused.status_code == 409 and "nothing was done" in refused.text
    assert dump(db_path) == before
    junk = post(ui, "/ui/bulk", {**form, "ids": "not json", "typed": "2"})
    assert junk.status_code == 422 and dump(db_path) == before
    done = post(ui, "/ui/bulk", {**form, "typed": "2"})
    assert done.status_code == 200 and 'data-testid="bulk-done"' in done.text, done.text
    assert record(db_path, "order-10004")[0].status is Status.FAILED
    assert record(db_path, "order-10010")[0].status is Status.FAILED
    assert record(db_path, "order-10005")[0].status is Status.DENIED_UNRESOLVED
    assert record(db_path, "booking-03")[0].status is Status.PENDING


def test_a_hostile_id_ticked_by_hand_is_previewed_as_itself(ui: Any, db_path: Any) -> None:  # noqa: F811
    from urllib.parse import unquote

    from test_console import HOSTILE

    aid = "x/" + HOSTILE
    with Ledger.open(db_path) as led:
        add(led, aid, now=NOW)
        add(led, "plain-1", now=NOW)
    login(ui)
    page = ui.get("/ui/").text
    assert "\u202e" not in page  # the tick box's value is percent-encoded
    boxes = re.findall(r'name="pick" value="([^"]+)"', page)
    assert all(b.isascii() for b in boxes) and {unquote(b) for b in boxes} == {aid, "plain-1"}
    hostile = next(b for b in boxes if unquote(b) == aid)
    preview = ui.get("/ui/bulk", params=[("do", "reconcile"), ("pick", hostile)])
    assert preview.status_code == 200
    assert "</span> of 1 action</h1>" in preview.text and "plain-1" not in preview.text
    assert "\u202e" not in preview.text and "<script>window" not in preview.text
