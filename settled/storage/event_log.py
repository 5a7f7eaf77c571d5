"""The audit's read: which events ``settled log``, ``GET /api/v1/events`` and the
console's audit page list, newest first, as one ``LogFilter`` turned into SQL for both
backends (the ``Dialect`` of ``query``).

Who did it is read from the event's actor, as every surface writes it:

- ``operator:NAME`` — a person at the command line (``--by``, ``SETTLED_OPERATOR``, the
  OS user);
- ``operator:NAME via api:TOKEN`` / ``operator:api:TOKEN`` — through the API's token;
- ``operator:NAME via ui:HOW:SID`` — through the console, in the login session ``SID``;
- ``recheck`` — the check made before a person's verdict or retry; its detail's
  ``recheck_for`` names who asked (``operator:NAME (resolve --not-applied)``), and that
  is the person the audit names for it.

By default only these people's events are listed (verdicts, refused verdicts kept as
notes, confirmations, retries, checks they asked for); ``everyone`` adds the machines'
(dispatcher, reconciler, callbacks). Every value is a bound parameter; prefix and
suffix tests are ``substr`` comparisons, never a ``LIKE`` pattern, so ``%`` and ``_``
in a name mean themselves. The events indexes (``events_at``, ``events_actor``,
``events_kind``) serve the time window, the person and the kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..clock import plus, to_text
from ..errors import InvalidInput
from .query import Dialect

MAX_LOG = 10_000  # events one read may return; a cursor pages on
# The kinds each command writes, for ``--command`` (``?command=``).
COMMAND_KINDS = {
    "resolve": ("resolved", "note"),
    "retry": ("retry",),
    "confirm": ("claimed",),
    "reconcile": ("reconciled", "unresolved"),
}
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_BACK = 3650 * 86400  # s: ten years back is as far as a window reaches
PEOPLE = "(e.actor = 'recheck' OR substr(e.actor, 1, 9) = 'operator:')"


@dataclass(frozen=True)
class LogFilter:
    """Which events the audit lists. ``before``: the cursor, an event id; only older
    events (smaller ids) are listed. Times are stored-time text (``clock.to_text``)."""

    person: str | None = None
    token: str | None = None
    session: str | None = None
    kinds: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    action_id: str | None = None
    everyone: bool = False
    before: int | None = None
    limit: int = 100


def who(d: Dialect) -> str:
    """The actor the audit names: the asker of a recheck, else the event's actor."""
    return f"(CASE WHEN e.actor = 'recheck' THEN {d.json_field('e.detail', 'recheck_for')} ELSE e.actor END)"


def _starts(expr: str, prefix: str, m: str) -> tuple[str, list[Any]]:
    return f"substr({expr}, 1, {m}) = {m}", [len(prefix), prefix]


def _prefix_range(prefix: str) -> tuple[str, str]:
    """The texts that start with ``prefix``, as a range in code point order."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _ends(expr: str, suffix: str, m: str) -> tuple[str, list[Any]]:
    return f"substr({expr}, length({expr}) - {m} + 1) = {m}", [len(suffix), suffix]


def where(f: LogFilter, d: Dialect) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (with its leading space, or "") of ``f`` over ``events e``."""
    m = d.mark
    parts: list[str] = []
    args: list[Any] = []

    def add(clause: str, values: list[Any]) -> None:
        parts.append(clause)
        args.extend(values)

    if not f.everyone:
        parts.append(PEOPLE)
    w = who(d)
    if f.person is not None:
        # Each term is one the events_actor index answers (an equality, a range of one
        # prefix, or the few `recheck` rows), so one person's events are found without
        # reading every event.
        name = f"operator:{f.person}"
        actor = f"e.actor{d.collate}"
        asker = d.json_field("e.detail", "recheck_for")
        via_from, via_to = _prefix_range(f"{name} via ")
        via, via_args = _starts(asker, f"{name} via ", m)
        asked, asked_args = _starts(asker, f"{name} (", m)
        add(
            f"({actor} = {m} OR ({actor} >= {m} AND {actor} < {m})"
            f" OR (e.actor = 'recheck' AND ({asker} = {m} OR {via} OR {asked})))",
            [name, via_from, via_to, name, *via_args, *asked_args],
        )
    if f.token is not None:
        ends, ends_args = _ends(w, f" via api:{f.token}", m)
        inside = d.find.format(haystack=w, needle=m)
        add(
            f"({w} = {m} OR {w} = {m} OR {ends} OR {inside})",
            [f"operator:api:{f.token}", f"api:{f.token}", *ends_args, f" via api:{f.token} ("],
        )
    if f.session is not None:
        ends, ends_args = _ends(w, f":{f.session}", m)
        inside = d.find.format(haystack=w, needle=m)
        add(f"({ends} OR {inside})", [*ends_args, f":{f.session} ("])
        add(d.find.format(haystack=w, needle=m), [" via ui:"])
    if f.kinds:
        clause, values = d.one_of("e.kind", list(f.kinds))
        add(clause, values)
    t = d.time_mark.replace("?", m)
    if f.since is not None:
        add(f"e.at >= {t}", [f.since])
    if f.until is not None:
        add(f"e.at < {t}", [f.until])
    if f.action_id is not None:
        add(f"e.action_id = {m}", [f.action_id])
    if f.before is not None:
        add(f"e.id < {m}", [f.before])
    return (" WHERE " + " AND ".join(parts)) if parts else "", args


def duration(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' → seconds."""
    t, mult = text, 1
    if t and t[-1] in UNITS:
        t, mult = t[:-1], UNITS[t[-1]]
    try:
        value = float(t) * mult
    except ValueError:
        raise InvalidInput(f"bad duration {text!r}: use e.g. 90s, 10m, 2h or 1d") from None
    if not 0 <= value <= MAX_BACK or math.isnan(value):
        raise InvalidInput(f"bad duration {text!r}: from 0 to {MAX_BACK // 86400}d")
    return value


def parse_when(text: str, now: Any, what: str) -> str:
    """A duration back from ``now`` (``1h``) or an ISO time, as stored-time text."""
    t = text.strip()
    if t and (t[0].isdigit() and not any(c in t for c in "-:T")):
        return str(to_text(plus(now, -duration(t))))
    try:
        at = datetime.fromisoformat(t)
    except ValueError:
        raise InvalidInput(
            f"{what} {text!r}: give a duration (90s, 10m, 2h, 1d) or an ISO time "
            "(2026-12-03T08:00:00Z)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return str(to_text(at.astimezone(UTC)))


def row_of(e: Any) -> dict[str, Any]:
    """An event as the audit shows it: the event's fields, with the person and the
    surface read from its actor (``person``, ``via``) and a one-line ``said``."""
    person, via = person_of(e.actor, e.detail)
    data: dict[str, Any] = e.to_json()
    data.update(person=person, via=via, said=said(e))
    return data


def said(e: Any) -> str:
    """What an event says, in one line."""
    d = e.detail
    if e.kind == "note" and d.get("refused"):
        return f"refused {d.get('verdict')}: {d.get('reason')} ({d['refused']})"
    if e.kind == "resolved":
        extra = f" [{d['evidence']}]" if d.get("evidence") else ""
        return f"{d.get('verdict')}: {d.get('reason')}{extra}"
    if e.kind == "retry":
        return f"attempt {e.attempt}" + (f"; check: {d['recheck']}" if d.get("recheck") else "")
    if d.get("recheck_for"):
        return f"check for {d['recheck_for']}: {e.to_status}"
    for key in ("reason", "message", "why", "verdict"):
        if d.get(key):
            return str(d[key])
    return ""


def person_of(actor: str, detail: dict[str, Any]) -> tuple[str | None, str | None]:
    """The person an event names and the surface that vouched for them (``api:TOKEN``,
    ``ui:HOW:SID``), each None when the actor does not say; a machine's actor is its
    own surface (``dispatcher``, ``reconciler``, ``callback:mail``)."""
    text = actor
    if actor == "recheck":
        text = str(detail.get("recheck_for") or "")
        text = text.rsplit(" (", 1)[0] if text.endswith(")") else text
    if not text.startswith("operator:"):
        return None, text or None
    rest = text.removeprefix("operator:")
    name, sep, via = rest.partition(" via ")
    if sep:
        return name, via
    if rest.startswith(("api:", "ui:")):
        return None, rest
    return rest, None


__all__ = [
    "COMMAND_KINDS",
    "MAX_LOG",
    "LogFilter",
    "duration",
    "parse_when",
    "person_of",
    "row_of",
    "said",
    "where",
    "who",
]
