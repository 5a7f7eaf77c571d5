"""settled queue: what nobody can call done yet, filtered and sorted in the ledger's
SQL (``storage.query``), as a table, TSV, JSON or bare ids; ``--watch`` redraws it."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ..clock import nap
from . import complete
from .common import STATE, emit_json, next_step, parse_duration
from .listing import parse_statuses, queue_columns, tsv_columns
from .render import console, default_format, listing, text

QUEUE_HELP = """List the actions nobody can call done yet, oldest first, with what settles
each next. By default: every DENIED_UNRESOLVED action, and every settled one that a
later reply contradicts (flagged CONTRADICTED; retry is blocked until it is resolved).

Filters (all in the ledger's own query): --status, --provider, --operation,
--older-than and --since (creation time), --delivery (PENDING, IN_FLIGHT, DELIVERED,
FAILED, UNKNOWN; a comma list), --match TEXT (case-insensitive text in the reason,
the contradiction or the provider's last words; % and _ are plain characters).
--sort FIELD (created_at, updated_at, dispatched_at, next_check_at, confirmed_at,
action_id, provider, operation, status, delivery, tier, attempt, checks, age:
youngest first), --reverse flips the order; --limit N keeps the first N.

On a terminal: a table that fits its width (ids are never cut; the why column wraps
at word boundaries; att, tier, operation, age and next give way in that order when
it is too narrow). On a pipe: tab-separated lines with a header (-o tsv;
--no-headers leaves it out), one line per action. -o wide adds absolute times;
-o name prints only the ids, one a line (for `settled show -`, `settled reconcile -`
and `settled resolve -`); --json (or -o json) prints an array. --watch redraws the
table every --interval seconds until Ctrl-C or SIGTERM.

Exit 0, or 4 with --fail-if-any when any action is listed. An unknown --provider or
--operation is an error (exit 1) listing the real names.

\b
Examples:
  settled queue
  settled queue --status all --provider mail --operation send -o wide
  settled queue --since 1h --sort age --limit 5
  settled queue --match "HTTP 503" --delivery UNKNOWN -o name | settled reconcile - --yes
  settled queue --older-than 10m --fail-if-any >/dev/null || /usr/local/bin/page-oncall
  settled queue -o name | settled resolve - --not-applied --reason "bounced" --yes
  settled queue --status all --watch --interval 5
"""

DELIVERIES = ("PENDING", "IN_FLIGHT", "DELIVERED", "FAILED", "UNKNOWN")
MAX_MATCH = 1000  # characters of --match: more than any reason holds
MAX_WATCH_INTERVAL = 3600.0


def parse_deliveries(value: str) -> list[str]:
    from ..errors import InvalidInput
    from .render import term

    wanted = [v.strip().upper() for v in value.split(",") if v.strip()]
    bad = [v for v in wanted if v not in DELIVERIES]
    if bad or not wanted:
        raise InvalidInput(
            f"--delivery {term(value, 100)}: unknown delivery; use one of {', '.join(DELIVERIES)}"
        )
    return list(dict.fromkeys(wanted))


def parse_sort(value: str) -> str:
    from ..errors import InvalidInput
    from ..storage.query import SORT_FIELDS
    from .render import term

    field = value.strip().lower().replace("-", "_")
    if field not in SORT_FIELDS:
        raise InvalidInput(f"--sort {term(value, 100)}: use one of {', '.join(SORT_FIELDS)}")
    return field


def parse_match(value: str) -> str:
    from ..errors import InvalidInput

    if not value.strip():
        raise InvalidInput("--match needs some text to look for")
    if len(value) > MAX_MATCH:
        raise InvalidInput(f"--match is longer than {MAX_MATCH} characters")
    return value


def register(app: typer.Typer) -> None:
    @app.command(help=QUEUE_HELP)
    def queue(
        status: str = complete.status_option(
            "Statuses to list (default: DENIED_UNRESOLVED, and contradicted ones).",
            "STATUS[,STATUS…]|all",
        ),
        provider: str = complete.provider_option("Only this provider."),
        operation: str = complete.operation_option("Only this operation."),
        older_than: str = complete.older_than_option(
            "Only actions created longer ago than e.g. 90s, 10m, 2h, 1d."
        ),
        since: str | None = typer.Option(
            None, "--since", metavar="DURATION", help="Only actions created within e.g. 1h."
        ),
        match: str | None = typer.Option(
            None,
            "--match",
            metavar="TEXT",
            help="Only actions whose reason or provider reply holds TEXT (any case).",
        ),
        delivery: str | None = typer.Option(
            None,
            "--delivery",
            metavar="DELIVERY[,…]",
            help="Only these deliveries: PENDING, IN_FLIGHT, DELIVERED, FAILED, UNKNOWN.",
        ),
        sort: str = typer.Option(
            "created_at", "--sort", metavar="FIELD", help="Sort by this record field (or age)."
        ),
        reverse: bool = typer.Option(False, "--reverse", help="Reverse the order."),
        fail_if_any: bool = typer.Option(
            False, "--fail-if-any", help="Exit 4 when any action is listed (for monitors)."
        ),
        limit: int = typer.Option(
            1000,
            "--limit",
            metavar="N",
            min=1,
            help="At most N rows (a note on stderr says when more exist).",
        ),
        output: str | None = typer.Option(
            None,
            "-o",
            "--output",
            metavar="table|wide|tsv|json|name",
            autocompletion=complete.formats,
            help="Output format (default: table on a terminal, tsv on a pipe).",
            show_default=False,
        ),
        no_headers: bool = typer.Option(False, "--no-headers", help="TSV without its header line."),
        watch: bool = typer.Option(
            False, "--watch", help="Redraw the table every --interval s until Ctrl-C."
        ),
        interval: float = typer.Option(
            2.0, "--interval", metavar="S", help="With --watch: seconds between redraws."
        ),
        as_json: bool = typer.Option(False, "--json", help="Rows as a JSON array (= -o json)."),
    ) -> None:
        from ..errors import InvalidInput
        from .render import is_tty

        fmt = default_format(output, as_json)
        if no_headers and fmt not in ("tsv", "name"):
            raise InvalidInput(
                f"--no-headers applies to -o tsv (and -o name, which has none), not {fmt}"
            )
        opts = {
            "statuses": parse_statuses(status or "DENIED_UNRESOLVED"),
            "contradicted": status is None,
            "provider": provider,
            "operation": operation,
            "older_than": parse_duration(older_than) if older_than else None,
            "since": parse_duration(since) if since else None,
            "match": parse_match(match) if match is not None else None,
            "delivery": parse_deliveries(delivery) if delivery is not None else None,
            "sort": parse_sort(sort),
            "reverse": reverse,
            "limit": min(limit, 2**63 - 1),  # SQLite's largest integer; more rows cannot exist
            "headers": not no_headers,
        }
        if watch:
            if fail_if_any:
                raise InvalidInput("--watch runs until stopped; --fail-if-any is for one look")
            if fmt not in ("table", "wide") or not is_tty():
                raise InvalidInput("--watch redraws a table on a terminal; use -o table or -o wide")
            if not 0 < interval <= MAX_WATCH_INTERVAL:
                raise InvalidInput(
                    f"--interval {interval!r}: must be > 0 and <= {MAX_WATCH_INTERVAL:g} s"
                )
            raise typer.Exit(_watch(fmt, opts, interval))
        shown = _draw(fmt, opts)
        sys.stdout.flush()
        raise typer.Exit(4 if (fail_if_any and shown) else 0)


def _selection(ledger: Any, now: Any, opts: dict[str, Any]) -> Any:
    from ..clock import plus, to_text
    from ..storage.base import Selection
    from .common import check_filters

    check_filters(ledger, opts["provider"], opts["operation"])

    def ago(seconds: float | None) -> str | None:
        return None if seconds is None else to_text(plus(now, -seconds))

    return Selection(
        statuses=opts["statuses"],
        provider=opts["provider"],
        operation=opts["operation"],
        created_before=ago(opts["older_than"]),
        created_after=ago(opts["since"]),
        also_contradicted=opts["contradicted"],
        delivery=opts["delivery"],
        match=opts["match"],
        sort=opts["sort"],
        reverse=opts["reverse"],
    )


def _draw(fmt: str, opts: dict[str, Any]) -> int:
    """One look at the queue, printed; how many rows it showed."""
    from dataclasses import replace

    ledger = STATE.ledger(read_only=True)
    now = ledger.clock(anchor=False).now()
    sel = _selection(ledger, now, opts)
    limit = opts["limit"]
    rows = ledger.records(replace(sel, limit=limit))
    total = ledger.count(sel) if len(rows) >= limit else len(rows)
    statuses = opts["statuses"]
    what = ", ".join(statuses) + (" + contradicted" if opts["contradicted"] else "")
    if fmt == "json":
        emit_json([{**r.to_json(), "next": next_step(r)} for r in rows])
    elif fmt in ("tsv", "name"):
        listing(tsv_columns(), rows, fmt, headers=opts["headers"])
    else:
        listing(
            queue_columns(now, statuses),
            rows,
            fmt,
            title=f"queue: {what} ({total})",
            empty=f"queue ({what}): empty",
        )
    if total > len(rows):
        order = "oldest" if (opts["sort"], opts["reverse"]) == ("created_at", False) else "first"
        by = (
            ""
            if order == "oldest"
            else f" (by {opts['sort']}{', reversed' if opts['reverse'] else ''})"
        )
        console(stderr=True).print(
            text(
                f"settled: showing the {order} {len(rows)} of {total}{by}; raise --limit to see the rest"
            )
        )
    return len(rows)


def _watch(fmt: str, opts: dict[str, Any], interval: float) -> int:
    """Redraw until Ctrl-C or SIGTERM (both end it with exit 0): home, clear, draw."""
    from ..clock import to_text, utcnow
    from . import signals

    signals.as_interrupt()
    out = sys.stdout
    try:
        while True:
            out.write("\x1b[H\x1b[2J")  # the cursor home, the screen cleared
            console().print(
                text(
                    f"every {interval:g}s: settled queue  {to_text(utcnow())[:19]}Z"
                    "  (Ctrl-C to stop)"
                )
            )
            _draw(fmt, opts)
            out.flush()
            nap(interval)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (signals.Terminated): the way to stop
        out.write("\n")
        out.flush()
        return 0
