"""The ledger's counts (``Stats``) folded for people and scripts: totals, the count
per group (status, provider, operation or reason) and the open reasons with an example
each, as ``settled stats --json`` prints them and the console's stats page shows them."""

from __future__ import annotations

from typing import Any

from .model import TERMINAL, Status
from .selection import STATUSES

OPEN = tuple(s.value for s in Status if s not in TERMINAL)  # what nobody can call done yet


def key_of(cell: Any, by: str) -> str:
    if by == "operation":
        return f"{cell.provider}/{cell.operation}"
    if by == "reason":
        return cell.reason_group or ""
    return str(getattr(cell, by))


def failing_by_provider(
    failing: dict[str, int], paused: dict[str, int], provider: str | None = None
) -> list[dict[str, Any]]:
    """The checks failing now, by provider (most first): how many of its open records
    cannot be checked, and how many of those because it asked for a pause (429/503:
    an outage, not a broken verifier)."""
    return [
        {"provider": p, "failing": n, "paused": paused.get(p, 0)}
        for p, n in sorted(failing.items(), key=lambda kv: (-kv[1], kv[0]))
        if n and (provider is None or p == provider)
    ]


def summarise(stats: Any, by: str) -> dict[str, Any]:
    """``Stats`` folded for people and scripts: totals, per group of ``by``, reasons."""
    by_status = dict.fromkeys(STATUSES, 0)
    counts: dict[tuple[str, str, str], int] = {}
    groups: dict[str, dict[str, Any]] = {}
    reasons: dict[str, dict[str, Any]] = {}
    for c in stats.cells:
        by_status[c.status] += c.count
        counts[(c.status, c.provider, c.operation)] = (
            counts.get((c.status, c.provider, c.operation), 0) + c.count
        )
        g = groups.setdefault(
            key_of(c, by),
            {"key": key_of(c, by), "total": 0, "open": 0, "by_status": dict.fromkeys(STATUSES, 0)},
        )
        g["total"] += c.count
        g["open"] += c.count if c.status in OPEN else 0
        g["by_status"][c.status] += c.count
        if c.status in OPEN and c.reason_group is not None:
            r = reasons.setdefault(
                c.reason_group,
                {
                    "reason": c.reason_group,
                    "count": 0,
                    "by_status": {},
                    "example": c.example_reason,
                    "oldest_created_at": c.oldest_created_at,
                },
            )
            r["count"] += c.count
            r["by_status"][c.status] = r["by_status"].get(c.status, 0) + c.count
            r["oldest_created_at"] = min(r["oldest_created_at"], c.oldest_created_at)
    for key, g in groups.items():
        g["age_seconds"] = stats.ages_by[key].to_json() if key in stats.ages_by else None
    return {
        "total": stats.total,
        "open": sum(by_status[s] for s in OPEN),
        "by_status": by_status,
        "checks_failing_now": stats.checks_failing_now,
        "age_seconds": stats.ages.to_json(),
        "by": by,
        "groups": sorted(groups.values(), key=lambda g: (-g["open"], -g["total"], g["key"])),
        "reasons": sorted(reasons.values(), key=lambda r: (-r["count"], r["reason"])),
        "counts": [
            {"status": s, "provider": p, "operation": o, "count": n}
            for (s, p, o), n in sorted(counts.items())
        ],
    }
