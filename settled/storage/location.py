"""Where a ledger is: a file path (SQLite) or a ``postgresql://`` URL (``POSTGRES``),
and the forms a location takes besides the ledger opened there (the package's
``open_location``): the location shown in messages and logs with any password masked
(``redact``, ``scrub``), and the address another ledger stores when one is moved to it
(``address``: an absolute path, or the URL without any password).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

POSTGRES = ("postgresql://", "postgres://")


def redact(url: str) -> tuple[str, tuple[str, ...]]:
    """``url`` with any password masked as ``***``, and the secrets to scrub from
    messages (each password as written and percent-decoded)."""
    parts = urlsplit(url)
    secrets: list[str] = []
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        secrets += [password, unquote(password)]
        netloc = f"{user}:***@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            for k, v in pairs:
                if k == "password":
                    secrets += [v, quote(v)]
            query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    if not secrets:
        return url, ()
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    shown += f"?{query}" if query else ""
    shown += f"#{parts.fragment}" if parts.fragment else ""
    return shown, tuple(sorted({s for s in secrets if s}, key=len, reverse=True))


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every one of ``secrets`` masked (``redact``'s)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def address(location: str) -> str:
    """Where the ledger at ``location`` is, fit to be stored in another ledger and
    given to ``--db``: an absolute path, or a URL without any password (user info's
    or a parameter)."""
    if not location.startswith(POSTGRES):
        return os.path.abspath(location)
    parts = urlsplit(location)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        netloc = f"{userinfo.partition(':')[0]}@{hosts}" if userinfo.partition(":")[0] else hosts
    query = urlencode(
        [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"]
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


__all__ = ["POSTGRES", "address", "redact", "scrub"]
