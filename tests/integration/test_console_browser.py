"""The console in a real browser: Playwright drives Debian's Chromium against a real
`settled serve` process on 127.0.0.1 and the real sim. A person logs in, filters the
queue, opens an action, settles one with evidence and a filter's worth after its
preview, confirms a held action (the sim receives it once) and retries a failed one; a
read-only person is refused every write; a form from another origin is refused; hostile
ids and bodies run no script and read as written; axe-core finds no serious violation.
Screenshots at 1280 and 390 px are saved for review (tmp/artifacts/console, or
$SETTLED_ARTIFACTS). Every wait is Playwright's own (auto-waiting, expect), never a sleep.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from invariants import dump
from ledger_rows import add
from realservers import axe_core_js
from serving import TOKENS, auth, env_name, process
from support import PATIENT, ROOT, sim_conf, write_config

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.serve.console.rendering import aid_url

CHROMIUM = "/usr/bin/chromium"
UI_SECRET = "u" * 32
HOSTILE_ID = '<script>window.__pwned=1</script>"><img src=x onerror=window.__pwned=2>'
HOSTILE_TEXT = (
    'javascript:window.__pwned=3 <b onmouseover="window.__pwned=4">bold</b> \u202eexe.txt'
)
ARTIFACTS = Path(os.environ.get("SETTLED_ARTIFACTS") or ROOT / "tmp" / "artifacts") / "console"

pytestmark = [
    pytest.mark.sqlite_only,
    pytest.mark.slow(seconds=45),
]  # about the pages, not the ledger's backend

if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]'")
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium refuses its own sandbox
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def axe() -> str:
    path = axe_core_js()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("npm is needed to fetch axe-core")
        pytest.skip("npm is not installed: the accessibility check needs axe-core from npm")
    return path.read_text()


class Watch:
    """What the page did that it must not: a script that ran (the hostile payloads set
    ``window.__pwned``), an error, or a refused inline script (a CSP report)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.console: list[str] = []
        self.errors: list[str] = []
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def clean(self) -> None:
        assert self.page.evaluate("window.__pwned") == 0
        assert self.errors == []
        # a refused request's status is the test's to check; any other error is not
        errors = [
            m
            for m in self.console
            if m.startswith("error")
            and "Failed to load resource: the server responded with a status of 4" not in m
        ]
        assert errors == [], self.console


@pytest.fixture
def ui(tmp_path: Path, sim: SimServer, browser: Any, axe: str) -> Iterator[Any]:
    """A real `settled serve` on this test's ledger, and a fresh browser context."""
    sections: dict[str, dict[str, Any]] = {}
    for name, (_secret, roles) in TOKENS.items():
        sections[f"serve.tokens.{name}"] = {"secret": f"${{{env_name(name)}}}", "roles": roles}
    sections["serve.ui"] = {"session_secret": "${SETTLED_TEST_UI_SECRET}"}
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, timeout=10.0)}, **sections)
    with process(env={"SETTLED_TEST_UI_SECRET": UI_SECRET}) as svc:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script("window.__pwned = 0;")
        context.add_init_script(axe)  # an init script: not an inline one the CSP would refuse
        context.set_default_timeout(30_000)
        page = context.new_page()
        watch = Watch(page)
        try:
            yield svc.url, page, watch
        finally:
            context.close()


def log_in(page: Any, url: str, token: str = "ops", name: str = "") -> None:
    page.goto(url + "/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login$"))
    page.get_by_label("API token").fill(TOKENS[token][0])
    if name:
        page.get_by_label("Your name").fill(name)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_test_id("person")).to_have_text(name or token)


def shots(page: Any, name: str) -> None:
    """The page at 1280 and at 390 px wide (a phone), full length, for review."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        shot = ARTIFACTS / f"{name}-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 0
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
            .slice(0, 5).map(e => e.tagName + '.' + e.className)""")
        assert overflow <= 1, f"{name} at {width} px scrolls sideways by {overflow} px: {wide}"
    page.set_viewport_size({"width": 1280, "height": 900})


def accessible(page: Any) -> None:
    """axe-core in the page: no serious or critical violation."""
    found = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
              .filter(v => v.impact === 'serious' || v.impact === 'critical')
              .map(v => v.id + ': ' + v.nodes.map(n => n.target.join(' ')).join(', '))"""
    )
    assert found == [], found


def seed(db: Any, *ids: str, **kw: Any) -> None:
    with Ledger.open(db) as led:
        for a in ids:
            add(led, a, **kw)


def status_of(db: Any, aid: str) -> Status:
    with Ledger.open(db, create=False) as led:
        return led.get(aid).status


# ------------------------------------------------------------------ the person's day


def test_log_in_filter_open_and_resolve_one_with_evidence(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    seed(db_path, "order-41-mail", "order-42-mail", reason="HTTP 503 from the relay")
    seed(db_path, "order-7-sms", reason="blind operation: a person must verify it", age=7200)
    page.goto(url + "/ui/login")
    accessible(page)
    page.keyboard.press("Tab")  # the first stop is the skip link, then the form
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="settled")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_label("API token")).to_be_focused()
    page.keyboard.type(TOKENS["ops"][0])
    page.keyboard.press("Tab")
    page.keyboard.type("alice")
    page.keyboard.press("Enter")  # the keyboard alone logs in
    expect(page.get_by_test_id("person")).to_have_text("alice")
    expect(page.get_by_test_id("total")).to_have_text("3")
    shots(page, "queue")
    accessible(page)
    page.get_by_label("Text in reason or reply").fill("http 503")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("total")).to_have_text("2")
    expect(page.get_by_role("link", name="order-7-sms")).to_have_count(0)
    page.get_by_role("link", name="order-42-mail").click()
    expect(page.get_by_test_id("action-id")).to_have_text("order-42-mail")
    shots(page, "action")
    accessible(page)
    page.get_by_label("It was applied").check()
    page.get_by_label("How you know").fill("customer replied")
    page.get_by_label("Evidence").fill("ticket 991")
    page.get_by_role("button", name="Record verdict").click()
    expect(page.get_by_role("status")).to_have_text("Your verdict was recorded.")
    expect(page.get_by_test_id("next")).to_have_text("Next: settled")
    expect(page.get_by_test_id("timeline")).to_contain_text("evidence: ticket 991")
    expect(page.get_by_test_id("timeline")).to_contain_text("operator:alice via ui:token:ops:")
    assert status_of(db_path, "order-42-mail") is Status.CONFIRMED
    assert status_of(db_path, "order-41-mail") is Status.DENIED_UNRESOLVED
    watch.clean()


def test_bulk_resolve_a_filter_after_its_preview(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    seed(db_path, *(f"bounce-{i}" for i in range(5)), reason="bounced at the relay")
    seed(db_path, "keep-1")
    log_in(page, url, "ops", "alice")
    page.get_by_label("Text in reason or reply").fill("bounced")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("total")).to_have_text("5")
    page.get_by_label("Verdict").select_option("resolve_not_applied")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_test_id("bulk-count")).to_have_text("5")
    expect(page.get_by_test_id("preview").get_by_role("row")).to_have_count(6)  # with the head
    shots(page, "bulk-preview")
    accessible(page)
    assert status_of(db_path, "bounce-0") is Status.DENIED_UNRESOLVED  # a preview does nothing
    page.get_by_label("How you know").fill("bounce report 991")
    page.get_by_role("button", name="Review this verdict").click()
    expect(page.get_by_test_id("verdict")).to_contain_text("bounce report 991")
    shots(page, "bulk-review")
    accessible(page)
    assert status_of(db_path, "bounce-0") is Status.DENIED_UNRESOLVED  # nor does a review
    page.get_by_label("Type 5").fill("4")
    page.get_by_role("button", name=re.compile("Resolve as not applied: 5")).click()
    expect(page.get_by_test_id("error")).to_contain_text("Type 5")
    accessible(page)  # the refusal, announced as an alert
    assert status_of(db_path, "bounce-0") is Status.DENIED_UNRESOLVED
    page.get_by_label("Type 5").fill("5")
    page.get_by_role("button", name=re.compile("Resolve as not applied: 5")).click()
    expect(page.get_by_test_id("bulk-done")).to_contain_text("5 records handled")
    shots(page, "bulk-done")
    accessible(page)
    assert all(status_of(db_path, f"bounce-{i}") is Status.FAILED for i in range(5))
    assert status_of(db_path, "keep-1") is Status.DENIED_UNRESOLVED
    watch.clean()


def test_confirm_a_held_action_and_the_sim_receives_it_once(
    ui: Any, db_path: Any, sim: SimServer
) -> None:
    url, page, watch = ui
    body = {
        "provider": "sim",
        "operation": "book",
        "action_id": "held/1",
        "params": {"n": 1},
        "needs_confirmation": True,
    }
    r = httpx.post(url + "/api/v1/actions", json=body, headers=auth("app"), timeout=30)
    assert r.status_code == 201 and r.json()["status"] == "PENDING"
    log_in(page, url, "app")
    page.goto(url + aid_url("held/1"))
    expect(page.get_by_test_id("action-id")).to_have_text("held/1")
    other = page.context.new_page()  # a second tab on the same action, its form still there
    other.goto(url + aid_url("held/1"))
    page.get_by_role("button", name="Confirm and send").click()
    expect(page.get_by_role("status")).to_have_text(
        "Confirmed: sent once, and the effect was observed."
    )
    expect(page.locator(".state .status")).to_have_text("CONFIRMED")
    other.get_by_role("button", name="Confirm and send").click()
    expect(other.get_by_role("status")).to_have_text("Nothing sent: it had already completed.")
    assert len(sim.requests_for("held/1")) == 1 and sim.effects_for("held/1") == 1
    watch.clean()


def test_retry_a_failed_action(ui: Any, db_path: Any, sim: SimServer) -> None:
    url, page, watch = ui
    sim.plan("f-1", "reject")
    body = {"provider": "sim", "operation": "book", "action_id": "f-1", "params": {}}
    r = httpx.post(url + "/api/v1/actions", json=body, headers=auth("app"), timeout=30)
    assert r.json()["status"] == "FAILED", r.text
    log_in(page, url)
    page.goto(url + aid_url("f-1"))
    page.get_by_role("button", name="Retry").click()
    expect(page.get_by_role("status")).to_have_text("A new attempt was opened and dispatched.")
    expect(page.locator(".state .status")).to_have_text("CONFIRMED")
    assert sim.effects_for("f-1") == 1
    watch.clean()


# ------------------------------------------------------------------ refusals


def test_a_read_only_person_sees_no_buttons_and_every_write_is_refused(
    ui: Any, db_path: Any
) -> None:
    url, page, watch = ui
    seed(db_path, "ro-1")
    log_in(page, url, "reader", "rita")
    page.goto(url + aid_url("ro-1"))
    expect(page.get_by_test_id("read-only")).to_be_visible()
    page.goto(url + aid_url("no-such-action"))  # the error page, as a person meets it
    expect(page.get_by_test_id("error")).to_contain_text("no-such-action")
    accessible(page)
    page.goto(url + aid_url("ro-1"))
    expect(page.locator("form input[name=do]")).to_have_count(0)
    page.goto(url + "/ui/")
    expect(page.get_by_role("button", name="Preview")).to_have_count(0)
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    before = dump(db_path)
    for do in ("resolve", "retry", "reconcile", "confirm"):
        r = page.request.post(
            url + aid_url("ro-1"),
            headers={"Origin": url},
            form={"csrf": csrf, "do": do, "verdict": "applied", "reason": "x"},
        )
        assert r.status == 403, (do, r.status)
    r = page.request.post(
        url + "/ui/bulk",
        headers={"Origin": url},
        form={"csrf": csrf, "do": "resolve_applied", "reason": "x", "typed": "1"},
    )
    assert r.status == 403
    assert dump(db_path) == before
    watch.clean()


class _Attacker(BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        page = (
            f'<!doctype html><title>win a prize</title><form method="post" action="{self.target}">'
            '<input name="do" value="resolve"><input name="verdict" value="applied">'
            '<input name="reason" value="forged"><input name="csrf" value="guess">'
            "<button>Claim</button></form>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_form_posted_from_another_origin_is_refused(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    seed(db_path, "victim-1")
    log_in(page, url)
    _Attacker.target = url + aid_url("victim-1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        before = dump(db_path)
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        with page.expect_response(lambda r: r.url == _Attacker.target) as answer:
            page.get_by_role("button", name="Claim").click()
        assert answer.value.status == 403  # the Origin names the other site
        assert dump(db_path) == before
        watch.clean()
    finally:
        server.shutdown()
        server.server_close()


def test_hostile_data_runs_no_script_and_reads_as_written(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    seed(db_path, HOSTILE_ID, reason=HOSTILE_TEXT, params={"note": HOSTILE_TEXT})
    seed(db_path, "javascript:window.__pwned=5", reason="an id that looks like a link")
    long_id = "order-" + "x" * 190 + "-end"  # 200 characters, no space: it wraps, never cut
    seed(db_path, long_id)
    log_in(page, url)
    expect(page.get_by_test_id("total")).to_have_text("3")
    expect(page.get_by_role("link", name=long_id)).to_have_text(long_id)
    link = page.get_by_role("link", name=HOSTILE_ID)
    expect(link).to_have_count(1)
    href = page.get_by_role("link", name="javascript:window.__pwned=5").get_attribute("href")
    assert href is not None and href.startswith("/ui/actions/javascript%3A")
    written = HOSTILE_TEXT.replace("\u202e", "\\u202e")
    expect(page.locator("table.queue")).to_contain_text(written)
    link.click()
    expect(page.get_by_test_id("action-id")).to_have_text(HOSTILE_ID)
    expect(page.get_by_test_id("reason")).to_have_text(written)
    expect(page.get_by_test_id("params")).to_contain_text(written.replace('"', '\\"'))
    shots(page, "hostile")
    page.get_by_role("link", name="← Queue").click()
    page.get_by_role("link", name="javascript:window.__pwned=5").click()
    expect(page.get_by_test_id("action-id")).to_have_text("javascript:window.__pwned=5")
    for path, name in (
        ("/ui/stats", "stats"),
        ("/ui/providers", "providers"),
        ("/ui/bulk?do=resolve_applied", "bulk-hostile"),
    ):
        page.goto(url + path)
        expect(page.locator("h1")).to_be_visible()
        shots(page, name)
        accessible(page)
    page.goto(url + "/ui/")
    shots(page, "queue-long-ids")  # no sideways scroll at 390 px, ids whole
    page.get_by_text(HOSTILE_ID).first.hover()  # an onmouseover would fire now
    watch.clean()


def test_the_queue_refreshes_itself_with_its_own_script(ui: Any, db_path: Any) -> None:
    url, page, watch = ui
    seed(db_path, "first-1")
    log_in(page, url)
    expect(page.get_by_test_id("total")).to_have_text("1")
    page.clock.install()  # the page's timers, driven by the test: no wait for 10 s
    page.reload()
    seed(db_path, HOSTILE_ID, reason=HOSTILE_TEXT)  # what the script swaps in is escaped too
    page.clock.run_for(10_500)
    expect(page.get_by_role("link", name=HOSTILE_ID)).to_be_visible()
    expect(page.get_by_test_id("total")).to_have_text("2")
    watch.clean()


# ------------------------------------------------------------------ an incident, from the browser

LOST, LATE, NOTICES, FINE = 4, 3, 2, 2
LAG = 6.0  # s before a late effect shows: long after its 1 s verification budget
BOUND = 120.0  # s for any phase on a loaded machine


def until(predicate: Any, what: str) -> Any:
    """A bounded poll of real state (the service's API, the sim's truth), never a sleep
    that guesses: it ends as soon as the state is there."""
    import time

    deadline = time.monotonic() + BOUND
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_incident_settled_from_the_browser_agrees_with_the_sims_truth(
    tmp_path: Path, sim: SimServer, browser: Any, axe: str, db_path: Any
) -> None:
    """As the CLI's triage test, in a browser: sends lost after the provider accepted
    them, sends whose effect shows long after their budget ran out, blind notices and
    a few that went well. The person reads the causes, checks the sends with the
    provider once the late effects show (a bulk check), records the lost ones as not
    applied (a bulk verdict, each checked against the provider first) and the notices
    as applied; at the end every record agrees with what the sim applied."""
    from invariants import check_events

    sections: dict[str, dict[str, Any]] = {"daemon": {"interval": 0.2}}
    for name, (_secret, roles) in TOKENS.items():
        sections[f"serve.tokens.{name}"] = {"secret": f"${{{env_name(name)}}}", "roles": roles}
    sections["serve.ui"] = {"session_secret": "${SETTLED_TEST_UI_SECRET}"}
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, timeout=PATIENT)}, **sections)
    plan = (
        [(f"lost-{i}", "send", "lost_after_accept") for i in range(LOST)]
        + [(f"late-{i}", "send", f"lag:{LAG:g}") for i in range(LATE)]
        + [(f"notice-{i}", "notify", "ok") for i in range(NOTICES)]
        + [(f"fine-{i}", "book", "ok") for i in range(FINE)]
    )
    with (
        process("--reconcile", env={"SETTLED_TEST_UI_SECRET": UI_SECRET}) as svc,
        httpx.Client(base_url=svc.url, timeout=30) as api,
    ):
        for aid, op, fault in plan:
            sim.plan(aid, fault)
            r = api.post(
                "/api/v1/actions",
                headers=auth("app"),
                json={"provider": "sim", "operation": op, "action_id": aid, "params": {}},
            )
            assert r.status_code == 201, r.text

        def settled_down() -> list[dict[str, Any]] | None:
            rows = api.get("/api/v1/actions", params={"status": "all"}, headers=auth("reader"))
            actions: list[dict[str, Any]] = rows.json()["actions"]
            busy = [a for a in actions if a["status"] not in ("CONFIRMED", "DENIED_UNRESOLVED")]
            return None if busy else actions

        actions = until(settled_down, "every budget to run out")
        keys = {a["action_id"]: a["reconciliation_key"] for a in actions}
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_init_script("window.__pwned = 0;")
        context.add_init_script(axe)
        context.set_default_timeout(30_000)
        page = context.new_page()
        watch = Watch(page)
        try:
            log_in(page, svc.url, "ops", "olga")
            # 1. the first screen: what is held, and why
            expect(page.get_by_test_id("total")).to_have_text(str(LOST + LATE + NOTICES))
            expect(page.locator("table.reasons")).to_contain_text("verification budget spent")
            expect(page.locator("table.reasons")).to_contain_text("blind operation")
            shots(page, "incident-queue")
            # 2. once the late effects show, a check of every send with the provider
            until(
                lambda: all(sim.effect_view(str(keys[f"late-{i}"])) for i in range(LATE)),
                "the late effects to show",
            )
            page.get_by_label("Operation").select_option("send")
            page.get_by_role("button", name="Filter").click()
            expect(page.get_by_test_id("total")).to_have_text(str(LOST + LATE))
            page.get_by_label("Verdict").select_option("reconcile")
            page.get_by_role("button", name="Preview").click()
            expect(page.get_by_test_id("bulk-count")).to_have_text(str(LOST + LATE))
            page.get_by_label(f"Type {LOST + LATE}").fill(str(LOST + LATE))
            page.get_by_role("button", name=re.compile("Check with the provider now")).click()
            expect(page.get_by_test_id("bulk-done")).to_be_visible()
            # 3. what no evidence will settle: the lost sends, not applied
            page.get_by_role("link", name="← Queue (this filter)").click()
            expect(page.get_by_test_id("total")).to_have_text(str(LOST))
            page.get_by_label("Verdict").select_option("resolve_not_applied")
            page.get_by_role("button", name="Preview").click()
            expect(page.get_by_test_id("bulk-count")).to_have_text(str(LOST))
            expect(page.get_by_test_id("preview")).to_contain_text("FAILED unless a check sees it")
            page.get_by_label("How you know").fill("lost by the provider after accepting it")
            page.get_by_role("button", name="Review this verdict").click()
            page.get_by_label(f"Type {LOST}").fill(str(LOST))
            page.get_by_role("button", name=re.compile("Resolve as not applied")).click()
            expect(page.get_by_test_id("bulk-done")).to_contain_text(f"{LOST} records handled")
            # 4. the notices: the customer confirmed them
            page.goto(svc.url + "/ui/?operation=notify")
            expect(page.get_by_test_id("total")).to_have_text(str(NOTICES))
            page.get_by_label("Verdict").select_option("resolve_applied")
            page.get_by_role("button", name="Preview").click()
            page.get_by_label("How you know").fill("the customers replied")
            page.get_by_label("Evidence").fill("tickets 1201, 1202")
            page.get_by_role("button", name="Review this verdict").click()
            expect(page.get_by_test_id("verdict")).to_contain_text("tickets 1201, 1202")
            page.get_by_label(f"Type {NOTICES}").fill(str(NOTICES))
            page.get_by_role("button", name=re.compile("Resolve as applied")).click()
            expect(page.get_by_test_id("bulk-done")).to_contain_text(f"{NOTICES} records handled")
            page.goto(svc.url + "/ui/")
            expect(page.get_by_test_id("empty")).to_be_visible()
            watch.clean()
        finally:
            context.close()
    # the sim's truth agrees with every record, and nothing was sent twice
    with Ledger.open(db_path, create=False) as led:
        for aid, _op, _fault in plan:
            rec = led.get(aid)
            applied = sim.effects_for(aid)
            assert len(sim.requests_for(aid)) == 1, aid
            assert rec.status is (Status.CONFIRMED if applied else Status.FAILED), (aid, rec.status)
            check_events(led, rec)
        assert all(led.get(f"lost-{i}").confirmed_by is None for i in range(LOST))
        assert led.events("notice-0")[-1].actor.startswith("operator:olga via ui:token:ops:")


def test_the_console_works_without_javascript(ui: Any, browser: Any, db_path: Any) -> None:
    url, _page, _watch = ui
    seed(db_path, "nojs-1")
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        log_in(page, url, "ops", "nina")
        page.get_by_role("link", name="nojs-1").click()
        page.get_by_label("It was not applied").check()
        page.get_by_label("How you know").fill("the customer says it never came")
        page.get_by_role("button", name="Record verdict").click()
        expect(page.get_by_role("status")).to_have_text("Your verdict was recorded.")
    finally:
        context.close()
    assert status_of(db_path, "nojs-1") is Status.FAILED
