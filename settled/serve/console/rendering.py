"""The console's HTML: one Jinja2 environment, its filters, and the headers every page has.

Rule 13 in HTML: the environment escapes every value (``autoescape`` on for every
template, so ``<``, ``>``, ``&``, ``"`` and ``'`` become entities), and the ``t``
filter first writes out control, escape, bidi and other invisible characters as the
CLI's ``term`` does (``\\u202e``), so a stored id or a provider's body is shown as
written and can neither reorder nor hide what surrounds it. No template builds a link
from stored text: the only links are the console's own routes, with an action id as one
percent-encoded path segment (``aid_url``); a ``javascript:`` id is a path segment too.

Every response under ``/ui/`` carries ``HEADERS``: a Content-Security-Policy that
allows this origin's files only (no inline script or style, no frames, forms post
here only), no caching, and no referrer to another site (URLs hold action ids).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ... import cause
from ...display import ago, span, term

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make a browser send Origin: null
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def aid_url(action_id: str) -> str:
    """The console's page of an action: the id as one percent-encoded segment ('.'
    too, so that no client or proxy treats '.' or '..' as a dot segment)."""
    return f"{PREFIX}/actions/" + quote(action_id, safe="").replace(".", "%2E")


def quoted(action_id: str) -> str:
    """An id as a form value that holds only ASCII (percent-encoded, every character
    but letters, digits and ``_.-~``), so no stored character reaches the page raw;
    ``urllib.parse.unquote`` gives it back exactly."""
    return quote(action_id, safe="")


def shown(value: object, limit: int | None = None) -> str:
    """Stored or external text as a person may see it: invisible characters written
    out (the CLI's ``term``); markup is escaped afterwards by the environment."""

    return term(value, limit=limit)


def block(value: object) -> str:
    """As ``shown``, for a block of lines (params as indented JSON): its newlines kept."""
    return "\n".join(shown(line) for line in str(value).split("\n"))


def when(stored: str | None, now: datetime, never: str = "-") -> str:
    """A stored time with its zone and its age: ``2026-12-01 14:02:11 UTC (3m ago)``."""

    if not stored:
        return never
    at = stored.replace("T", " ").split(".")[0].removesuffix("Z").removesuffix("+00:00")
    rel = ago(stored, now)
    return f"{at} UTC ({rel})" if rel.startswith("in ") else f"{at} UTC ({rel} ago)"


def age(stored: str | None, now: datetime) -> str:

    return ago(stored, now) if stored else "-"


def seconds(value: float | None) -> str:

    return "-" if value is None else span(value)


def pretty(data: Any) -> str:
    """JSON for reading (params), every character as it is (``t`` escapes what hides)."""
    try:
        return json.dumps(data, ensure_ascii=False, indent=2, default=str)
    except (RecursionError, ValueError):
        return "(nested too deeply to show here; GET /api/v1/actions/ID has it)"


@cache
def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        t=shown, lines=block, aid_url=aid_url, pretty=pretty, span=seconds, quoted=quoted
    )
    env.globals.update(
        when=when, age=age, prefix=PREFIX, cause_of=cause.shown, cause_words=cause.sentence
    )
    return env


def render(name: str, context: dict[str, Any]) -> str:
    out: str = environment().get_template(name).render(**context)
    return out


__all__ = [
    "CSP",
    "HEADERS",
    "PREFIX",
    "STATIC",
    "aid_url",
    "environment",
    "quoted",
    "render",
    "shown",
]
