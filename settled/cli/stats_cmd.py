"""settled stats: the first screen of an incident. Counts by status, provider and
operation, the reasons records are held for (grouped: numbers, ids and times written as
placeholders), how long open records have waited, and the checks failing now; every
figure aggregated by the ledger's SQL in one snapshot (``Ledger.stats``). Read-only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import typer

from . import complete
from .common import STATE, STATUSES, emit_json, parse_duration
from .render import Col, console, span, text

STATS_HELP = """Count what the ledger holds: the first screen of an incident.

Counts by status for each operation (or --by provider, status or reason), the ages
(p50, p95, oldest) of the open records (PENDING, IN_FLIGHT, AWAITING_VERIFICATION,
DENIED_UNRESOLVED), the reasons the open records are held for, grouped (a time
becomes a placeholder and every word with a digit in it becomes #, so "budget spent
after 3 check(s)" and "after 5 check(s)" are one group; an HTTP status stays), and
the checks failing now.

Select with --provider, --operation, --status (default: all), --older-than and
--since (creation time). Every figure is counted by the ledger in one snapshot; it
only reads, and a missing ledger is exit 1. --json prints one object.

\b
Examples:
  settled stats
  settled stats --provider mail --since 1h
  settled stats --by reason --status DENIED_UNRESOLVED
  settled stats --json | jq '.reasons[:3]'
"""

OPEN = ("PENDING", "IN_FLIGHT", "AWAITING_VERIFICATION", "DENIED_UNRESOLVED")
SHORT = {
    "PENDING": "pending",
    "IN_FLIGHT": "in_flight",
    "AWAITING_VERIFICATION": "awaiting",
    "CONFIRMED": "confirmed",
    "FAILED": "failed",
    "DENIED_UNRESOLVED": "unresolved",
}
REASONS_SHOWN = 10  # reason groups on the first screen; --json has them all


def key_of(cell: Any, by: str) -> str:
    if by == "operation":
        return f"{cell.provider}/{cell.operation}"
    if by == "reason":
        return cell.reason_group or ""
    return str(getattr(cell, by))


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


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else span(seconds)


def render(data: dict[str, Any], where: str, what: str) -> None:
    from .render import listing

    con = console()
    open_parts = ", ".join(f"{n} {s}" for s, n in data["by_status"].items() if s in OPEN and n)
    age = data["age_seconds"]
    con.print(text((f"settled stats: {data['total']} action(s)", "bold"), f" ({what}) in {where}"))
    con.print(text(f"open: {data['open']}" + (f" ({open_parts})" if open_parts else "")))
    con.print(
        text(
            f"age of open actions: p50 {_age(age['p50'])}, p95 {_age(age['p95'])}, "
            f"oldest {_age(age['oldest'])}"
        )
    )
    con.print(text(f"checks failing now: {data['checks_failing_now']}"))
    con.print()
    cols = [
        Col(f"by {data['by']}", lambda g: g["key"] or "(no reason)", flex=data["by"] == "reason")
    ]
    cols += [
        Col("total", lambda g: str(g["total"]), right=True),
        Col("open", lambda g: str(g["open"]), right=True),
    ]
    for i, s in enumerate(STATUSES):
        cols.append(Col(SHORT[s], _count(s), right=True, give_way=10 + i))
    cols += [
        Col("p50 age", lambda g: _age((g["age_seconds"] or {}).get("p50")), right=True, give_way=2),
        Col("p95 age", lambda g: _age((g["age_seconds"] or {}).get("p95")), right=True, give_way=1),
    ]
    listing(cols, data["groups"], "table", title=None, empty="nothing selected")
    if data["by"] != "reason" and data["reasons"]:
        con.print()
        shown = data["reasons"][:REASONS_SHOWN]
        more = len(data["reasons"]) - len(shown)
        rcols = [
            Col("count", lambda r: str(r["count"]), right=True),
            Col("statuses", lambda r: ", ".join(SHORT[s] for s in r["by_status"]), give_way=1),
            Col("why (open actions, grouped)", lambda r: r["reason"], flex=True),
        ]
        listing(rcols, shown, "table", title=None)
        if more:
            con.print(text(f"… {more} more reason group(s): settled stats --by reason"))


def _count(status: str) -> Any:
    return lambda g: str(g["by_status"][status] or "")


def register(app: typer.Typer) -> None:
    @app.command(help=STATS_HELP)
    def stats(
        provider: str = complete.provider_option("Only this provider."),
        operation: str = complete.operation_option("Only this operation."),
        status: str = complete.status_option(
            "Only these statuses (default: all).", "STATUS[,STATUS…]|all"
        ),
        older_than: str = complete.older_than_option(
            "Only actions created longer ago than e.g. 10m."
        ),
        since: str | None = typer.Option(
            None, "--since", metavar="DURATION", help="Only actions created within e.g. 1h."
        ),
        by: str = typer.Option(
            "operation",
            "--by",
            metavar="provider|operation|status|reason",
            help="What the table's rows are.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Every figure as one JSON object."),
    ) -> None:
        from ..clock import plus, to_text
        from ..errors import InvalidInput
        from ..storage.base import Selection
        from ..storage.query import GROUPS
        from .common import check_filters
        from .listing import parse_statuses

        group = by.strip().lower()
        if group not in GROUPS:
            raise InvalidInput(f"--by {by!r}: use one of {', '.join(GROUPS)}")
        statuses = parse_statuses(status) if status else None
        older = parse_duration(older_than) if older_than else None
        within = parse_duration(since) if since else None
        ledger = STATE.ledger(read_only=True)
        now = ledger.clock(anchor=False).now()
        check_filters(ledger, provider, operation)

        def ago(seconds: float | None) -> str | None:
            return None if seconds is None else to_text(plus(now, -seconds))

        sel = Selection(
            statuses=statuses,
            provider=provider,
            operation=operation,
            created_before=ago(older),
            created_after=ago(within),
        )
        data = summarise(ledger.stats(sel, now=to_text(now), by=group), group)
        if as_json:
            emit_json({"ledger": ledger.location, "at": to_text(now), **data})
            raise typer.Exit(0)
        render(data, ledger.location, _described(statuses, provider, operation, older_than, since))
        raise typer.Exit(0)


def _described(statuses: Iterable[str] | None, *parts: str | None) -> str:
    provider, operation, older_than, since = parts
    words = [", ".join(statuses) if statuses else "all statuses"]
    if provider:
        words.append(f"provider {provider}")
    if operation:
        words.append(f"operation {operation}")
    if older_than:
        words.append(f"older than {older_than}")
    if since:
        words.append(f"since {since} ago")
    return "; ".join(words)


__all__ = ["STATS_HELP", "register", "summarise"]
