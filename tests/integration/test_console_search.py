"""The console's search box and causes, in a real Chromium against a real `settled
serve`: a support person finds a customer's action by its order number or recipient in
one step, whatever its status, sees why it is held in plain words, and lists every
action held for that cause; axe finds nothing serious on the pages on the way."""

from __future__ import annotations

from typing import Any

import pytest
from ledger_rows import add
from playwright.sync_api import expect
from test_console_browser import accessible, axe, browser, log_in, shots, ui

from settled import Ledger
from settled.clock import to_text, utcnow
from settled.model import Status
from settled.storage import Move

__all__ = ["axe", "browser", "ui"]  # the fixtures this module borrows

pytestmark = pytest.mark.slow(seconds=30)


def held(led: Ledger, aid: str, cause: str, **kw: Any) -> None:
    add(led, aid, **kw)
    rec = led.get(aid)
    assert led.move(
        Move(aid, rec.status, rec.status, to_text(utcnow()), "t", None, values={"cause": cause})
    )


def test_find_a_customers_action_by_order_number_and_see_its_cause(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    with Ledger.open(db_path) as led:
        held(
            led,
            "mail-7f3a9c",
            "http_503",
            provider="sim",
            operation="send",
            params={"to": "ana.silva@example.com", "order": 10927},
            reason="verification budget spent after 4 check(s); last: not_yet",
        )
        held(led, "mail-22b0", "http_503", params={"to": "bob@example.org", "order": 10930})
        held(led, "sms-19", "blind", params={"to": "+4915112345678"})
        add(
            led,
            "mail-done",
            params={"to": "carol@example.net", "order": 10928},
            status=Status.PENDING,
        )
    log_in(page, url, "ops", "alice")
    search = page.get_by_label("Find an action (id, order number, recipient, any words)")
    search.fill("10927")
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_test_id("total")).to_have_text("1")
    expect(page.get_by_test_id("cause")).to_have_text("http_503")
    shots(page, "search")
    accessible(page)
    # every status: a held confirmation is found too, and the box keeps what was asked
    search = page.get_by_label("Find an action (id, order number, recipient, any words)")
    expect(search).to_have_value("10927")
    search.fill("CAROL@example")
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_role("link", name="mail-done")).to_have_count(1)
    expect(page.get_by_test_id("total")).to_have_text("1")
    search = page.get_by_label("Find an action (id, order number, recipient, any words)")
    search.fill("10927")
    page.get_by_role("button", name="Find").click()
    page.get_by_role("link", name="mail-7f3a9c").click()
    expect(page.get_by_test_id("action-id")).to_have_text("mail-7f3a9c")
    expect(page.get_by_test_id("cause")).to_have_text("the provider answered HTTP 503")
    accessible(page)
    page.get_by_role("link", name="http_503").click()  # every action held for that cause
    expect(page.get_by_test_id("total")).to_have_text("2")
    expect(page.get_by_role("link", name="sms-19")).to_have_count(0)
    shots(page, "cause")
    accessible(page)
    page.goto(url + "/ui/?q=ab")
    expect(page.get_by_test_id("error")).to_contain_text("at least 3 characters")
    accessible(page)
    watch.clean()
