"""What a person is shown of a record, on every surface (the CLI, the console):
stored and external text with its invisible characters written out (``term``),
stored times as ISO-8601 or as ages, params with their secrets redacted, and an
event's evidence in words. Plain strings only: each surface escapes or styles them
its own way (rich on a terminal, Jinja in the console)."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from datetime import datetime
from typing import Any

from .clock import from_text

MAX_SHOWN = 2000  # characters of one value a human view shows; --json has it all

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def term(value: object, limit: int | None = MAX_SHOWN) -> str:
    """``value`` as safe terminal text: every non-printable character escaped, then
    cut at ``limit`` characters with a note saying how much was left out."""
    s = "" if value is None else str(value)
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() or _is_space(ch) else _escape(ch) for ch in s)
    if limit is not None and len(s) > limit:
        cut = s.rfind(" ", 0, limit)
        cut = cut if cut > limit // 2 else limit
        s = f"{s[:cut]}… ({len(s) - cut} more characters; see --json)"
    return s


def hidden(value: object) -> bool:
    """Whether ``term`` would write out any character of ``value`` (a control, bidi or
    other invisible format character): what a person is shown then needs saying."""
    s = "" if value is None else str(value)
    return not s.isprintable() and any(not (ch.isprintable() or _is_space(ch)) for ch in s)


HIDDEN_NOTE = "(contains hidden control characters, shown escaped)"


def _is_space(ch: str) -> bool:
    return unicodedata.category(ch) == "Zs"


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def iso(stored: str | None, *, never: str = "-") -> str:
    """A stored time for people: ISO-8601 to the second, with its zone (UTC, 'Z')."""
    if not stored:
        return never
    if len(stored) >= 19 and stored[10] == "T":
        return stored[:19] + "Z"
    return stored


def ago(stored: str | None, now: datetime) -> str:
    """A stored time as an age from ``now``: '42s', '3m', '5h', '2d'; 'in 3m' ahead."""
    if not stored:
        return "-"
    secs = int((now - from_text(stored)).total_seconds())  # type: ignore[operator]
    return span(secs) if secs >= 0 else f"in {span(-secs)}"


def span(secs: float) -> str:
    s = int(secs)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def one_line(text: str) -> str:
    return " ".join(text.split())


SECRET_KEY = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
    "cookie",
)


def redact_params(params: Any, secrets: list[str] | None = None) -> Any:
    """Params for a human view: values under secret-looking keys, and any value of a
    ``${VAR}`` the config references (in any spelling, as the providers' redactor
    finds it), shown as ``***``."""
    from .providers._redact import Redactor  # the providers load only for a redacted view

    scrub = Redactor([s for s in (secrets or []) if len(s) >= 4])

    def walk(v: Any, key: str = "") -> Any:
        if key and any(k in key.lower().replace("-", "_") for k in SECRET_KEY):
            return "***"
        if isinstance(v, dict):
            return {k: walk(x, str(k)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str) and scrub:
            return scrub(v)
        return v

    return walk(params)


def config_secrets(cfg: Any) -> list[str]:
    """The values of the ``${VAR}``s the config ``cfg`` refers to (to keep them out of
    human views); never loads a provider."""
    providers = cfg.providers
    names: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str):
            names.update(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", v))

    walk(providers)
    return [os.environ[n] for n in sorted(names) if os.environ.get(n)]


def event_detail(e: Any) -> str:
    """One event's evidence in words: the reason, then what backs it."""
    d = e.detail
    parts = [str(d["reason"])] if d.get("reason") else []
    for key, label in (
        ("evidence", "evidence"),
        ("object_id", "object"),
        ("seen", "seen"),
        ("check", "check"),
        ("recheck", "checked first"),
        ("recheck_for", "checked for"),
        ("lease_expires_at", "lease"),
        ("event_id", "event"),
        ("body_sha256", "body sha256"),
    ):
        if d.get(key) not in (None, "") and (key != "lease_expires_at" or e.kind != "claimed"):
            value = iso(d[key]) if key == "lease_expires_at" else d[key]
            parts.append(f"{label}: {value}")
    if e.kind == "claimed":
        parts.append(
            f"key {d.get('idempotency_key')}, lease until {iso(d.get('lease_expires_at'))}"
        )
    if e.kind == "retry":
        parts.append(
            f"attempt {d.get('attempt')}; previous key {d.get('previous_idempotency_key')}"
        )
    if e.kind == "recorded":
        parts.append(
            f"tier {d.get('tier')}, eligible at {iso(d.get('eligible_at'), never='never')}"
        )
    if e.kind == "resolved" and d.get("by"):
        parts.append(f"by {d['by']}")
    if not parts:
        parts.append(json.dumps(d, ensure_ascii=False, default=str)[:300])
    return one_line("; ".join(str(p) for p in parts))
