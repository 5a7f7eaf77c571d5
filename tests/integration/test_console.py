"""The console at /ui/ in process: the real ASGI app (Starlette's TestClient), a real
ledger and the real sim on loopback. Who may log in and do what, every write's checks
(Origin, CSRF token, role) refusing with the ledger unchanged, GET changing nothing,
hostile ids and bodies shown as text, and each verdict going through the core."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import dump
from ledger_rows import add
from serving import PORT, TOKENS, auth, env_name, in_process, token_env
from support import sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer
from settled.serve.console.rendering import aid_url

ORIGIN = f"http://127.0.0.1:{PORT}"
UI_SECRET = "u" * 32
HOSTILE = '<script>window.__pwned=1</script>"><img src=x onerror="window.__pwned=2">\u202etxt.exe'


def write_ui_config(path: Path, sim: SimServer, **ui: Any) -> Path:
    sections: dict[str, dict[str, Any]] = {}
    for name, (_secret, roles) in TOKENS.items():
        sections[f"serve.tokens.{name}"] = {"secret": f"${{{env_name(name)}}}", "roles": roles}
    sections["serve.ui"] = {"session_secret": "${SETTLED_TEST_UI_SECRET}", **ui}
    return write_config(path, {"sim": sim_conf(sim)}, **sections)


@pytest.fixture
def ui(tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SETTLED_TEST_UI_SECRET", UI_SECRET)
    write_ui_config(
        tmp_path / "settled.toml", sim, trusted_proxies=["10.9.8.7"], proxy_roles=["operate"]
    )
    with in_process(mcp=False) as (c, lines):
        c.lines = lines
        yield c


def login(c: Any, token: str = "ops", name: str = "") -> Any:
    page = c.get("/ui/login")
    assert page.status_code == 200, page.text
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    assert nonce is not None
    return c.post(
        "/ui/login",
        data={"nonce": nonce.group(1), "token": TOKENS[token][0], "name": name},
        headers={"Origin": ORIGIN},
        follow_redirects=False,
    )


def csrf_of(text: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', text)
    assert m is not None, "no CSRF token on the page"
    return m.group(1)


def post(c: Any, url: str, data: dict[str, str], *, origin: str | None = ORIGIN) -> Any:
    headers = {"Origin": origin} if origin is not None else {}
    return c.post(url, data=data, headers=headers, follow_redirects=False)


def stuck(db: Any, *ids: str, **kw: Any) -> None:
    with Ledger.open(db) as led:
        for a in ids:
            add(led, a, **kw)


def record(db: Any, aid: str) -> Any:
    with Ledger.open(db, create=False) as led:
        return led.get(aid), led.events(aid)


# ------------------------------------------------------------------ login and sessions


def test_a_page_without_a_session_sends_the_person_to_log_in(ui: Any) -> None:
    r = ui.get("/ui/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert "default-src 'self'" in r.headers["content-security-policy"]


def test_a_wrong_token_logs_nobody_in(ui: Any) -> None:
    page = ui.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = ui.post(
        "/ui/login",
        data={"nonce": nonce, "token": "x" * 20},
        headers={"Origin": ORIGIN},
        follow_redirects=False,
    )
    assert r.status_code == 401 and "not valid" in r.text
    assert "set-cookie" not in r.headers
    assert "x" * 20 not in r.text  # the token is never echoed


def nonce_of(c: Any) -> str:
    m = re.search(r'name="nonce" value="([^"]+)"', c.get("/ui/login").text)
    assert m is not None
    return m.group(1)


def try_login(c: Any, token: str, name: str = "", nonce: str | None = None) -> Any:
    return c.post(
        "/ui/login",
        data={"nonce": nonce or nonce_of(c), "token": token, "name": name},
        headers={"Origin": ORIGIN},
        follow_redirects=False,
    )


class Clock:
    """A monotonic clock the test moves by hand (the throttle's waits, without waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_guesser_is_slowed_to_a_crawl(ui: Any) -> None:
    """100 wrong tokens, each with a fresh form: a few are answered at once, then every
    one waits longer than the last (429 with Retry-After); a guess sent before its wait
    is over is answered 429 without its token being looked at, the right token too."""
    from settled.serve.logins import FREE, MAX_WAIT, Logins

    clock = Clock()
    ui.service.logins = Logins(clock=clock)
    waits: list[int] = []
    looked_at: list[int] = []  # the guesses answered 401
    for n in range(300):  # bounded: 100 guesses, each sent again after a 429
        if len(looked_at) == 100:
            break
        r = try_login(ui, f"wrong-token-{len(looked_at):04d}-xxxxxxxx")
        assert "set-cookie" not in r.headers
        if r.status_code == 429:
            wait = int(r.headers["retry-after"])
            assert "try again in" in r.text
            early = try_login(ui, TOKENS["ops"][0])  # the right token, too soon
            assert early.status_code == 429 and "set-cookie" not in early.headers
            waits.append(wait)
            clock.now += wait  # the guesser waits as told, then sends the guess again
        else:
            assert r.status_code == 401, r.text
            looked_at.append(n)
    assert len(looked_at) == 100
    assert looked_at[:FREE] == list(range(FREE))  # then the first wait
    assert looked_at[FREE] == FREE + 1  # the guess answered 429 came between
    assert waits == sorted(waits) and waits[0] >= 1 and waits[-1] == MAX_WAIT
    assert sum(waits) > 20 * 3600, f"100 guesses took {sum(waits)} s"
    clock.now += MAX_WAIT
    r = try_login(ui, TOKENS["ops"][0])  # its wait over, the right token logs in
    assert r.status_code == 303 and "set-cookie" in r.headers
    refused = [e for e in ui.lines.entries if e.get("event") == "login" and "refused" in e]
    assert any("throttled" in e["refused"] for e in refused)


def test_the_throttle_counts_by_address_and_by_name() -> None:
    from settled.serve.logins import FREE, Logins, keys_for

    clock = Clock()
    logins = Logins(clock=clock)
    alice_here = keys_for("192.0.2.7", "alice")
    for _ in range(FREE - 1):
        logins.failed(alice_here)
    assert logins.wait(alice_here) == 0
    logins.failed(alice_here)
    assert logins.wait(alice_here) >= 1
    assert logins.wait(keys_for("192.0.2.7", None)) >= 1  # the address, whatever the name
    assert logins.wait(keys_for("198.51.100.1", "Alice")) >= 1  # the name, from anywhere
    assert logins.wait(keys_for("198.51.100.1", "bob")) == 0
    v6 = keys_for("2001:db8:1:2::1", None)
    for _ in range(FREE):
        logins.failed(v6)
    assert logins.wait(keys_for("2001:db8:1:2:ffff::9", None)) >= 1  # the same /64
    assert logins.wait(keys_for("2001:db8:1:3::1", None)) == 0
    logins.succeeded(alice_here)
    assert logins.wait(alice_here) == 0


def test_a_login_form_is_taken_once(ui: Any) -> None:
    nonce = nonce_of(ui)
    first = try_login(ui, "x" * 20, nonce=nonce)
    assert first.status_code == 401
    again = try_login(ui, TOKENS["ops"][0], nonce=nonce)  # replayed, even with the right token
    assert again.status_code == 403 and "sent already" in again.text
    assert "set-cookie" not in again.headers
    assert try_login(ui, TOKENS["ops"][0]).status_code == 303  # a fresh form works


def test_login_sets_an_httponly_strict_cookie_and_names_the_person(ui: Any) -> None:
    r = login(ui, "ops", "alice")
    assert r.status_code == 303, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Path=/ui/" in cookie and "Secure" not in cookie  # plain HTTP on loopback
    assert TOKENS["ops"][0] not in cookie
    page = ui.get("/ui/")
    assert page.status_code == 200
    assert 'data-testid="person">alice<' in page.text and "(operate)" in page.text
    assert all(TOKENS[n][0] not in str(line) for line in ui.lines.entries for n in TOKENS)


def test_the_cookie_is_secure_behind_tls(
    tmp_path: Path, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.testclient import TestClient

    from settled.serve.asgi import build
    from settled.serve.run import open_service

    for k, v in token_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SETTLED_TEST_UI_SECRET", UI_SECRET)
    write_ui_config(tmp_path / "settled.toml", sim)
    service = open_service(host="127.0.0.1", port=PORT)
    try:
        with TestClient(build(service), base_url=f"https://127.0.0.1:{PORT}") as c:
            page = c.get("/ui/login")
            nonce = re.search(r'name="nonce" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            r = c.post(
                "/ui/login",
                data={"nonce": nonce, "token": TOKENS["ops"][0]},
                headers={"Origin": f"https://127.0.0.1:{PORT}"},
                follow_redirects=False,
            )
            assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]
    finally:
        service.close()


def test_a_tampered_or_foreign_cookie_is_no_session(ui: Any) -> None:
    assert login(ui).status_code == 303
    good = ui.cookies.get("settled_session")
    body, sig = good.split(".")
    ui.cookies.clear()
    ui.cookies.set("settled_session", body + "." + sig[::-1], path="/ui/")
    assert ui.get("/ui/", follow_redirects=False).status_code == 303


def test_the_proxy_header_is_honoured_only_from_a_trusted_address(ui: Any, db_path: Any) -> None:
    from starlette.testclient import TestClient

    # from the TestClient's own address the header is ignored: not logged in
    r = ui.get("/ui/", headers={"X-Forwarded-User": "mallory"}, follow_redirects=False)
    assert r.status_code == 303
    # from the trusted proxy it names the person, with proxy_roles
    app = ui.app
    with TestClient(app, base_url=ORIGIN, client=("10.9.8.7", 4000)) as proxied:
        page = proxied.get("/ui/", headers={"X-Forwarded-User": "carol@example.com"})
        assert page.status_code == 200 and 'data-testid="person">carol@example.com<' in page.text
        stuck(db_path, "p-1")
        action = proxied.get(aid_url("p-1"), headers={"X-Forwarded-User": "carol@example.com"})
        r = proxied.post(
            aid_url("p-1"),
            data={
                "csrf": csrf_of(action.text),
                "do": "resolve",
                "verdict": "applied",
                "reason": "saw it",
            },
            headers={"X-Forwarded-User": "carol@example.com", "Origin": ORIGIN},
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        rec, events = record(db_path, "p-1")
        assert rec.status is Status.CONFIRMED
        assert events[-1].actor.startswith("operator:carol@example.com via ui:proxy:")
        # the same cookie from the proxy naming someone else is not carol's session
        other = proxied.get("/ui/", headers={"X-Forwarded-User": "dave"})
        assert 'data-testid="person">dave<' in other.text


# ------------------------------------------------------------------ the pages


def test_the_queue_filters_as_the_cli_does(ui: Any, db_path: Any) -> None:
    stuck(db_path, "mail-1", "mail-2", reason="HTTP 503 from the relay")
    stuck(db_path, "old-1", age=7200)
    login(ui)
    page = ui.get("/ui/")
    assert '<span data-testid="total">3</span>' in page.text
    page = ui.get("/ui/", params={"match": "http 503"})
    assert '<span data-testid="total">2</span>' in page.text and "old-1" not in page.text
    page = ui.get("/ui/", params={"older_than": "1h"})
    assert '<span data-testid="total">1</span>' in page.text and "old-1" in page.text
    bad = ui.get("/ui/", params={"provider": "nope"})
    assert bad.status_code == 422 and "no provider" in bad.text


def test_hostile_ids_and_bodies_are_shown_as_text(ui: Any, db_path: Any) -> None:
    aid = "a/" + HOSTILE
    stuck(
        db_path, aid, reason=HOSTILE, params={"note": HOSTILE, "javascript": "javascript:alert(1)"}
    )
    login(ui)
    for url in ("/ui/", aid_url(aid), "/ui/stats"):
        page = ui.get(url)
        assert page.status_code == 200, (
            url,
            [e.get("error") for e in ui.lines.entries if e.get("level") == "error"],
        )
        assert "<script>window" not in page.text and "<img src=x" not in page.text
        assert "\u202e" not in page.text  # bidi controls are written out
        assert 'href="javascript:' not in page.text
    page = ui.get(aid_url(aid))
    assert html.escape("<script>window.__pwned=1</script>", quote=False) in page.text
    assert "\\u202etxt.exe" in page.text and 'data-testid="hidden-note"' in page.text
    assert aid_url(aid).count("/") == 3  # the id's '/' is %2F: one path segment


def test_the_action_page_tells_its_story_with_secrets_redacted(
    ui: Any, db_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck(db_path, "story-1", params={"to": "x", "api_key": "sekrit-value-1234"})
    login(ui)
    page = ui.get(aid_url("story-1"))
    assert "sekrit-value-1234" not in page.text and "***" in page.text
    assert 'data-testid="hidden-note"' not in page.text  # nothing hidden: no note
    assert 'data-testid="timeline"' in page.text and "recorded" in page.text
    assert "UTC (" in page.text and " ago)" in page.text  # times with zone and age


# ------------------------------------------------------------------ verdicts


def test_resolve_with_evidence_names_the_person_and_the_session(ui: Any, db_path: Any) -> None:
    stuck(db_path, "r-1")
    login(ui, "ops", "alice")
    page = ui.get(aid_url("r-1"))
    r = post(
        ui,
        aid_url("r-1"),
        {
            "csrf": csrf_of(page.text),
            "do": "resolve",
            "verdict": "applied",
            "reason": "customer replied",
            "evidence": "ticket 991",
        },
    )
    assert r.status_code == 303 and r.headers["location"] == aid_url("r-1") + "?did=resolved"
    rec, events = record(db_path, "r-1")
    assert rec.status is Status.CONFIRMED
    assert rec.confirmed_by.startswith("operator:alice via ui:token:ops:")
    assert events[-1].detail["evidence"] == "ticket 991"
    done = ui.get(r.headers["location"])
    assert "Your verdict was recorded." in done.text and "ticket 991" in done.text


def test_not_applied_on_a_visible_effect_is_refused_by_the_check(
    ui: Any, db_path: Any, sim: SimServer
) -> None:
    sim.plan("seen-1", "timeout_after_apply")
    r = ui.post(
        "/api/v1/actions",
        json={"provider": "sim", "operation": "book", "action_id": "seen-1", "params": {}},
        headers=auth("app"),
    )
    assert r.json()["status"] == "DENIED_UNRESOLVED", r.text
    login(ui)
    page = ui.get(aid_url("seen-1"))
    r = post(
        ui,
        aid_url("seen-1"),
        {
            "csrf": csrf_of(page.text),
            "do": "resolve",
            "verdict": "not_applied",
            "reason": "never arrived",
        },
    )
    assert r.status_code == 409 and "Refused" in r.text
    assert "The provider shows that this did happen" in r.text and "--no-recheck" not in r.text
    rec, events = record(db_path, "seen-1")
    assert rec.status is Status.CONFIRMED  # settled by what the check saw
    claim = [e for e in events if e.kind == "note" and (e.detail or {}).get("refused")]
    assert len(claim) == 1 and claim[0].detail["verdict"] == "not_applied"
    assert claim[0].detail["reason"] == "never arrived"
    assert claim[0].actor.startswith("operator:ops via ui:")  # the person, kept


def test_confirm_sends_a_held_action_once(ui: Any, db_path: Any, sim: SimServer) -> None:
    r = ui.post(
        "/api/v1/actions",
        json={
            "provider": "sim",
            "operation": "book",
            "action_id": "held-1",
            "params": {},
            "needs_confirmation": True,
        },
        headers=auth("app"),
    )
    assert r.json()["status"] == "PENDING"
    login(ui, "app")
    page = ui.get(aid_url("held-1"))
    assert "Confirm and send" in page.text
    token = csrf_of(page.text)
    first = post(ui, aid_url("held-1"), {"csrf": token, "do": "confirm"})
    assert first.headers["location"].endswith("?did=confirm-dispatched-succeeded")
    again = post(ui, aid_url("held-1"), {"csrf": token, "do": "confirm"})
    assert again.headers["location"].endswith("?did=confirm-already_completed")
    assert len(sim.requests_for("held-1")) == 1 and sim.effects_for("held-1") == 1


def test_retry_opens_a_new_attempt_of_a_failed_action(
    ui: Any, db_path: Any, sim: SimServer
) -> None:
    sim.plan("f-1", "reject")
    r = ui.post(
        "/api/v1/actions",
        json={"provider": "sim", "operation": "book", "action_id": "f-1", "params": {}},
        headers=auth("app"),
    )
    assert r.json()["status"] == "FAILED", r.text
    login(ui)
    page = ui.get(aid_url("f-1"))
    r = post(ui, aid_url("f-1"), {"csrf": csrf_of(page.text), "do": "retry"})
    assert r.status_code == 303, r.text
    rec, _ = record(db_path, "f-1")
    assert rec.attempt == 2 and rec.status is Status.CONFIRMED
    assert sim.effects_for("f-1") == 1
    before = dump(db_path)
    again = post(ui, aid_url("f-1"), {"csrf": csrf_of(page.text), "do": "retry"})  # pressed twice
    assert again.status_code == 409 and "retry is allowed only from FAILED" in again.text
    assert dump(db_path) == before and len(sim.requests_for("f-1")) == 2


# ------------------------------------------------------------------ refusals


def test_every_refused_write_leaves_the_ledger_unchanged(ui: Any, db_path: Any) -> None:
    stuck(db_path, "keep-1")
    login(ui)
    page = ui.get(aid_url("keep-1"))
    token = csrf_of(page.text)
    good = {"csrf": token, "do": "resolve", "verdict": "applied", "reason": "x"}
    before = dump(db_path)
    cases = [
        post(ui, aid_url("keep-1"), {**good, "csrf": ""}),  # no token
        post(ui, aid_url("keep-1"), {**good, "csrf": token[::-1]}),  # a wrong one
        post(ui, aid_url("keep-1"), good, origin="http://evil.example"),  # another origin
        post(ui, aid_url("keep-1"), good, origin=None),  # no Origin at all
    ]
    for r in cases:
        assert r.status_code == 403, r.text
    # a GET carrying a verdict's fields changes nothing
    assert ui.get(aid_url("keep-1"), params=good).status_code == 200
    assert (
        ui.get(
            "/ui/bulk", params={"do": "resolve_applied", "reason": "x", "typed": "1"}
        ).status_code
        == 200
    )
    assert dump(db_path) == before
    # a token from another session is stale
    ui.cookies.clear()
    login(ui, "app")
    assert post(ui, aid_url("keep-1"), good).status_code == 403
    assert dump(db_path) == before


def test_a_read_only_person_sees_no_buttons_and_is_refused(ui: Any, db_path: Any) -> None:
    stuck(db_path, "ro-1")
    login(ui, "reader", "rita")
    page = ui.get(aid_url("ro-1"))
    assert 'data-testid="read-only"' in page.text
    assert 'name="do"' not in page.text and "Preview" not in ui.get("/ui/").text
    before = dump(db_path)
    token = csrf_of(page.text)  # the logout form's
    for do in ("resolve", "retry", "reconcile", "confirm"):
        r = post(
            ui, aid_url("ro-1"), {"csrf": token, "do": do, "verdict": "applied", "reason": "x"}
        )
        assert r.status_code == 403 and "may not" in r.text
    r = post(ui, "/ui/bulk", {"csrf": token, "do": "resolve_applied", "reason": "x", "typed": "1"})
    assert r.status_code == 403
    assert dump(db_path) == before


# ------------------------------------------------------------------ bulk


def sealed_form(page: str) -> dict[str, str]:
    """The hidden fields of the page's confirming form (the one that carries the seal),
    as a browser would post them."""
    form = next(f for f in re.findall(r"<form.*?</form>", page, flags=re.S) if 'name="digest"' in f)
    return {
        html.unescape(k): html.unescape(v)
        for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)
    }


def reviewed(ui: Any, q: dict[str, str], **verdict: str) -> Any:
    """A bulk verdict's preview; for a resolve, with its reason and evidence reviewed
    (the page that seals them)."""
    page = ui.get("/ui/bulk", params=q)
    assert page.status_code == 200, page.text
    if not q["do"].startswith("resolve"):
        return page
    fields = {"csrf": csrf_of(page.text), "step": "review", **q, **verdict}
    return post(ui, "/ui/bulk", fields)


def test_bulk_resolve_acts_on_exactly_what_the_preview_showed(ui: Any, db_path: Any) -> None:
    stuck(db_path, "b-1", "b-2", "b-3", reason="bounced at the relay")
    stuck(db_path, "other-1")
    login(ui, "ops", "alice")
    q = {"match": "bounced", "do": "resolve_not_applied"}
    preview = ui.get("/ui/bulk", params=q)
    assert '<span data-testid="bulk-count">3</span>' in preview.text
    assert 'name="digest"' not in preview.text  # the reason comes first: it is sealed too
    review = reviewed(ui, q, reason="bounce report 991", evidence="ticket <9>")
    assert review.status_code == 200, review.text
    assert "bounce report 991" in review.text and "ticket &lt;9&gt;" in review.text
    form = sealed_form(review.text)
    assert form["reason"] == "bounce report 991" and form["evidence"] == "ticket <9>"
    before = dump(db_path)
    wrong = post(ui, "/ui/bulk", {**form, "typed": "2"})
    assert wrong.status_code == 422 and dump(db_path) == before
    stuck(db_path, "b-4", reason="bounced too")  # the selection changes after the preview
    changed = dump(db_path)
    stale = post(ui, "/ui/bulk", {**form, "typed": "3"})
    assert stale.status_code == 409 and "nothing was done" in stale.text
    assert dump(db_path) == changed
    fresh = sealed_form(stale.text)  # the new preview, sealed with the same verdict
    assert fresh["reason"] == "bounce report 991"
    done = post(ui, "/ui/bulk", {**fresh, "typed": "4"})
    assert done.status_code == 200 and 'data-testid="bulk-done"' in done.text, done.text
    for a in ("b-1", "b-2", "b-3", "b-4"):
        rec, events = record(db_path, a)
        assert rec.status is Status.FAILED
        assert events[-1].actor.startswith("operator:alice via ui:token:ops:")
        assert events[-1].detail["person"] == "alice"
        assert events[-1].detail["via"].startswith("ui:token:ops:")
        assert events[-1].detail["reason"] == "bounce report 991"
        assert events[-1].detail["evidence"] == "ticket <9>"
    assert record(db_path, "other-1")[0].status is Status.DENIED_UNRESOLVED
    before = dump(db_path)
    twice = post(ui, "/ui/bulk", {**fresh, "typed": "4"})  # the form sent again
    assert twice.status_code == 409 and dump(db_path) == before


@pytest.mark.parametrize(
    "change",
    [
        {"do": "resolve_not_applied", "no_recheck": "1"},  # the finding: no check at all
        {"do": "resolve_not_applied"},
        {"no_recheck": "1"},
        {"reason": "someone else's reason"},
        {"evidence": "other evidence"},
        {"evidence": ""},
        {"object_id": "obj-1"},
        {"match": "relay"},  # another filter that happens to select the same records
    ],
    ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()),
)
def test_a_bulk_post_that_differs_from_its_preview_in_anything_changes_nothing(
    ui: Any, db_path: Any, change: dict[str, str]
) -> None:
    """The seal binds the verdict, the recheck choice, the reason, the evidence, the
    object id and the selection: a preview of "resolve as applied" posted back as
    anything else (same seal, same filter's records, same typed count) is refused
    with one line, and no record moves."""
    stuck(db_path, "s-1", "s-2", "s-3", reason="bounced at the relay")
    login(ui, "ops", "alice")
    q = {"match": "bounced", "do": "resolve_applied"}
    verdict = {"reason": "the customer confirmed", "evidence": "ticket 7"}
    review = reviewed(ui, q, **verdict)
    form = {**sealed_form(review.text), **verdict}  # what the person's browser posts
    assert form["do"] == "resolve_applied" and "no_recheck" not in form
    before = dump(db_path)
    r = post(ui, "/ui/bulk", {**form, **change, "typed": "3"})
    assert 'data-testid="bulk-done"' not in r.text, f"carried out: {change}"
    assert r.status_code == 409, r.text
    assert "is not the one your preview showed: nothing was done" in r.text
    assert dump(db_path) == before
    done = post(ui, "/ui/bulk", {**form, "typed": "3"})  # the preview's own form still holds
    assert done.status_code == 200 and 'data-testid="bulk-done"' in done.text, done.text
    assert all(record(db_path, a)[0].status is Status.CONFIRMED for a in ("s-1", "s-2", "s-3"))


def held_5xx(db: Any, sim: SimServer, answers: dict[str, str]) -> None:
    """Sends the provider answered with ``answers`` (a 5xx each): unresolved, each
    with its cause (``http_503``...), their params holding an order number."""
    conf = sim_conf(sim, verify_interval=0.1, verify_deadline=0.3)
    reg = Registry({"sim": conf}, source="test")
    try:
        with Ledger.open(db) as led:
            d = Dispatcher(led, reg)
            for aid, fault in answers.items():
                sim.plan(aid, fault)
                d.submit("sim", "send", {"to": f"{aid} order 10927"}, action_id=aid)
    finally:
        reg.close()


@pytest.mark.parametrize(
    "change",
    [
        {"cause": "http_503,http_502"},  # another cause list that selects the same records
        {"cause": ""},
        {"q": "10927"},  # another search that selects the same records
        {"q": ""},
    ],
    ids=lambda c: "+".join(f"{k}={v or 'none'}" for k, v in c.items()),
)
def test_the_bulk_seal_binds_the_search_and_the_cause(
    ui: Any, db_path: Any, sim: SimServer, change: dict[str, str]
) -> None:
    """The queue's search (``q``) and ``cause`` are carried into the bulk preview and
    bound by its seal like every other filter value: a changed one is refused."""
    held_5xx(db_path, sim, {"h-1": "http:503", "h-2": "http:503", "h-3": "http:500"})
    assert {record(db_path, a)[0].cause for a in ("h-1", "h-2", "h-3")} == {"http_503", "http_500"}
    login(ui, "ops", "alice")
    q = {"q": "order 10927", "cause": "http_503", "do": "resolve_applied"}
    verdict = {"reason": "the customer has both", "evidence": "ticket 12"}
    review = reviewed(ui, q, **verdict)
    assert '<span data-testid="bulk-count">2</span>' in review.text, review.text
    form = {**sealed_form(review.text), **verdict}
    assert form["q"] == "order 10927" and form["cause"] == "http_503"
    before = dump(db_path)
    r = post(ui, "/ui/bulk", {**form, **change, "typed": "2"})
    assert r.status_code == 409 and "nothing was done" in r.text, r.text
    assert dump(db_path) == before
    done = post(ui, "/ui/bulk", {**form, "typed": "2"})
    assert done.status_code == 200 and 'data-testid="bulk-done"' in done.text, done.text
    assert record(db_path, "h-1")[0].status is record(db_path, "h-2")[0].status is Status.CONFIRMED
    assert record(db_path, "h-3")[0].status is Status.DENIED_UNRESOLVED


def test_static_files_are_served_and_nothing_else(ui: Any) -> None:
    assert ui.get("/ui/static/console.js").headers["content-type"].startswith("text/javascript")
    assert ui.get("/ui/static/console.css").status_code == 200
    assert ui.get("/ui/static/..%2Fconsole.py").status_code == 404
    assert ui.get("/ui/static/nope.js").status_code == 404


# ------------------------------------------------------------------ the docs


def test_the_console_docs_config_blocks_load_and_make_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tomllib

    from support import ROOT

    from settled.config import from_dict
    from settled.serve.auth import Tokens
    from settled.serve.sessions import Sessions

    doc = (ROOT / "docs" / "console.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.setenv("SETTLED_TOKEN_SUPPORT", "s" * 32)
    monkeypatch.setenv("SETTLED_UI_SECRET", "k" * 32)
    for block in blocks:
        cfg = from_dict(tomllib.loads(block), source="console.md")
        sessions = Sessions.from_config(cfg, Tokens.from_config(cfg))
        assert sessions.key is not None
    keys = re.findall(r"^\| `(\w+)` \|", doc.split("## Config keys")[1], flags=re.M)
    from settled.config import UI_KEYS

    assert sorted(keys) == sorted(UI_KEYS)


def test_bad_console_config_is_one_clear_line(tmp_path: Path, sim: SimServer) -> None:
    from support import run_cli

    for ui, words in (
        ({"trusted_proxies": ["proxy.example.com"]}, "not an IP address"),
        ({"session_secret": "plain-text-secret"}, "must name an environment variable"),
        ({"proxy_roles": ["admin"]}, "proxy_roles"),
        ({"colour": "blue"}, "unknown key"),
    ):
        write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)}, **{"serve.ui": ui})
        r = run_cli("queue")
        assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ more verdicts and sessions


def test_check_now_reconciles_one_action(ui: Any, db_path: Any, sim: SimServer) -> None:
    sim.plan("rc-1", "timeout_after_apply")
    r = ui.post(
        "/api/v1/actions",
        json={"provider": "sim", "operation": "book", "action_id": "rc-1", "params": {}},
        headers=auth("app"),
    )
    assert r.json()["status"] == "DENIED_UNRESOLVED", r.text
    login(ui)
    page = ui.get(aid_url("rc-1"))
    assert "Check now" in page.text
    r = post(ui, aid_url("rc-1"), {"csrf": csrf_of(page.text), "do": "reconcile"})
    assert r.headers["location"].endswith("?did=reconciled")
    rec, events = record(db_path, "rc-1")
    assert rec.status is Status.CONFIRMED and events[-1].actor.startswith("operator:ops via ui:")


def test_bulk_retry_of_a_failed_selection(ui: Any, db_path: Any, sim: SimServer) -> None:
    for aid in ("rf-1", "rf-2"):
        sim.plan(aid, "reject")
        r = ui.post(
            "/api/v1/actions",
            json={"provider": "sim", "operation": "book", "action_id": aid, "params": {}},
            headers=auth("app"),
        )
        assert r.json()["status"] == "FAILED"
    login(ui)
    q = {"status": "FAILED", "do": "retry"}
    preview = ui.get("/ui/bulk", params=q)
    assert '<span data-testid="bulk-count">2</span>' in preview.text and "attempt 2" in preview.text
    digest = re.search(r'name="digest" value="([^"]+)"', preview.text).group(1)  # type: ignore[union-attr]
    done = post(
        ui,
        "/ui/bulk",
        {
            "csrf": csrf_of(preview.text),
            "digest": digest,
            "do": "retry",
            "status": "FAILED",
            "typed": "2",
        },
    )
    assert done.status_code == 200 and "attempt 2" in done.text
    for aid in ("rf-1", "rf-2"):
        rec, _ = record(db_path, aid)
        assert rec.status is Status.CONFIRMED and rec.attempt == 2
        assert sim.effects_for(aid) == 1


def test_an_unknown_bulk_verdict_is_a_clear_refusal(ui: Any) -> None:
    login(ui)
    r = ui.get("/ui/bulk", params={"do": "delete_everything"})
    assert r.status_code == 422 and "choose what to do" in r.text


def test_login_refuses_a_form_without_origin_and_a_name_that_could_pose(ui: Any) -> None:
    page = ui.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = ui.post(
        "/ui/login", data={"nonce": nonce, "token": TOKENS["ops"][0]}, follow_redirects=False
    )
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = login(ui, "ops", "alice via ui:token:boss:1")
    assert r.status_code == 422 and "set-cookie" not in r.headers
    r = ui.post(
        "/ui/login",
        data={"nonce": "forged.nonce", "token": TOKENS["ops"][0]},
        headers={"Origin": ORIGIN},
        follow_redirects=False,
    )
    assert r.status_code == 403 and "stale" in r.text


def test_a_session_ends_when_it_expires_or_its_token_changes() -> None:
    from starlette.datastructures import Headers

    from settled.config import from_dict
    from settled.serve.auth import Tokens
    from settled.serve.sessions import Sessions

    conf = {
        "serve": {
            "tokens": {"ops": {"secret": "${T}", "roles": ["operate"]}},
            "ui": {"session_secret": "${K}", "session_ttl": 600},
        }
    }
    cfg = from_dict(conf, source="test")
    env = {"T": "t" * 20, "K": "k" * 20}
    sessions = Sessions.from_config(cfg, Tokens.from_config(cfg, env), env)
    person = sessions.login("t" * 20, "alice", now=1000.0)
    assert person is not None and person.actor.startswith("operator:alice via ui:token:ops:")
    cookie = sessions.cookie(person)
    none = Headers()
    assert sessions.person(cookie, None, none, now=1500.0)[0] == person
    assert sessions.person(cookie, None, none, now=1601.0)[0] is None  # expired
    rotated = {**env, "T": "n" * 20}
    other = Sessions.from_config(cfg, Tokens.from_config(cfg, rotated), rotated)
    assert other.person(cookie, None, none, now=1500.0)[0] is None  # the token changed
    assert sessions.csrf(person) != sessions.csrf(sessions.login("t" * 20, "alice", now=1000.0))  # type: ignore[arg-type]


def test_a_contradicted_record_is_in_the_queue_flagged(ui: Any, db_path: Any) -> None:
    from settled.clock import to_text, utcnow
    from settled.storage import Move

    with Ledger.open(db_path) as led:
        add(led, "said-done", status=Status.CONFIRMED)
        rec = led.get("said-done")
        assert led.move(
            Move(
                "said-done",
                rec.status,
                rec.status,
                to_text(utcnow()),
                "t",
                None,
                values={"contradiction": "a late reply says <b>not applied</b>"},
            )
        )
    login(ui)
    page = ui.get("/ui/")
    assert '<span data-testid="total">1</span>' in page.text
    assert 'class="contradicted"' in page.text and "CONTRADICTED" in page.text
    assert "a late reply says &lt;b&gt;not applied&lt;/b&gt;" in page.text
    action = ui.get(aid_url("said-done"))
    assert "retry is blocked until a person resolves it" in action.text
    assert "Give your verdict" in action.text  # a person settles a contradiction


def test_stats_show_how_actions_settled_and_how_fast(ui: Any, db_path: Any, sim: SimServer) -> None:
    for i in range(3):
        r = ui.post(
            "/api/v1/actions",
            json={"provider": "sim", "operation": "send", "action_id": f"s-{i}", "params": {}},
            headers=auth("app"),
        )
        assert r.status_code == 201
    with Ledger.open(db_path) as led:
        from settled.session import Session

        with Session() as s:
            for _ in range(200):  # bounded: each pass checks what is due
                s.reconciler(actor="test").run_ids([f"s-{i}" for i in range(3)])
                if all(led.get(f"s-{i}").status is Status.CONFIRMED for i in range(3)):
                    break
    login(ui)
    page = ui.get("/ui/stats")
    assert page.status_code == 200
    row = re.search(r"sim/send</td>(.*?)</tr>", page.text, flags=re.S)
    assert row is not None
    cells = re.findall(r">([^<]*)</td>", row.group(1))
    assert cells[0] == "3" and cells[2] == "3"  # confirmed, all of them by a check
    assert cells[6] != "-" and cells[7] != "-"  # p50 and p95 measured


def test_without_a_key_the_console_says_what_to_set_and_logs_nobody_in(
    tmp_path: Path, sim: SimServer
) -> None:
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})  # no tokens, no secret
    with in_process(mcp=False) as (c, _lines):
        assert c.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"
        page = c.get("/ui/login")
        assert page.status_code == 200 and "session_secret" in page.text
        assert 'name="token"' not in page.text
        r = c.post("/ui/login", data={"token": "x" * 20}, headers={"Origin": ORIGIN})
        assert r.status_code == 503 and "set-cookie" not in r.headers


def test_malformed_requests_are_one_clear_refusal_each(ui: Any, db_path: Any) -> None:
    stuck(db_path, "m-1")
    login(ui)
    page = ui.get(aid_url("m-1"))
    token = csrf_of(page.text)
    before = dump(db_path)
    form = f"csrf={token}&do=resolve&verdict=applied&reason=x"
    cases = [
        (
            ui.post(
                aid_url("m-1"),
                content=form + "&do=retry",
                headers={"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"},
            ),
            400,
            "sent twice",
        ),
        (
            ui.post(
                aid_url("m-1"),
                content=form,
                headers={"Origin": ORIGIN, "Content-Type": "text/plain"},
            ),
            415,
            "form",
        ),
        (
            ui.post(
                aid_url("m-1"),
                content=b"csrf=\xff\xfe",
                headers={"Origin": ORIGIN, "Content-Type": "application/x-www-form-urlencoded"},
            ),
            400,
            "UTF-8",
        ),
        (ui.get("/ui/actions/%FF%FE"), 422, "UTF-8"),
        (ui.get(aid_url("no-such-action")), 404, "no-such-action"),
        (
            post(
                ui,
                aid_url("m-1"),
                {"csrf": token, "do": "resolve", "verdict": "maybe", "reason": "x"},
            ),
            422,
            "applied",
        ),
        (
            post(
                ui,
                aid_url("m-1"),
                {"csrf": token, "do": "resolve", "verdict": "applied", "reason": " "},
            ),
            422,
            "reason",
        ),
    ]
    for r, status, words in cases:
        assert r.status_code == status, (status, r.text)
        assert words in r.text and "Traceback" not in r.text
        assert r.headers["content-type"].startswith("text/html")
    assert dump(db_path) == before
