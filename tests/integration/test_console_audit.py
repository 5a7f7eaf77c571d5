"""The console's audit page (/ui/audit) in a real browser: a verdict recorded in the
console shows there with the person, the login session and the action; a person's
verdict from the command line beside it; filters by person and session; bad input said
on the page (400), reading nothing; axe-core finds no serious violation in any state,
and the page fits at 1280 and 390 px."""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_console_browser import (  # noqa: F401  (fixtures: the served console, the browser)
    HOSTILE_TEXT,
    accessible,
    axe,
    browser,
    expect,
    log_in,
    seed,
    shots,
    ui,
)

from settled import Ledger
from settled.resolve import resolve

pytestmark = [pytest.mark.sqlite_only, pytest.mark.slow(seconds=20)]


def test_the_audit_names_who_settled_what_and_filters_by_person_and_session(
    ui: Any,  # noqa: F811  (the fixture imported above)
    db_path: Any,
) -> None:
    url, page, watch = ui
    seed(db_path, "order-41-mail", "order-42-mail", reason="HTTP 503 from the relay")
    with Ledger.open(db_path) as led:  # a person at the command line, as `resolve --by` writes
        resolve(
            led,
            "order-41-mail",
            applied=True,
            reason=HOSTILE_TEXT,
            by="alice",
            now=led.clock().now(),
        )
    log_in(page, url, name="olga")
    page.goto(url + "/ui/actions/order-42-mail")
    page.get_by_label("It was applied").check()
    page.get_by_label("How you know").fill("customer replied")
    page.get_by_label("Evidence").fill("ticket 991")
    page.get_by_role("button", name="Record verdict").click()
    expect(page.get_by_role("status")).to_have_text("Your verdict was recorded.")
    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Audit: who did what")
    table = page.get_by_test_id("audit")
    expect(page.get_by_test_id("audit-count")).to_have_text("2")
    first = table.locator("tbody tr").first  # newest first: the console's verdict
    expect(first).to_contain_text("olga")
    expect(first).to_contain_text("order-42-mail")
    expect(first).to_contain_text("ticket 991")
    via = first.locator("td").nth(2).inner_text()
    assert re.fullmatch(r"ui:token:ops:\S+", via), via
    expect(table).to_contain_text(HOSTILE_TEXT.replace("\u202e", "\\u202e"))  # escaped, shown
    shots(page, "audit")
    accessible(page)
    page.get_by_label("Person").fill("alice")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("audit-count")).to_have_text("1")
    expect(table).to_contain_text("order-41-mail")
    page.goto(url + "/ui/audit?session=" + via.rsplit(":", 1)[1])
    expect(page.get_by_test_id("audit-count")).to_have_text("1")
    expect(page.get_by_test_id("audit")).to_contain_text("olga")
    page.goto(url + "/ui/audit?by=nobody")
    expect(page.get_by_text("No events match.")).to_be_visible()
    shots(page, "audit-empty")
    accessible(page)
    reply = page.goto(url + "/ui/audit?since=yesterday")
    assert reply is not None and reply.status == 400
    expect(page.get_by_test_id("audit-problem")).to_contain_text("since 'yesterday'")
    shots(page, "audit-error")
    accessible(page)
    expect(page.get_by_test_id("audit-count")).to_have_text("0")  # nothing listed
    watch.clean()
