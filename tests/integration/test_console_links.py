"""Links that travel and pages that fail politely, in process: a link to an action (or a
filtered queue) survives the login, only a page of this console is a login's target (no
open redirect), an unknown action or page answers the console's HTML without any path
on the server, and a refused verdict keeps the person's claim."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from ledger_rows import add
from serving import TOKENS
from test_console import ORIGIN, login, ui  # noqa: F401  (the console's fixture and login)

from settled import Ledger
from settled.serve.console.page_kit import safe_next
from settled.serve.console.rendering import aid_url


def log_in_from(c: Any, login_url: str) -> Any:
    page = c.get(login_url)
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text)
    nxt = re.search(r'name="next" value="([^"]+)"', page.text)
    data = {"nonce": nonce.group(1) if nonce else "", "token": TOKENS["ops"][0], "name": ""}
    if nxt:
        import html

        data["next"] = html.unescape(nxt.group(1))
    return c.post("/ui/login", data=data, headers={"Origin": ORIGIN}, follow_redirects=False)


def test_a_link_to_an_action_survives_the_login(ui: Any, db_path: Any) -> None:  # noqa: F811
    with Ledger.open(db_path) as led:
        add(led, "order #10927.v2")
    link = aid_url("order #10927.v2")
    first = ui.get(link, follow_redirects=False)
    assert first.status_code == 303
    to = urlsplit(first.headers["location"])
    assert to.path == "/ui/login" and parse_qs(to.query)["next"] == [link]
    done = log_in_from(ui, first.headers["location"])
    assert done.status_code == 303 and done.headers["location"] == link
    assert "order #10927.v2" in ui.get(link).text
    # a filtered queue, with its page, too
    ui.cookies.clear()
    queue = "/ui/?status=all&provider=sim&sort=age"
    first = ui.get(queue, follow_redirects=False)
    done = log_in_from(ui, first.headers["location"])
    assert done.headers["location"] == queue


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/ui/",
        "//evil.example/ui/",
        "/\\evil.example",
        "/ui/\\..\\x",
        "/ui/../api/v1/actions",
        "/api/v1/actions",
        "/ui/login",
        "/ui/%0d%0aSet-Cookie:x",
        "javascript:alert(1)",
        "",
    ],
)
def test_only_a_page_of_this_console_is_a_login_target(
    ui: Any,  # noqa: F811
    target: str,
) -> None:
    page = ui.get("/ui/login", params={"next": target})
    done = log_in_from(ui, f"/ui/login?{'next=' + target if target else ''}")
    assert page.status_code == 200
    assert done.status_code == 303
    where = done.headers["location"]
    assert where == "/ui/" or (safe_next(target) == target and where == target), where
    assert urlsplit(where).netloc == "" and where.startswith("/ui/")


def test_a_target_with_a_control_character_or_too_long_is_no_target() -> None:
    assert safe_next("/ui/\r\nLocation: //evil") is None
    assert safe_next("/ui/?q=" + "x" * 5000) is None
    assert safe_next("/ui/actions/a%2Fb?did=resolved") == "/ui/actions/a%2Fb?did=resolved"


def test_unknown_pages_and_actions_are_console_pages_without_a_server_path(
    ui: Any,  # noqa: F811
    db_path: Any,
) -> None:
    login(ui)
    location = os.environ["SETTLED_DB"]
    for url in ("/ui/nothing-here", "/ui/actions/", aid_url("no-such-order"), "/ui/a/b/c"):
        r = ui.get(url)
        assert r.status_code == 404, url
        assert r.headers["content-type"].startswith("text/html"), url
        assert "<h1>404" in r.text and location not in r.text and str(db_path) not in r.text
        assert "settled.db" not in r.text
    assert "no-such-order" in ui.get(aid_url("no-such-order")).text
    ui.cookies.clear()  # without a session too: the page, not the API's JSON
    r = ui.get("/ui/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    api = ui.get("/api/v1/nothing")
    assert api.status_code == 404 and "json" in api.headers["content-type"]
