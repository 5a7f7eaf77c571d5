"""The console on a staged day, in Debian's Chromium (Playwright) against a real
`settled serve` process: every page and every state (a contradicted record, a refused
verdict, an empty queue, an error page, a second page of the queue) passes axe-core
with no serious violation and is photographed at 1280 and 390 px into the test's tmp
dir; a link survives the login; local times sit beside UTC with a toggle the browser
keeps; rows ticked by hand are what the bulk preview holds; the CONTRADICTED label
is readable. Every wait is Playwright's own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from ledger_rows import add
from serving import auth
from test_console_browser import (  # noqa: F401  (the browser, axe and service fixtures)
    TOKENS,
    accessible,
    axe,
    browser,
    expect,
    ui,
)

from settled import Ledger
from settled.clock import to_text, utcnow
from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.serve.console.rendering import aid_url
from settled.storage import Move

NOW = utcnow()
pytestmark = [
    pytest.mark.sqlite_only,
    pytest.mark.slow(seconds=120),
]  # about the pages, not the ledger's backend


def stage(db: Any) -> None:
    """A few hundred actions: verdicts awaited after an outage, held bookings, checks
    under way, settled mails, and three a later signed callback contradicts."""
    with Ledger.open(db) as led:
        for i in range(260):
            reason = "HTTP 503 from the mail gateway" if i % 4 else "verification budget spent"
            add(
                led,
                f"order-{10700 + i}",
                operation="send",
                age=5000 - i * 15,
                reason=reason,
                now=NOW,
            )
        for i in range(12):
            add(
                led,
                f"booking-{i:02d}",
                operation="book",
                age=900 + i,
                status=Status.PENDING,
                now=NOW,
            )
        for i in range(20):
            add(led, f"mail-{i:02d}", age=6000 + i, status=Status.CONFIRMED, now=NOW)
        for i in range(3):
            rec = led.get(f"mail-{i:02d}")
            values = {"contradiction": "a signed callback says the mail bounced"}
            assert led.move(
                Move(rec.action_id, rec.status, rec.status, to_text(NOW), "t", None, values=values)
            )


def shots(page: Any, tmp_path: Path, name: str) -> None:
    """axe on the page as it is, then the page at 1280 and 390 px, full length, kept
    with the test's files; neither width scrolls sideways."""
    accessible(page)
    for width, height in ((1280, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        shot = tmp_path / "screenshots" / f"{name}-{width}.png"
        shot.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 1000
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} at {width} px scrolls sideways by {overflow} px"
        accessible(page)
    page.set_viewport_size({"width": 1280, "height": 900})


def contrast(page: Any, selector: str) -> float:
    """The WCAG contrast ratio of the first element's text against its background."""
    ratio: float = page.evaluate(
        """(sel) => {
          const el = document.querySelector(sel);
          const rgb = (s) => s.match(/[0-9.]+/g).slice(0, 3).map(Number);
          const lum = ([r, g, b]) => [r, g, b].map(v => { v /= 255;
              return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); })
            .reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
          const cs = getComputedStyle(el);
          const a = lum(rgb(cs.color)), b = lum(rgb(cs.backgroundColor));
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }""",
        selector,
    )
    return ratio


def test_every_page_and_state_passes_axe_at_both_widths(
    ui: Any,  # noqa: F811
    db_path: Any,
    sim: SimServer,
    tmp_path: Path,
) -> None:
    url, page, watch = ui
    stage(db_path)
    sim.plan("seen-1", "timeout_after_apply")
    r = httpx.post(
        url + "/api/v1/actions",
        json={"provider": "sim", "operation": "book", "action_id": "seen-1", "params": {}},
        headers=auth("app"),
        timeout=30,
    )
    assert r.json()["status"] == "DENIED_UNRESOLVED", r.text

    # a link to a contradicted action, opened without a session, survives the login
    page.goto(url + aid_url("mail-01"))
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    shots(page, tmp_path, "login")
    page.get_by_label("API token").fill(TOKENS["ops"][0])
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(re.escape(aid_url("mail-01")) + "$"))
    flag = page.locator("dt.flag")
    expect(flag).to_have_text("CONTRADICTED")
    assert contrast(page, "dt.flag") >= 4.5
    shots(page, tmp_path, "action-contradicted")

    # the queue: contradicted first, tiles that agree with the list, and a second page
    page.goto(url + "/ui/")
    expect(page.get_by_test_id("count-contradicted")).to_have_text("3")
    expect(page.get_by_test_id("total")).to_have_text(str(3 + 261 + 12))
    assert page.get_by_test_id("row-link").first.inner_text() == "mail-02"
    assert contrast(page, "tr.contradicted .flag") >= 4.5
    shots(page, tmp_path, "queue")
    page.get_by_test_id("next-page").click()
    expect(page.get_by_test_id("prev-page")).to_be_visible()
    shots(page, tmp_path, "queue-page-2")

    # local times beside UTC, and the toggle this browser keeps
    page.goto(url + aid_url("order-10700"))
    local = page.locator("time.abs + .local").first
    expect(local).to_be_visible()
    expect(local).to_contain_text("your time")
    toggle = page.get_by_test_id("times-toggle")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    toggle.click()
    expect(local).to_be_hidden()
    page.reload()
    expect(page.locator("time.abs + .local").first).to_be_hidden()  # kept by the browser
    expect(page.get_by_test_id("times-toggle")).to_have_attribute("aria-pressed", "false")
    page.get_by_test_id("times-toggle").click()
    expect(page.locator("time.abs + .local").first).to_be_visible()
    shots(page, tmp_path, "action-unresolved")

    # a refused verdict: the provider shows the effect; plain words, the claim kept
    page.goto(url + aid_url("seen-1"))
    page.get_by_label("It was not applied").check()
    page.get_by_label("How you know (required)").fill("the customer says it never arrived")
    page.get_by_role("button", name="Record verdict").click()
    expect(page.get_by_test_id("error")).to_contain_text("The provider shows that this did happen")
    expect(page.locator(".timeline")).to_contain_text("the customer says it never arrived")
    shots(page, tmp_path, "action-refused")

    # rows ticked by hand feed the sealed bulk preview: exactly those rows
    page.goto(url + "/ui/")
    picks = page.get_by_test_id("pick")
    picks.nth(3).check()
    picks.nth(4).check()
    page.get_by_label("Verdict").select_option("resolve_not_applied")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("bulk-count")).to_have_text("2")
    expect(page.get_by_test_id("preview")).to_contain_text("order-10700")
    expect(page.get_by_test_id("preview")).to_contain_text("order-10701")
    shots(page, tmp_path, "bulk-picked")

    # an empty queue, an unknown action, an unknown page, the other pages
    page.goto(url + "/ui/?status=FAILED")
    expect(page.get_by_test_id("empty")).to_be_visible()
    shots(page, tmp_path, "queue-empty")
    page.goto(url + aid_url("no-such-order"))
    expect(page.get_by_test_id("error")).to_contain_text("There is no action")
    assert "settled.db" not in page.content() and str(db_path) not in page.content()
    shots(page, tmp_path, "error-404")
    page.goto(url + "/ui/no/such/page")
    expect(page.get_by_test_id("error")).to_contain_text("There is no such page")
    shots(page, tmp_path, "error-unknown-page")
    for name in ("stats", "providers"):
        page.goto(url + f"/ui/{name}")
        shots(page, tmp_path, name)
    page.goto(url + "/ui/bulk?status=DENIED_UNRESOLVED&match=gateway&do=not_applied")
    shots(page, tmp_path, "bulk-preview")
    watch.clean()
