"""The audit's figures from a PostgreSQL ledger: the same four aggregate queries as
SQLite's, returning the same rows (``sqlite_audit.fold`` folds them)."""

from __future__ import annotations

from typing import Any

from .base import Figures
from .sqlite_audit import _KINDS, fold

_COUNTS = """
SELECT provider, operation, count(*),
       count(*) FILTER (WHERE status = 'CONFIRMED'),
       count(*) FILTER (WHERE status = 'FAILED'),
       count(*) FILTER (WHERE status = 'DENIED_UNRESOLVED'),
       count(*) FILTER (WHERE status IN ('PENDING', 'IN_FLIGHT', 'AWAITING_VERIFICATION')),
       count(*) FILTER (WHERE confirmed_by = 'provider'),
       count(*) FILTER (WHERE confirmed_by = 'reconciliation'),
       count(*) FILTER (WHERE confirmed_by LIKE 'operator:%'),
       count(*) FILTER (WHERE checks > 0),
       count(*) FILTER (WHERE confirmed_by = 'reconciliation' AND checks > 1),
       count(*) FILTER (WHERE contradiction IS NOT NULL),
       count(*) FILTER (WHERE confirmed_by LIKE 'callback:%')
FROM actions GROUP BY provider, operation
"""

_FIRST_SEEN = """
WITH d AS (
  SELECT provider, operation,
         round(extract(epoch FROM confirmed_at - dispatched_at), 3) AS s
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

# The details are JSON text; ``::json`` reads them as they were written.
_EVENTS = """
SELECT a.provider, a.operation, e.kind, e.to_status,
       CASE e.kind
         WHEN %(outcome)s THEN e.detail::json ->> 'verdict'
         WHEN %(resolved)s THEN (e.detail::json ->> 'verdict') || ':' || (a.checks > 0)::int
         WHEN %(unresolved)s THEN ((e.detail::json ->> 'seen') IS NOT NULL)::int::text
       END,
       count(*)
FROM events e JOIN actions a ON a.action_id = e.action_id
WHERE e.kind IN (%(outcome)s, %(reconciled)s, %(resolved)s, %(unresolved)s, %(callback)s)
GROUP BY 1, 2, 3, 4, 5
"""

_ACCEPTED_THEN_ABSENT = """
SELECT a.provider, a.operation, count(DISTINCT r.id)
FROM events r
JOIN events o ON o.action_id = r.action_id AND o.attempt = r.attempt AND o.kind = %(outcome)s
JOIN actions a ON a.action_id = r.action_id
WHERE r.kind = %(reconciled)s AND r.to_status = 'FAILED'
  AND o.detail::json ->> 'verdict' = 'accepted'
GROUP BY 1, 2
"""


# _COUNTS runs without parameters, so its "%" is a plain LIKE wildcard.


def figures(cur: Any) -> dict[tuple[str, str], Figures]:
    """``cur``: a psycopg cursor inside one read transaction (one snapshot)."""

    def rows(sql: str, args: dict[str, str] | None = None) -> list[Any]:
        cur.execute(sql, args)
        return list(cur.fetchall())

    return fold(
        rows(_COUNTS),
        rows(_FIRST_SEEN),
        rows(_EVENTS, _KINDS),
        rows(_ACCEPTED_THEN_ABSENT, _KINDS),
    )
