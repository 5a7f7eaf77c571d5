"""settled stats: the first screen of an incident. Counts by status, provider and
operation, the reasons records are held for (grouped: numbers, ids and times written as
placeholders), how long open records have waited, and the checks failing now; every
figure aggregated by the ledger's SQL in one snapshot (``Ledger.stats``). Read-only."""

from collections.abc import Iterable
from typing import Annotated, Any

import typer

from ..display import span
from ..selection import STATUSES, parse_duration
from ..summary import OPEN, failing_by_provider, summarise
from . import options
from .common import STATE, emit_json
from .render import Col, console, text

STATS_HELP = """Count what the ledger holds: the first screen of an incident.

Counts by status for each operation (or --by provider, status or reason), the ages
(p50, p95, oldest) of the open records (PENDING, IN_FLIGHT, AWAITING_VERIFICATION,
DENIED_UNRESOLVED), the reasons the open records are held for, grouped (a time
becomes a placeholder and every word with a digit in it becomes #, so "budget spent
after 3 check(s)" and "after 5 check(s)" are one group; an HTTP status stays), and
the checks failing now, by provider: an open record whose last check could not be
made (the provider could not be reached or built, or it asked for a pause, 429/503:
an outage, which spends no verification budget and so keeps records out of the
queue; `settled queue --include-paused` lists them).

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

SHORT = {
    "PENDING": "pending",
    "IN_FLIGHT": "in_flight",
    "AWAITING_VERIFICATION": "awaiting",
    "CONFIRMED": "confirmed",
    "FAILED": "failed",
    "DENIED_UNRESOLVED": "unresolved",
}
REASONS_SHOWN = 10  # reason groups on the first screen; --json has them all


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
    failing = "; ".join(
        f"{f['provider']}: {f['failing']}"
        + (
            f" ({'all' if f['paused'] == f['failing'] else f['paused']} paused: it answers 429/503)"
            if f["paused"]
            else ""
        )
        for f in data.get("checks_failing_by_provider", ())
    )
    con.print(
        text(
            f"checks failing now: {data['checks_failing_now']}"
            + (f" ({failing})" if failing else "")
        )
    )
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
        provider: options.OnlyProvider = None,
        operation: options.OnlyOperation = None,
        status: Annotated[
            str | None,
            options.status("Only these statuses (default: all).", "STATUS[,STATUS…]|all"),
        ] = None,
        older_than: Annotated[
            str | None, options.older_than("Only actions created longer ago than e.g. 10m.")
        ] = None,
        since: options.Since = None,
        by: str = typer.Option(
            "operation",
            "--by",
            metavar="provider|operation|status|reason",
            help="What the table's rows are.",
        ),
        as_json: Annotated[bool, options.json_output("Every figure as one JSON object.")] = False,
    ) -> None:
        from ..clock import plus, to_text
        from ..errors import InvalidInput
        from ..selection import parse_statuses
        from ..storage.ledger import Selection
        from ..storage.query import GROUPS
        from .common import check_filters

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
        data["checks_failing_by_provider"] = failing_by_provider(
            ledger.check_failures(), ledger.paused_checks(), provider or None
        )
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
