"""The audit's figures (``settled providers audit``), written once for both backends:
four aggregate statements per operation, in a backend's ``query.Dialect``, and
``fold``, which turns their rows (the same on both) into ``Figures``.

The dialects differ here only in how seconds between two times are measured
(``Dialect.seconds``) and how a field of an event's JSON detail is read
(``Dialect.json_field``). Every event kind and text pattern is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..model import EventKind
from .ledger import Figures
from .query import Dialect
from .statements import render

# The event kinds the statements read (bound, never spliced).
KINDS = {
    "outcome": str(EventKind.OUTCOME),
    "resolved": str(EventKind.RESOLVED),
    "unresolved": str(EventKind.UNRESOLVED),
    "reconciled": str(EventKind.RECONCILED),
    "callback": str(EventKind.CALLBACK),
}

Statement = tuple[str, list[Any]]


def _count(condition: str) -> str:
    return f"sum(CASE WHEN {condition} THEN 1 ELSE 0 END)"


_COUNTS = (
    "SELECT provider, operation, count(*), "
    + ", ".join(
        _count(c)
        for c in (
            "status = 'CONFIRMED'",
            "status = 'FAILED'",
            "status = 'DENIED_UNRESOLVED'",
            "status IN ('PENDING', 'IN_FLIGHT', 'AWAITING_VERIFICATION')",
            "confirmed_by = 'provider'",
            "confirmed_by = 'reconciliation'",
            "confirmed_by LIKE ?",  # operator:…
            "checks > 0",
            "confirmed_by = 'reconciliation' AND checks > 1",
            "contradiction IS NOT NULL",
            "confirmed_by LIKE ?",  # callback:…
        )
    )
    + " FROM actions GROUP BY provider, operation"
)


def statements(d: Dialect) -> list[Statement]:
    """The four statements ``fold`` takes the rows of, in order, in dialect ``d``."""
    detail: Callable[[str, str], str] = d.json_field
    first_seen = (
        "WITH d AS (SELECT provider, operation,"
        f" round({d.seconds('dispatched_at', 'confirmed_at')}, 3) AS s FROM actions"
        " WHERE confirmed_by = 'reconciliation' AND dispatched_at IS NOT NULL),"
        " r AS (SELECT provider, operation, s,"
        " row_number() OVER (PARTITION BY provider, operation ORDER BY s) AS i,"
        " count(*) OVER (PARTITION BY provider, operation) AS n FROM d)"
        " SELECT provider, operation, n,"
        " max(CASE WHEN i = (n * 50 + 99) / 100 THEN s END),"
        " max(CASE WHEN i = (n * 95 + 99) / 100 THEN s END)"
        " FROM r GROUP BY provider, operation, n"
    )
    k = KINDS
    # the value column: the outcome's verdict; a person's verdict and whether the record
    # had been checked ("applied:1"); whether a spent budget had seen anything ("1")
    events = (
        "SELECT a.provider, a.operation, e.kind, e.to_status, CASE"
        f" WHEN e.kind = ? THEN {detail('e.detail', 'verdict')}"
        f" WHEN e.kind = ? THEN {detail('e.detail', 'verdict')}"
        " || ':' || CASE WHEN a.checks > 0 THEN '1' ELSE '0' END"
        f" WHEN e.kind = ? THEN CASE WHEN {detail('e.detail', 'seen')} IS NOT NULL"
        " THEN '1' ELSE '0' END END, count(*)"
        " FROM events e JOIN actions a ON a.action_id = e.action_id"
        " WHERE e.kind IN (?, ?, ?, ?, ?) GROUP BY 1, 2, 3, 4, 5"
    )
    accepted_then_absent = (
        "SELECT a.provider, a.operation, count(DISTINCT r.id) FROM events r"
        " JOIN events o ON o.action_id = r.action_id AND o.attempt = r.attempt AND o.kind = ?"
        " JOIN actions a ON a.action_id = r.action_id"
        " WHERE r.kind = ? AND r.to_status = 'FAILED'"
        f" AND {detail('o.detail', 'verdict')} = 'accepted' GROUP BY 1, 2"
    )
    return [
        (render(_COUNTS, d), ["operator:%", "callback:%"]),
        (render(first_seen, d), []),
        (
            render(events, d),
            [
                k["outcome"],
                k["resolved"],
                k["unresolved"],
                k["outcome"],
                k["reconciled"],
                k["resolved"],
                k["unresolved"],
                k["callback"],
            ],
        ),
        (render(accepted_then_absent, d), [k["outcome"], k["reconciled"]]),
    ]


def figures(
    run: Callable[[str, list[Any]], Iterable[Sequence[Any]]], d: Dialect
) -> dict[tuple[str, str], Figures]:
    """The figures per (provider, operation): ``run`` executes one statement (inside
    the caller's one read snapshot) and returns its rows."""
    return fold(*(run(sql, args) for sql, args in statements(d)))


def fold(
    counts: Iterable[Sequence[Any]],
    first_seen: Iterable[Sequence[Any]],
    events: Iterable[Sequence[Any]],
    accepted_then_absent: Iterable[Sequence[Any]],
) -> dict[tuple[str, str], Figures]:
    """The four statements' rows, per operation."""
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
        elif kind == EventKind.UNRESOLVED and value == "1":
            f.budget_spent += times
    for p, o, n in accepted_then_absent:
        get(p, o).accepted_then_absent = int(n)
    return out


__all__ = ["KINDS", "figures", "fold", "statements"]
