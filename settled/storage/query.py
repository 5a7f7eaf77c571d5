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

from ..errors import InvalidInput
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
    "triage",
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

# Triage order (``sort="triage"``): what a person must look at first. A record later
# evidence contradicts, then what waits for a person's verdict, then a held action
# waiting for a person's confirmation, then what the checks still work on, then the
# settled ones. Within a rank, the oldest first. The rank is one expression, kept
# identical in the index ``actions_triage`` (both backends) so that a page of the
# queue is read from that index in order, never sorted from a scan.
TRIAGE_RANKS = (
    Status.DENIED_UNRESOLVED,
    Status.PENDING,
    Status.AWAITING_VERIFICATION,
    Status.IN_FLIGHT,
    Status.FAILED,
)
TRIAGE_RANK = (
    "(CASE WHEN contradiction IS NOT NULL THEN 0 "
    + " ".join(f"WHEN status = '{s}' THEN {i}" for i, s in enumerate(TRIAGE_RANKS, 1))
    + f" ELSE {len(TRIAGE_RANKS) + 1} END)"
)


# The indexes a listing's pages are read from, in its order (both backends): the
# default order (creation time, id) and triage order. Their expressions are the very
# text ``sort_keys`` orders by, so the planner finds them.
ORDER_INDEXES = (
    ("actions_created", "created_at, action_id"),
    ("actions_triage", f"{TRIAGE_RANK}, created_at, action_id"),
)


def triage_rank(status: str, contradiction: str | None) -> int:
    """``TRIAGE_RANK`` of one record, as the database computes it."""
    if contradiction is not None:
        return 0
    for i, s in enumerate(TRIAGE_RANKS, 1):
        if status == s:
            return i
    return len(TRIAGE_RANKS) + 1


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


# ``--search``: each word (text between spaces) must appear somewhere in the record's
# search text (its id, its params' values, its reason), in any case. Three characters is
# the least a trigram index can look up (both backends' indexes are of trigrams); the
# cap keeps a pasted page from becoming a query of a thousand terms.
SEARCH_MIN = 3
SEARCH_MAX_WORDS = 16
SEARCH_MAX = 1000  # characters


def search_terms(text: str) -> list[str]:
    """The words of a search, each to be found (``InvalidInput`` names what is wrong:
    no text, a word shorter than ``SEARCH_MIN``, too many words or characters)."""
    if len(text) > SEARCH_MAX:
        raise InvalidInput(f"a search is longer than {SEARCH_MAX} characters")
    words = list(dict.fromkeys(text.split()))
    if not words:
        raise InvalidInput("a search needs some text to look for")
    if len(words) > SEARCH_MAX_WORDS:
        raise InvalidInput(f"a search takes at most {SEARCH_MAX_WORDS} words")
    short = [w for w in words if len(w) < SEARCH_MIN]
    if short:
        raise InvalidInput(
            f"each word of a search needs at least {SEARCH_MIN} characters"
            f" ({short[0]!r} has {len(short[0])})"
        )
    return words


def fts5_phrases(words: Sequence[str]) -> str:
    """An FTS5 query in which every word is a phrase (its quotes doubled), all required:
    with the trigram tokenizer a phrase matches as a substring, so no character of the
    word is read as FTS5 syntax."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


def like_escaped(word: str) -> str:
    """``word`` as a ``LIKE`` pattern of itself anywhere (backslash escapes)."""
    plain = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{plain}%"


@dataclass(frozen=True, eq=False)  # one object per backend: known by its identity
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
    skip_locked: str = ""  # the same, passing over rows another transaction holds
    # A write and the event that records it, as ONE statement (a data-modifying WITH:
    # PostgreSQL), or as two, the second run only when the first changed a row (SQLite).
    writes_in_one: bool = False
    returning: bool = True  # UPDATE … RETURNING (SQLite from 3.35)
    # The counts row a writing transaction adds to (``statements.COUNTS``): one per
    # session where sessions write at once (PostgreSQL's backend pid), so no two
    # transactions ever wait on each other's count; SQLite's one writer keeps one.
    count_slot: str = "0"
    # The read's snapshot, as text ("xmin:xmax:in-progress,…" on PostgreSQL), or NULL
    # where no transaction in progress can hold an event id below a visible one (SQLite's
    # one writer): what ``verify``'s checkpoint must wait for before it may advance.
    snapshot: str = "NULL"
    # A read of a few statuses' records through the status index, whatever the planner
    # guesses (SQLite's statistics see five statuses, not that the open ones are a few
    # per cent of a grown ledger, and would scan the table): appended to the table name.
    by_status: str = ""
    # records whose search text holds every one of the words (``search_terms``),
    # answered through the search index: FTS5 on SQLite, pg_trgm on PostgreSQL
    search: Callable[[Sequence[str]], tuple[str, list[Any]]] = lambda words: ("", [])


# A cursor's keys are read without a backend: only their values, never their SQL.
_NO_DIALECT = Dialect(
    "?", lambda c, v: ("", []), "", str, "", "", "", str, lambda a, b: "", lambda a, b: ""
)


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
        if sel.also_failing:
            either += " OR (check_error IS NOT NULL AND status NOT IN ('CONFIRMED', 'FAILED'))"
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
    if sel.search:
        clause, values = d.search(search_terms(sel.search))
        parts.append(clause)
        args += values
    if sel.causes:
        named = [c for c in sel.causes if c != "contradicted"]
        any_of: list[str] = []
        if named:
            clause, values = d.one_of("cause", list(named))
            any_of.append(clause)
            args += values
        if "contradicted" in sel.causes:
            any_of.append("contradiction IS NOT NULL")
        parts.append("(" + " OR ".join(any_of) + ")")
    if sel.match:
        needle = fold(sel.match)
        # the cause is read with spaces for its underscores: "HTTP 503" finds http_503
        # after a later check rewrote the reason
        texts = ("reason", "contradiction", d.detail_of_last_event, "replace(cause, '_', ' ')")
        found = [d.find.format(haystack=d.lower(f"COALESCE({t}, '')"), needle=m) for t in texts]
        parts.append("(" + " OR ".join(found) + ")")
        args += [needle] * len(texts)
    return Where((" WHERE " + " AND ".join(parts)) if parts else "", args)


@dataclass(frozen=True)
class Key:
    """One key of a listing's order: its SQL, how to read its value from a record (for
    a cursor), and whether that value may be NULL (a missing time)."""

    sql: str
    value: Callable[[Any], Any]
    nullable: bool = False
    domain: tuple[int, ...] | None = None  # every value it takes, when they are few


def _field(name: str) -> Callable[[Any], Any]:
    return lambda rec: getattr(rec, name)


def _missing(name: str) -> Callable[[Any], Any]:
    return lambda rec: getattr(rec, name) is None


def sort_keys(sel: Any, d: Dialect) -> tuple[list[Key], bool]:
    """The keys of a ``Selection``'s order, and whether they run descending: its sort
    key, then creation time and id, all in one direction (``reverse`` flips the whole
    order)."""
    field = sel.sort
    descending = bool(sel.reverse) != bool(sel.newest_first)
    if field == "age":  # youngest first
        field, descending = "created_at", not descending
    keys: list[Key] = []
    if field == "triage":
        keys.append(
            Key(
                TRIAGE_RANK,
                lambda r: triage_rank(str(r.status), r.contradiction),
                domain=tuple(range(len(TRIAGE_RANKS) + 2)),
            )
        )
        # A record's cause (when the ledger keeps one) sorts here, after the rank and
        # before the age: one more Key whose SQL is indexed with the rank.
    elif field in _TIMES and field != "created_at":
        keys += [
            Key(f"({field} IS NULL)", _missing(field)),
            Key(field, _field(field), nullable=True),
        ]
    elif field == "status":
        keys.append(Key(_STATUS_RANK, lambda r: STATUS_ORDER.index(r.status)))
    elif field in _TEXTS and field != "action_id":
        keys.append(Key(f"{field}{d.collate}", _field(field)))
    elif field in ("attempt", "checks"):
        keys.append(Key(field, _field(field)))
    if field != "action_id":
        keys.append(Key("created_at", _field("created_at")))
    keys.append(Key("action_id", _field("action_id")))
    return keys, descending


def order_by(sel: Any, d: Dialect, backward: bool = False) -> str:
    """The ``ORDER BY`` clause of a ``Selection`` (``sort_keys``); ``backward``: the
    same order read from its end (a page before a cursor)."""
    keys, descending = sort_keys(sel, d)
    way = " DESC" if descending != backward else ""
    return " ORDER BY " + ", ".join(f"{k.sql}{way}" for k in keys)


def cursor(sel: Any, rec: Any) -> str:
    """An opaque cursor after ``rec`` in ``sel``'s order: the values of its order's
    keys, with the sort they belong to (a cursor of another order is refused)."""
    import base64
    import json

    keys, _ = sort_keys(sel, _NO_DIALECT)
    body = {"s": sel.sort, "r": bool(sel.reverse) != bool(sel.newest_first)}
    body["k"] = [k.value(rec) for k in keys]
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def read_cursor(sel: Any, text: str) -> list[Any]:
    """The key values of a ``cursor`` made for ``sel``'s order (``ValueError`` saying
    why when it was not)."""
    import base64
    import binascii
    import json

    keys, _ = sort_keys(sel, _NO_DIALECT)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        body = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError(
            "the cursor is not one a listing gave; start from the first page"
        ) from None
    values = body.get("k") if isinstance(body, dict) else None
    if not isinstance(values, list) or body.get("s") not in SORT_FIELDS:
        raise ValueError("the cursor is not one a listing gave; start from the first page")
    way = bool(sel.reverse) != bool(sel.newest_first)
    if body.get("s") != sel.sort or body.get("r") != way:
        raise ValueError(
            "the cursor belongs to another order (sort or reverse); "
            "page with the order it came from, or start from the first page"
        )
    if len(values) != len(keys):
        raise ValueError("the cursor is not one a listing gave; start from the first page")
    for k, v in zip(keys, values, strict=True):
        if not isinstance(v, (str, int, bool)) and not (v is None and k.nullable):
            raise ValueError("the cursor is not one a listing gave; start from the first page")
    return values


Part = tuple[str, list[Any], str]  # a condition, its arguments, its ORDER BY


def seek_parts(sel: Any, d: Dialect) -> tuple[list[Part], bool]:
    """The reads of one page of ``sel`` after (or before) its cursor, in order, each a
    condition ANDed to the ``WHERE`` with its own ``ORDER BY``: the page is what they
    give, read one after the other until it is full; and whether they read backward.

    When the order's first key takes a few values only (the triage rank), a row value
    beginning with it does not seek its index (SQLite scans every row of the cursor's
    rank up to the cursor), so the page is read a rank at a time: the rest of the
    cursor's rank, then each following rank from its start, each an index seek on
    ``rank = ?`` and the remaining keys. Otherwise one read (``seek``)."""
    values = sel.after if sel.after is not None else sel.before
    keys, descending = sort_keys(sel, d)
    first = keys[0]
    if values is None or first.domain is None or values[0] not in first.domain:
        past, args, backward = seek(sel, d)
        return [(past, args, order_by(sel, d, backward=backward))], backward
    backward = sel.after is None
    rest, m = keys[1:], d.mark
    down = descending != backward
    way, later = (" DESC", "<") if down else ("", ">")
    order = " ORDER BY " + ", ".join(f"{k.sql}{way}" for k in rest)
    at = values[0]
    marks = ", ".join(m for _ in rest)
    parts: list[Part] = [
        (
            f"{first.sql} = {m} AND ({', '.join(k.sql for k in rest)}) {later} ({marks})",
            [at, *values[1:]],
            order,
        )
    ]
    following = sorted((r for r in first.domain if (r < at if down else r > at)), reverse=down)
    parts += [(f"{first.sql} = {m}", [r], order) for r in following]
    return parts, backward


def seek(sel: Any, d: Dialect) -> tuple[str, list[Any], bool]:
    """The keyset condition of ``sel.after`` or ``sel.before`` (cursor values, or
    None), ANDed to a ``WHERE``: the rows after (or before) the cursor's in ``sel``'s
    order, and whether they are read backward. A row value of every key when none is
    missing, so an index in that order is entered at the cursor, never scanned from
    its start (no OFFSET); with a missing time, the same as a chain of comparisons
    behind a range on the first key."""
    values = sel.after if sel.after is not None else sel.before
    if values is None:
        return "", [], False
    backward = sel.after is None
    keys, descending = sort_keys(sel, d)
    m = d.mark
    later = "<" if descending != backward else ">"
    args: list[Any] = []
    chain: list[str] = []
    same: list[str] = []
    same_args: list[Any] = []
    for k, v in zip(keys, values, strict=True):
        if v is None:  # a missing time: every row here has one (its IS NULL key is equal)
            same.append(f"{k.sql} IS NULL")
            continue
        chain.append("(" + " AND ".join([*same, f"{k.sql} {later} {m}"]) + ")")
        args += [*same_args, v]
        same.append(f"{k.sql} = {m}")
        same_args.append(v)
    if all(v is not None for v in values):
        # one row value: both backends seek a multi-column index to it, whatever the
        # number of rows sharing the first key (a triage rank is shared by thousands)
        marks = ", ".join(m for _ in keys)
        return f"({', '.join(k.sql for k in keys)}) {later} ({marks})", list(values), backward
    first = keys[0]
    head = f"{first.sql} {later}= {m}"
    sql = f"{head} AND ({' OR '.join(chain)})" if chain else "1 = 0"
    return sql, [values[0], *args] if chain else [], backward


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


def stats_statements(
    sel: Any, d: Dialect, now: str, by: str | None, *, by_status: bool = False
) -> dict[str, Statement]:
    """The aggregate statements ``Ledger.stats`` runs in one snapshot: ``cells``
    (counts by status, provider, operation and grouped reason), ``totals``, ``ages``
    (of every open record) and, with ``by``, ``ages_by`` (per group). ``by_status``:
    ``sel`` names a few statuses, read through the status index (``Dialect.by_status``)."""
    w = where(sel, d)
    table = f"actions{d.by_status}" if by_status else "actions"
    # Reasons are grouped after the exact ones are counted: the patterns run once per
    # distinct reason, not once per record (most records share a few reasons).
    cells = (
        "WITH c AS (SELECT status, provider, operation, reason, count(*) AS n,"
        f" min(created_at) AS first FROM {table}{w.sql}"
        " GROUP BY status, provider, operation, reason)"
        f" SELECT status, provider, operation, {d.reason_group('reason')} AS reason_group,"
        " sum(n), min(first), max(reason) FROM c"
        " GROUP BY status, provider, operation, reason_group",
        list(w.args),
    )
    totals = (f"SELECT count(*), {CHECKS_FAILING_NOW} FROM {table}{w.sql}", list(w.args))
    out = {"cells": cells, "totals": totals, "ages": _ages(w, d, now, None, table)}
    if by is not None:
        out["ages_by"] = _ages(w, d, now, by, table)
    return out


def causes_statement(sel: Any, d: Dialect) -> Statement:
    """``Ledger.causes``: the selected records by why they are where they are, a
    contradicted one by its contradiction, every other by its reason; each exact text
    counted first, then grouped (the patterns run once per distinct text)."""
    w = where(sel, d)
    return (
        "WITH c AS (SELECT (contradiction IS NOT NULL) AS contra,"
        f" COALESCE(contradiction, reason, '') AS why, count(*) AS n FROM actions{w.sql}"
        " GROUP BY contra, why)"
        f" SELECT contra, {d.reason_group('why')} AS g, sum(n) AS total FROM c"
        " GROUP BY contra, g ORDER BY total DESC, contra DESC, g",
        list(w.args),
    )


def _ages(w: Where, d: Dialect, now: str, by: str | None, table: str = "actions") -> Statement:
    """Nearest-rank p50 and p95 (as the audit's first-seen times) and the oldest age of
    the open records, per group (by reason: the patterns run once per distinct reason)."""
    clause, open_args = d.one_of("status", [str(s) for s in OPEN])
    open_where = f"{w.sql} AND {clause}" if w.sql else f" WHERE {clause}"
    if by == "reason":
        rows = (
            f"s0 AS (SELECT COALESCE(reason, '') AS reason, created_at FROM {table}{open_where}),"
            f" g AS (SELECT reason, {d.reason_group('reason')} AS k"
            " FROM (SELECT DISTINCT reason FROM s0) u),"
            " s AS (SELECT g.k AS k, s0.created_at AS created_at"
            " FROM s0 JOIN g ON g.reason = s0.reason)"
        )
    else:
        rows = f"s AS (SELECT {group_key(by, d)} AS k, created_at FROM {table}{open_where})"
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
    "ORDER_INDEXES",
    "REASON_PATTERNS",
    "SEARCH_MAX",
    "SEARCH_MAX_WORDS",
    "SEARCH_MIN",
    "SORT_FIELDS",
    "STATUS_ORDER",
    "TRIAGE_RANK",
    "TRIAGE_RANKS",
    "Dialect",
    "Key",
    "Part",
    "Statement",
    "Where",
    "causes_statement",
    "cursor",
    "fold",
    "fts5_phrases",
    "group_key",
    "like_escaped",
    "limit",
    "order_by",
    "read_cursor",
    "reason_group",
    "search_terms",
    "seek",
    "seek_parts",
    "sort_keys",
    "stats_statements",
    "triage_rank",
    "where",
]
