"""Property test: the redactor against hostile text. Whatever surrounds a secret
(markup, escape sequences, bidi controls, very long bodies) and in whatever encoding a
server echoes it (as is, repr- or JSON-escaped, URL-encoded, inside basic auth), no
form of it survives redaction, and cutting the redacted text for a reason leaves no
piece of it behind."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import budget, scaled

from settled.providers._wire import Redactor, excerpt

pytestmark = [pytest.mark.ledger_free, pytest.mark.slow]

# What a token in an env var looks like: visible characters, no control characters
# (those are refused at load), long enough to be a secret.
SECRETS = st.text(
    alphabet=st.characters(
        min_codepoint=0x21,
        max_codepoint=0x2FFF,
        blacklist_categories=("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"),
    ),
    min_size=8,
    max_size=48,
).filter(lambda s: len(set(s)) >= 4)

HOSTILE_PIECES = [
    "[/]",
    "[bold]",
    "[reverse]boom",
    "\x1b[2J",
    "\x1b[1A\x1b[2K",
    "\x1b]0;title\x07",
    "\u202e",
    "\u2066",
    "\x00",
    "\r\n",
    "\t",
    "\\",
    '"',
    "'",
    "%",
    "+",
    "&",
    "é",
    "🚀",
]
HOSTILE = st.lists(
    st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(max_size=40)), max_size=12
).map("".join)

ENCODINGS: dict[str, Callable[[str], str]] = {
    "plain": lambda s: s,
    "repr": lambda s: repr(s)[1:-1],
    "repr-bytes": lambda s: repr(s.encode())[2:-1],
    "json": lambda s: json.dumps(s)[1:-1],
    "json-utf8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "url": lambda s: quote(s, safe=""),
    "url-lower": lambda s: quote(s, safe="").lower() if s.isascii() else quote(s, safe=""),
    "form": lambda s: quote_plus(s, safe=""),
    "url-twice": lambda s: quote(quote(s, safe=""), safe=""),
    "json-in-json": lambda s: json.dumps(json.dumps(s)[1:-1])[1:-1],
    "json-slashes": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "html": html.escape,
    "xml-charrefs": lambda s: html.escape(s).encode("ascii", "xmlcharrefreplace").decode(),
    "mojibake": lambda s: s.encode("utf-8", "surrogatepass").decode("latin-1"),
}


def windows(secret: str, size: int = 8) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


@settings(
    max_examples=scaled(300),
    deadline=None,
    derandomize=budget() <= 1,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    secret=SECRETS,
    before=HOSTILE,
    after=HOSTILE,
    encoding=st.sampled_from(sorted(ENCODINGS)),
    filler=st.integers(0, 400),
)
def test_no_form_of_a_secret_survives_redaction(
    secret: str, before: str, after: str, encoding: str, filler: int
) -> None:
    text = before + "x" * filler + ENCODINGS[encoding](secret) + after
    out = Redactor([secret]).clean(text)
    assert secret not in out
    for enc in ENCODINGS.values():
        form = enc(secret)
        if form not in before + after:
            assert form not in out, (encoding, form)
    assert out.isprintable()  # one line, no cursor movement, no bidi override


@settings(
    max_examples=scaled(200),
    deadline=None,
    derandomize=budget() <= 1,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    secret=SECRETS,
    before=HOSTILE,
    after=HOSTILE,
    limit=st.integers(1, 300),
    encoding=st.sampled_from(sorted(ENCODINGS)),
)
def test_a_cut_reply_keeps_no_piece_of_a_secret(
    secret: str, before: str, after: str, limit: int, encoding: str
) -> None:
    """A 401 body that echoes the token, cut for a reason: redacted first, then cut."""
    body = (before + ENCODINGS[encoding](secret) + after).encode("utf-8", "surrogatepass")
    shown = excerpt(body, limit=limit, redact=Redactor([secret]))
    for piece in windows(secret):
        if piece not in before + after and piece not in "***":
            assert piece not in shown


@settings(max_examples=scaled(100), deadline=None, derandomize=budget() <= 1)
@given(
    user=st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=12),
    password=SECRETS,
    before=HOSTILE,
)
def test_the_basic_auth_token_is_redacted_with_the_password(
    user: str, password: str, before: str
) -> None:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    out = Redactor([password, token]).clean(f"{before}Authorization: Basic {token}")
    assert token not in out and password not in out
