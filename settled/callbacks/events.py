"""A verified body, read as events: JSON (an object, or an array of them, or the
array at ``list``) or a form. Every value settled keeps is checked and bounded here:
a key or an event id is a short printable string (or a whole number), a status is
kept as text of at most ``MAX_STATUS`` characters; anything else in the body is
never kept. What cannot be read is ``malformed``; what names no action is ``ignored``.

What an event means is what the config's predicates say of the whole event (a form's
fields are read as a JSON object of strings): ``applied``, else ``not_applied``, else
``delivered``, else nothing. An event that both ``applied`` and ``not_applied`` hold
is taken as neither: predicates that contradict each other prove nothing (rule 20).
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
from ..providers._predicate import Reading
from .schemes.scheme import too_deep
from .settings import CallbackConfig, Field

MAX_KEY = 300  # characters of a key or an event id
MAX_STATUS = 200  # characters of a status kept as text
MAX_ITEMS = 10_000  # events in one batch


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
    form = kind == "application/x-www-form-urlencoded" or (not kind and cfg.signing.form)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8") from None
    if form:
        pairs = parse_qsl(text, keep_blank_values=True)
        fields: dict[str, str] = {}
        for k, v in pairs:
            fields.setdefault(k, v)  # a repeated field: its first value
        payload = cfg.signing.form_payload  # a form whose field is the JSON (GitHub, Slack)
        if payload is not None and payload in fields:
            return _parse_json(fields[payload], cfg)
        return fields, False
    if kind and kind != "application/json" and not kind.endswith("+json"):
        raise Malformed(f"content type {kind!r}: send JSON or a form")
    return _parse_json(text, cfg)


def _parse_json(text: str, cfg: CallbackConfig) -> tuple[Any, bool]:
    if too_deep(text):
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
    status, reported = _status(raw_status), _meaning(cfg, item)
    event_id: str | None
    if own_id is not None:  # the scheme's own: a header, or the signature's token
        event_id = own_id
    elif cfg.event_id is not None:  # a field: the config's, or the scheme's (Stripe's /id)
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


def _meaning(cfg: CallbackConfig, item: Mapping[str, Any]) -> Reported:
    """What the config's predicates say ``item`` reports (see the module's docstring)."""
    seen = Reading(None, item)
    applied = cfg.applied is not None and cfg.applied.holds(seen)
    not_applied = cfg.not_applied is not None and cfg.not_applied.holds(seen)
    if applied and not_applied:
        return Reported.OTHER
    if applied:
        return Reported.APPLIED
    if not_applied:
        return Reported.NOT_APPLIED
    if cfg.delivered is not None and cfg.delivered.holds(seen):
        return Reported.DELIVERED
    return Reported.OTHER


def _status(value: Any) -> str:
    """The status as kept: text, bounded, never markup (escaped when shown)."""
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
    return text


__all__ = ["MAX_KEY", "Item", "Malformed", "read"]
