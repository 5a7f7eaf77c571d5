"""Which records a listing reads, and the figures ``settled stats`` shows: a
``Selection`` turned into SQL once, for both backends. A backend supplies only its
``Dialect``: how a parameter is marked, how a list is bound, how text is searched
case-insensitively, how an age is measured and how a reason is grouped. The other
named reads are in ``statements``, rendered in the same ``Dialect``.

Every value from a user is a bound parameter. ``--match`` text is searched for as a
substring with ``instr``/``strpos`` (a position, never a ``LIKE`` pattern), so ``%``
and ``_`` in it mean themselves. Sort keys and grouping keys come from the fixed
tables below, never from input.

Ordering is the same on both backends: text by code point (PostgreSQL's ``COLLATE
"C"``, SQLite's binary order), times in time order, a missing time after every
present one (before them with ``reverse``), ties by creation time, then id.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..model import Status

# The record fields a listing may be sorted by (``queue --sort``). ``age`` is the time
# since creation: youngest first.
SORT_FIELDS = (
    "created_at",
    "updated_at",
    "dispatched_at",
    "next_check_at",
    "confirmed_at",
    "action_id",
    "provider",
    "operation",
    "status",
    "delivery",
    "tier",
    "attempt",
    "checks",
    "age",
)
_TIMES = {"created_at", "updated_at", "dispatched_at", "next_check_at", "confirmed_at"}
_TEXTS = {"action_id", "provider", "operation", "delivery", "tier"}
# Statuses sort in the order a record lives through them (`model.Status`'s order).
STATUS_ORDER = (
    Status.PENDING,
    Status.IN_FLIGHT,
    Status.AWAITING_VERIFICATION,
    Status.CONFIRMED,
    Status.FAILED,
    Status.DENIED_UNRESOLVED,
)
_STATUS_RANK = (
    "CASE status "
    + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(STATUS_ORDER))
    + " ELSE 99 END"
)
OPEN = (Status.PENDING, Status.IN_FLIGHT, Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)

# What a stats table may be grouped by (``settled stats --by``).
GROUPS = ("provider", "operation", "status", "reason")

# How a reason is grouped: times, then every word that holds a digit (counts, ids,
# object ids, ports) are written as placeholders, so "verification budget spent after
# 3 check(s); last: not_yet" and "... after 5 check(s) ..." are one group. An HTTP
# status stays: "HTTP 503" and "HTTP 429" are different troubles. The patterns use only
# what Python's ``re`` and PostgreSQL's regular expressions read alike (bracket classes,
# greedy quantifiers, fixed lookbehinds), and the suite checks both give the same text.
REASON_PATTERNS = (
    (
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?"
        r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)?",
        "<time>",
    ),
    (r"(?<![A-Za-z0-9_-])(?<!HTTP )[A-Za-z0-9_-]*[0-9][A-Za-z0-9_-]*", "#"),
)
_COMPILED = tuple((re.compile(p), r) for p, r in REASON_PATTERNS)

# "Checks failing now": open records whose last check could not observe anything (the
# provider unreachable, or not even buildable: rule 15's ``check_error``), among those
# selected.
CHECKS_FAILING_NOW = (
    "sum(CASE WHEN check_error IS NOT NULL AND status NOT IN ('CONFIRMED', 'FAILED')"
    " THEN 1 ELSE 0 END)"
)


def reason_group(reason: str | None) -> str | None:
    """``reason`` with times and numbers written as placeholders (see
    ``REASON_PATTERNS``); what SQLite's ``settled_reason_group`` returns."""
    if reason is None:
        return None
    return _grouped(reason)


@lru_cache(maxsize=4096)  # pure, and a ledger's records share few reasons
def _grouped(reason: str) -> str:
    for pattern, replacement in _COMPILED:
        reason = pattern.sub(replacement, reason)
    return reason


def fold(text: str | None) -> str | None:
    """Text folded for a case-insensitive search: SQLite's ``settled_lower``."""
    return None if text is None else text.lower()


@dataclass(frozen=True)
class Dialect:
    """The few fragments in which the backends' SQL differs."""

    mark: str  # a parameter: "?" or "%s"
    one_of: Callable[[str, Sequence[Any]], tuple[str, list[Any]]]  # column IN the values
    find: str  # "{haystack} contains {needle}", both already folded
    lower: Callable[[str], str]  # case folding of a text expression
    collate: str  # appended to a text sort key: code point order
    detail_of_last_event: str  # the last event's detail.detail (text or NULL)
    age_seconds: str  # seconds since created_at at the bound time (one mark)
    reason_group: Callable[[str], str]  # the grouped reason of a text expression
    seconds: Callable[[str, str], str]  # seconds from one time expression to another
    json_field: Callable[[str, str], str]  # a field of JSON text, as text (or NULL)
    time_mark: str = "?"  # a bound time that may be NULL (typed where the driver must know)
    lock: str = ""  # the row lock of a read inside a write transaction (" FOR UPDATE")


@dataclass(frozen=True)
class Where:
    sql: str
    args: list[Any]


def where(sel: Any, d: Dialect) -> Where:
    """The ``WHERE`` clause (with its leading space, or "") of a ``Selection``."""
    m = d.mark
    parts: list[str] = []
    args: list[Any] = []
    if sel.statuses:
        clause, values = d.one_of("status", [str(s) for s in sel.statuses])
        either = " OR contradiction IS NOT NULL" if sel.also_contradicted else ""
        parts.append(f"({clause}{either})")
        args += values
    for column, value in (("provider", sel.provider), ("operation", sel.operation)):
        if value:
            parts.append(f"{column} = {m}")
            args.append(value)
    if sel.created_before:
        parts.append(f"created_at < {m}")
        args.append(sel.created_before)
    if sel.created_after:
        parts.append(f"created_at >= {m}")
        args.append(sel.created_after)
    if sel.ids is not None:
        clause, values = d.one_of("action_id", list(sel.ids))
        parts.append(clause)
        args += values
    if sel.delivery:
        clause, values = d.one_of("delivery", [str(v) for v in sel.delivery])
        parts.append(clause)
        args += values
    if sel.contradicted:
        parts.append("contradiction IS NOT NULL")
    if sel.match:
        needle = fold(sel.match)
        texts = ("reason", "contradiction", d.detail_of_last_event)
        found = [d.find.format(haystack=d.lower(f"COALESCE({t}, '')"), needle=m) for t in texts]
        parts.append("(" + " OR ".join(found) + ")")
        args += [needle] * len(texts)
    return Where((" WHERE " + " AND ".join(parts)) if parts else "", args)


def order_by(sel: Any, d: Dialect) -> str:
    """The ``ORDER BY`` clause of a ``Selection``: its sort key, then creation time and
    id, all in one direction (``reverse`` flips the whole order)."""
    field = sel.sort
    descending = bool(sel.reverse) != bool(sel.newest_first)
    if field == "age":  # youngest first
        field, descending = "created_at", not descending
    way = " DESC" if descending else ""
    keys: list[str] = []
    if field in _TIMES and field != "created_at":
        keys += [f"({field} IS NULL){way}", f"{field}{way}"]
    elif field == "status":
        keys.append(f"{_STATUS_RANK}{way}")
    elif field in _TEXTS and field != "action_id":
        keys.append(f"{field}{d.collate}{way}")
    elif field in ("attempt", "checks"):
        keys.append(f"{field}{way}")
    if field != "action_id":
        keys.append(f"created_at{way}")
    keys.append(f"action_id{way}")
    return " ORDER BY " + ", ".join(keys)


def limit(sel: Any, d: Dialect) -> tuple[str, list[Any]]:
    if sel.limit is None:
        return "", []
    return f" LIMIT {d.mark}", [min(int(sel.limit), 2**63 - 1)]


def group_key(by: str | None, d: Dialect) -> str:
    """The SQL of one stats grouping key (text; '' for everything together)."""
    if by is None:
        return "''"
    if by == "operation":
        return "provider || '/' || operation"
    if by == "reason":
        return f"COALESCE({d.reason_group('reason')}, '')"
    if by in ("provider", "status"):
        return by
    raise ValueError(f"cannot group by {by!r}; use one of {', '.join(GROUPS)}")


Statement = tuple[str, list[Any]]


def stats_statements(sel: Any, d: Dialect, now: str, by: str | None) -> dict[str, Statement]:
    """The aggregate statements ``Ledger.stats`` runs in one snapshot: ``cells``
    (counts by status, provider, operation and grouped reason), ``totals``, ``ages``
    (of every open record) and, with ``by``, ``ages_by`` (per group)."""
    w = where(sel, d)
    # Reasons are grouped after the exact ones are counted: the patterns run once per
    # distinct reason, not once per record (most records share a few reasons).
    cells = (
        "WITH c AS (SELECT status, provider, operation, reason, count(*) AS n,"
        f" min(created_at) AS first FROM actions{w.sql}"
        " GROUP BY status, provider, operation, reason)"
        f" SELECT status, provider, operation, {d.reason_group('reason')} AS reason_group,"
        " sum(n), min(first), max(reason) FROM c"
        " GROUP BY status, provider, operation, reason_group",
        list(w.args),
    )
    totals = (f"SELECT count(*), {CHECKS_FAILING_NOW} FROM actions{w.sql}", list(w.args))
    out = {"cells": cells, "totals": totals, "ages": _ages(w, d, now, None)}
    if by is not None:
        out["ages_by"] = _ages(w, d, now, by)
    return out


def _ages(w: Where, d: Dialect, now: str, by: str | None) -> Statement:
    """Nearest-rank p50 and p95 (as the audit's first-seen times) and the oldest age of
    the open records, per group (by reason: the patterns run once per distinct reason)."""
    clause, open_args = d.one_of("status", [str(s) for s in OPEN])
    open_where = f"{w.sql} AND {clause}" if w.sql else f" WHERE {clause}"
    if by == "reason":
        rows = (
            f"s0 AS (SELECT COALESCE(reason, '') AS reason, created_at FROM actions{open_where}),"
            f" g AS (SELECT reason, {d.reason_group('reason')} AS k"
            " FROM (SELECT DISTINCT reason FROM s0) u),"
            " s AS (SELECT g.k AS k, s0.created_at AS created_at"
            " FROM s0 JOIN g ON g.reason = s0.reason)"
        )
    else:
        rows = f"s AS (SELECT {group_key(by, d)} AS k, created_at FROM actions{open_where})"
    return (
        f"WITH {rows}, d AS (SELECT k, {d.age_seconds} AS s FROM s),"
        " r AS (SELECT k, s, row_number() OVER (PARTITION BY k ORDER BY s) AS i,"
        " count(*) OVER (PARTITION BY k) AS n FROM d)"
        " SELECT k, n, max(CASE WHEN i = (n * 50 + 99) / 100 THEN s END),"
        " max(CASE WHEN i = (n * 95 + 99) / 100 THEN s END), max(s)"
        " FROM r GROUP BY k, n",
        [*w.args, *open_args, now],
    )


__all__ = [
    "CHECKS_FAILING_NOW",
    "GROUPS",
    "OPEN",
    "REASON_PATTERNS",
    "SORT_FIELDS",
    "STATUS_ORDER",
    "Dialect",
    "Statement",
    "Where",
    "fold",
    "group_key",
    "limit",
    "order_by",
    "reason_group",
    "stats_statements",
    "where",
]
