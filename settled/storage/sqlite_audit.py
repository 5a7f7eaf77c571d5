"""The audit's figures from a SQLite ledger: four aggregate queries, per operation."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from ..model import EventKind
from .base import Figures

_COUNTS = """
SELECT provider, operation, count(*),
       sum(status = 'CONFIRMED'), sum(status = 'FAILED'), sum(status = 'DENIED_UNRESOLVED'),
       sum(status IN ('PENDING', 'IN_FLIGHT', 'AWAITING_VERIFICATION')),
       sum(confirmed_by = 'provider'), sum(confirmed_by = 'reconciliation'),
       sum(confirmed_by LIKE 'operator:%'), sum(checks > 0),
       sum(confirmed_by = 'reconciliation' AND checks > 1),
       sum(contradiction IS NOT NULL),
       sum(confirmed_by LIKE 'callback:%')
FROM actions GROUP BY provider, operation
"""

_FIRST_SEEN = """
WITH d AS (
  SELECT provider, operation,
         round((julianday(confirmed_at) - julianday(dispatched_at)) * 86400.0, 3) AS s
  FROM actions
  WHERE confirmed_by = 'reconciliation' AND dispatched_at IS NOT NULL
), r AS (
  SELECT provider, operation, s,
         row_number() OVER (PARTITION BY provider, operation ORDER BY s) AS i,
         count(*) OVER (PARTITION BY provider, operation) AS n
  FROM d
)
SELECT provider, operation, n,
       max(CASE WHEN i = (n * 50 + 99) / 100 THEN s END),
       max(CASE WHEN i = (n * 95 + 99) / 100 THEN s END)
FROM r GROUP BY provider, operation, n
"""

# :outcome, :resolved, :unresolved, :reconciled are the event kinds (bound, never spliced).
_EVENTS = """
SELECT a.provider, a.operation, e.kind, e.to_status,
       CASE e.kind
         WHEN :outcome THEN json_extract(e.detail, '$.verdict')
         WHEN :resolved THEN json_extract(e.detail, '$.verdict') || ':' || (a.checks > 0)
         WHEN :unresolved THEN json_extract(e.detail, '$.seen') IS NOT NULL
       END,
       count(*)
FROM events e JOIN actions a ON a.action_id = e.action_id
WHERE e.kind IN (:outcome, :reconciled, :resolved, :unresolved, :callback)
GROUP BY 1, 2, 3, 4, 5
"""

_ACCEPTED_THEN_ABSENT = """
SELECT a.provider, a.operation, count(DISTINCT r.id)
FROM events r
JOIN events o ON o.action_id = r.action_id AND o.attempt = r.attempt AND o.kind = :outcome
JOIN actions a ON a.action_id = r.action_id
WHERE r.kind = :reconciled AND r.to_status = 'FAILED'
  AND json_extract(o.detail, '$.verdict') = 'accepted'
GROUP BY 1, 2
"""

_KINDS = {
    "outcome": str(EventKind.OUTCOME),
    "resolved": str(EventKind.RESOLVED),
    "unresolved": str(EventKind.UNRESOLVED),
    "reconciled": str(EventKind.RECONCILED),
    "callback": str(EventKind.CALLBACK),
}


def figures(conn: sqlite3.Connection) -> dict[tuple[str, str], Figures]:
    return fold(
        conn.execute(_COUNTS),
        conn.execute(_FIRST_SEEN),
        conn.execute(_EVENTS, _KINDS),
        conn.execute(_ACCEPTED_THEN_ABSENT, _KINDS),
    )


def fold(
    counts: Iterable[Sequence[Any]],
    first_seen: Iterable[Sequence[Any]],
    events: Iterable[Sequence[Any]],
    accepted_then_absent: Iterable[Sequence[Any]],
) -> dict[tuple[str, str], Figures]:
    """The four queries' rows, per operation (shared by both backends, whose SQL
    returns the same rows)."""
    out: dict[tuple[str, str], Figures] = {}

    def get(p: str, o: str) -> Figures:
        return out.setdefault((p, o), Figures())

    for row in counts:
        p, o, *n = row
        f = get(p, o)
        (
            f.total,
            f.confirmed,
            f.failed,
            f.unresolved,
            f.pending,
            f.confirmed_by_provider,
            f.confirmed_by_reconciliation,
            f.confirmed_by_person,
            f.checked,
            f.late,
            f.contradictions,
            f.confirmed_by_callback,
        ) = (int(x or 0) for x in n)
    for p, o, n, p50, p95 in first_seen:
        f = get(p, o)
        f.first_seen_n = int(n)
        f.first_seen_p50 = None if p50 is None else float(p50)
        f.first_seen_p95 = None if p95 is None else float(p95)
    for p, o, kind, to, value, count in events:
        f = get(p, o)
        times = int(count)
        if kind == EventKind.OUTCOME and value == "proven":
            f.proven_replies += times
        elif kind == EventKind.OUTCOME and value == "accepted":
            f.unproven_replies += times
        elif kind == EventKind.OUTCOME and value == "ambiguous":
            f.ambiguous_sends += times
        elif kind == EventKind.RECONCILED and to == "FAILED":
            f.reconciled_absent += times
        elif kind == EventKind.CALLBACK:
            f.callbacks += times
            if to == "FAILED":
                f.failed_by_callback += times
        elif kind == EventKind.RESOLVED and value == "applied:1":
            f.found_by_person += times
        elif kind == EventKind.UNRESOLVED and value in (1, "1"):
            f.budget_spent += times
    for p, o, n in accepted_then_absent:
        get(p, o).accepted_then_absent = int(n)
    return out
