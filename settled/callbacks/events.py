"""A verified body, read as events: JSON (an object, or an array of them, or the
array at ``list``) or a form. Every value settled keeps is checked and bounded here:
a key or an event id is a short printable string (or a whole number), a status is
kept as text of at most ``MAX_STATUS`` characters; anything else in the body is
never kept. What cannot be read is ``malformed``; what names no action is ``ignored``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl

from ..clock import plus, to_text
from ..model import Callback, Reported
from ..providers._shape import Pointer
from .config import CallbackConfig, Field

MAX_KEY = 300  # characters of a key or an event id
MAX_STATUS = 200  # characters of a status kept as text
MAX_ITEMS = 10_000  # events in one batch
MAX_DEPTH = 64  # nesting a body may have (json.loads would recurse up to the C stack)


class Malformed(Exception):
    """The body as a whole cannot be read (400)."""


@dataclass(frozen=True)
class Item:
    """One event of the body: read into a ``Callback``, or why not (``reason``)."""

    callback: Callback | None
    reason: str = ""  # "", "malformed" or "ignored"


def read(
    cfg: CallbackConfig,
    body: bytes,
    content_type: str,
    query: str,
    own_id: str | None,
    now: datetime,
) -> list[Item]:
    """The body's events, each read or refused on its own (one bad item never drops
    the others). Raises ``Malformed`` when the body itself cannot be read."""
    doc, batch = _parse(cfg, body, content_type)
    digest = hashlib.sha256(body).hexdigest()
    params = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    at = to_text(now)
    expires = to_text(plus(now, cfg.pending_expiry))
    items = doc if batch else [doc]
    out = []
    for index, item in enumerate(items):
        n = index if batch else None
        eid = own_id if own_id is None or not batch else f"{own_id}#{index}"
        out.append(_item(cfg, item, n, params, eid, digest, at, expires))
    return out


def _parse(cfg: CallbackConfig, body: bytes, content_type: str) -> tuple[Any, bool]:
    kind = content_type.split(";", 1)[0].strip().lower()
    form = kind == "application/x-www-form-urlencoded" or (not kind and cfg.scheme == "twilio")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8") from None
    if form:
        pairs = parse_qsl(text, keep_blank_values=True)
        fields: dict[str, str] = {}
        for k, v in pairs:
            fields.setdefault(k, v)  # a repeated field: its first value
        if cfg.scheme == "github" and "payload" in fields:  # GitHub's form delivery
            return _parse_json(fields["payload"], cfg)
        return fields, False
    if kind and kind != "application/json" and not kind.endswith("+json"):
        raise Malformed(f"content type {kind!r}: send JSON or a form")
    return _parse_json(text, cfg)


def _parse_json(text: str, cfg: CallbackConfig) -> tuple[Any, bool]:
    if _too_deep(text):
        raise Malformed("nested too deeply")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or an integer too long to read
        raise Malformed("not JSON") from None
    if cfg.items is not None:
        found, doc = cfg.items.find(doc)
        if not found or not isinstance(doc, list):
            raise Malformed(f"no array at {cfg.items.text}")
    if isinstance(doc, list):
        if not doc or len(doc) > MAX_ITEMS:
            raise Malformed("an empty batch, or one too long")
        return doc, True
    if not isinstance(doc, dict):
        raise Malformed("neither an object nor an array of them")
    return doc, False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_deep(text: str) -> bool:
    """Whether brackets nest deeper than ``MAX_DEPTH`` (strings skipped), found without
    building anything."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _item(  # noqa: PLR0913  (one argument per part of the event's identity)
    cfg: CallbackConfig,
    item: Any,
    index: int | None,
    params: Mapping[str, str],
    own_id: str | None,
    digest: str,
    at: str,
    expires: str,
) -> Item:
    if not isinstance(item, dict):
        return Item(None, "malformed")
    found, raw_key = _get(cfg.key, item, params)
    if not found or raw_key is None or raw_key == "":
        return Item(None, "ignored")  # it names no action: another event type
    key = _identifier(raw_key)
    if key is None:
        return Item(None, "malformed")
    found, raw_status = _get(cfg.status, item, params)
    if not found:
        return Item(None, "ignored")
    status, reported = _status(cfg, raw_status)
    if cfg.scheme == "stripe":
        found, raw_id = _get(_STRIPE_ID, item, params)
        event_id = _identifier(raw_id) if found else None
    elif own_id is not None:
        event_id = own_id
    elif cfg.event_id is not None:
        found, raw_id = _get(cfg.event_id, item, params)
        event_id = _identifier(raw_id) if found else None
    else:  # twilio, and a sender with no event id: the object and its status together
        event_id = f"{key}:{status}"
    if event_id is None or len(event_id) > 2 * MAX_KEY:
        return Item(None, "malformed")
    cb = Callback(
        provider=cfg.provider,
        event_id=event_id,
        scheme=cfg.scheme,
        names=cfg.names,
        key=key,
        status=status,
        reported=reported,
        digest=digest,
        received_at=at,
        expires_at=expires,
        item=index,
    )
    return Item(cb)


def _get(where: Field, item: Mapping[str, Any], params: Mapping[str, str]) -> tuple[bool, Any]:
    if where.query is not None:
        return (where.query in params), params.get(where.query)
    assert where.pointer is not None
    return where.pointer.find(item)


def _identifier(value: Any) -> str | None:
    """A key or an event id: a printable string of at most ``MAX_KEY`` characters, or
    a whole number; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        return None
    if not text or len(text) > MAX_KEY or not text.isprintable() or _surrogates(text):
        return None
    return text


def _surrogates(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _status(cfg: CallbackConfig, value: Any) -> tuple[str, Reported]:
    """The status as kept (text, bounded, never markup: escaped when shown) and what
    the config's lists say it means."""
    reported = Reported.OTHER
    for lst, meaning in (
        (cfg.applied, Reported.APPLIED),
        (cfg.not_applied, Reported.NOT_APPLIED),
        (cfg.delivered, Reported.DELIVERED),
    ):
        if _member(value, lst):
            reported = meaning
            break
    if isinstance(value, str):
        text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    elif isinstance(value, (bool, int, float)) or value is None:
        text = (
            json.dumps(value)
            if not isinstance(value, int) or abs(value) < 10**30
            else "(a huge number)"
        )
    else:
        text = "(an object)" if isinstance(value, dict) else "(an array)"
    if len(text) > MAX_STATUS:
        text = text[: MAX_STATUS - 1] + "…"
    return text, reported


def _member(value: Any, options: tuple[Any, ...]) -> bool:
    """Equality that keeps true apart from 1 (JSON true is not the number 1)."""
    if isinstance(value, bool):
        return any(type(o) is bool and o is value for o in options)
    if isinstance(value, (int, float)):
        return any(
            isinstance(o, (int, float)) and not isinstance(o, bool) and o == value for o in options
        )
    return any(type(o) is type(value) and o == value for o in options)


_STRIPE_ID = Field("/id", pointer=Pointer("/id", ("id",)))  # a Stripe event's own id

__all__ = ["MAX_KEY", "Item", "Malformed", "read"]
