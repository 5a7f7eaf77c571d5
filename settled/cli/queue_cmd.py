"""settled queue: what nobody can call done yet, filtered and sorted in the ledger's
SQL (``storage.query``), as a table, TSV, JSON or bare ids; ``--watch`` redraws it."""

import sys
from typing import Annotated, Any

import typer

from ..advice import next_step
from ..clock import nap
from ..selection import parse_sort, parse_statuses
from . import completion, options
from .common import STATE, emit_json
from .render import console, default_format, listing, text
from .select import Selectors
from .table_columns import queue_columns, tsv_columns

QUEUE_HELP = """List the actions nobody can call done yet, oldest first, with what settles
each next. By default: every DENIED_UNRESOLVED action, and every settled one that a
later reply contradicts (flagged CONTRADICTED; retry is blocked until it is resolved).

Filters (all in the ledger's own query): --status, --provider, --operation,
--older-than and --since (creation time), --delivery (PENDING, IN_FLIGHT, DELIVERED,
FAILED, UNKNOWN; a comma list), --match TEXT (case-insensitive text in the reason,
the contradiction or the provider's last words; % and _ are plain characters),
--search WORDS (each word, of 3 or more characters, anywhere in the action id, a
params value such as an order number or a recipient, or the reason, in any case:
through the ledger's search index, fast on a million records; every status unless
--status is given), --cause CAUSE (why the record is held, kept from its first
unknown outcome through every later check: http_503 and any http_NNN,
timeout_after_send, reply_lost, conflict, dispatcher_lost, accepted_unseen,
unprovable, blind, awaiting_person, not_seen, check_failing, contradicted; a comma
list); --match also reads the cause, so "HTTP 503" finds http_503.
--sort FIELD (created_at, updated_at, dispatched_at, next_check_at, confirmed_at,
action_id, provider, operation, status, delivery, tier, attempt, checks, age:
youngest first; triage: contradicted first, then what waits for a person's verdict,
then held actions, each oldest first), --reverse flips the order; --limit N keeps the
first N, and --after CURSOR starts after the row a cursor names (each JSON row has
its own `cursor`; the note on stderr gives the next page's).

On a terminal: a table that fits its width (ids are never cut; the why column wraps
at word boundaries; att, tier, operation, age and next give way in that order when
it is too narrow). On a pipe: tab-separated lines with a header (-o tsv;
--no-headers leaves it out), one line per action. -o wide adds absolute times;
-o name prints only the ids, one a line (for `settled show -`, `settled reconcile -`
and `settled resolve -`); --json (or -o json) prints an array. --watch redraws the
table every --interval seconds until Ctrl-C or SIGTERM.

--include-paused also lists every open action whose checks cannot be made now: its
provider asked for a pause (429/503) or cannot be reached. Such actions spend no
verification budget while paused, so without it they stay out of the queue for as
long as the outage lasts.

Exit 0, or 4 with --fail-if-any when any action is listed. An unknown --provider or
--operation is an error (exit 1) listing the real names.

\b
Examples:
  settled queue
  settled queue --status all --provider mail --operation send -o wide
  settled queue --since 1h --sort age --limit 5
  settled queue --status all --search "10927 ana@example.com"
  settled queue --sort triage --limit 50 --after "$CURSOR" --json
  settled queue --match "HTTP 503" --delivery UNKNOWN -o name | settled reconcile - --yes
  settled queue --older-than 10m --fail-if-any >/dev/null || /usr/local/bin/page-oncall
  settled queue --include-paused --fail-if-any >/dev/null || /usr/local/bin/page-oncall
  settled queue -o name | settled resolve - --not-applied --reason "bounced" --yes
  settled queue --status all --watch --interval 5
"""

MAX_WATCH_INTERVAL = 3600.0


def register(app: typer.Typer) -> None:
    @app.command(help=QUEUE_HELP)
    def queue(
        status: Annotated[
            str | None,
            options.status(
                "Statuses to list (default: DENIED_UNRESOLVED, and contradicted ones).",
                "STATUS[,STATUS…]|all",
            ),
        ] = None,
        provider: options.OnlyProvider = None,
        operation: options.OnlyOperation = None,
        older_than: Annotated[
            str | None,
            options.older_than("Only actions created longer ago than e.g. 90s, 10m, 2h, 1d."),
        ] = None,
        since: options.Since = None,
        match: options.Match = None,
        search: options.Search = None,
        cause: options.Cause = None,
        delivery: options.Delivery = None,
        sort: str = typer.Option(
            "created_at", "--sort", metavar="FIELD", help="Sort by this record field (or age)."
        ),
        reverse: bool = typer.Option(False, "--reverse", help="Reverse the order."),
        fail_if_any: bool = typer.Option(
            False, "--fail-if-any", help="Exit 4 when any action is listed (for monitors)."
        ),
        include_paused: bool = typer.Option(
            False,
            "--include-paused",
            help="Also list open actions whose checks cannot be made now (the provider "
            "asked for a pause, 429/503, or cannot be reached).",
        ),
        limit: int = typer.Option(
            1000,
            "--limit",
            metavar="N",
            min=1,
            help="At most N rows (a note on stderr says when more exist).",
        ),
        after: str | None = typer.Option(
            None,
            "--after",
            metavar="CURSOR",
            help="Only the rows after this cursor (a JSON row's `cursor`): the next page.",
        ),
        output: str | None = typer.Option(
            None,
            "-o",
            "--output",
            metavar="table|wide|tsv|json|name",
            autocompletion=completion.formats,
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
        as_json: Annotated[bool, options.json_output("Rows as a JSON array (= -o json).")] = False,
    ) -> None:
        from ..errors import InvalidInput
        from .render import is_tty

        fmt = default_format(output, as_json)
        if no_headers and fmt not in ("tsv", "name"):
            raise InvalidInput(
                f"--no-headers applies to -o tsv (and -o name, which has none), not {fmt}"
            )
        # A search looks for a record a person knows of, whatever became of it: every
        # status, unless --status narrows it.
        default = "all" if search is not None else "DENIED_UNRESOLVED"
        selectors = Selectors(
            provider, operation, status, older_than, since, match, search, cause, delivery
        ).check()
        opts = {
            "selectors": selectors,
            "statuses": parse_statuses(status or default),
            "contradicted": status is None and search is None,
            "failing": include_paused,
            "sort": parse_sort(sort),
            "reverse": reverse,
            "limit": min(limit, 2**63 - 1),  # SQLite's largest integer; more rows cannot exist
            "headers": not no_headers,
            "after": after,
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
    """The selectors' ``Selection`` (``select.selection``, as every bulk verb builds
    it), with what only a listing adds: the contradicted and paused records, the
    order and the page."""
    from dataclasses import replace

    from ..errors import InvalidInput
    from ..storage.query import read_cursor
    from .select import selection

    sel = replace(
        selection(ledger, opts["selectors"], now, opts["statuses"]),
        also_contradicted=opts["contradicted"],
        also_failing=opts["failing"],
        sort=opts["sort"],
        reverse=opts["reverse"],
    )
    if opts.get("after") is None:
        return sel
    try:
        return replace(sel, after=read_cursor(sel, opts["after"]))
    except ValueError as exc:
        raise InvalidInput(f"--after: {exc}") from None


def _draw(fmt: str, opts: dict[str, Any]) -> int:
    """One look at the queue, printed; how many rows it showed."""
    from dataclasses import replace

    from ..storage.query import cursor

    ledger = STATE.ledger(read_only=True)
    now = ledger.clock(anchor=False).now()
    sel = _selection(ledger, now, opts)
    limit = opts["limit"]
    # one row more than shown: whether a next page exists, without counting
    rows = ledger.records(replace(sel, limit=min(limit + 1, 2**63 - 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    paged = sel.after is not None
    total = ledger.count(sel) if more or paged else len(rows)
    statuses = opts["statuses"]
    what = ", ".join(statuses) + (" + contradicted" if opts["contradicted"] else "")
    what += " + checks failing" if opts["failing"] else ""
    if fmt == "json":
        from ..cause import to_json

        emit_json(
            [
                {**r.to_json(), **to_json(r), "next": next_step(r), "cursor": cursor(sel, r)}
                for r in rows
            ]
        )
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
    if more:
        order = "oldest" if (opts["sort"], opts["reverse"]) == ("created_at", False) else "first"
        by = (
            ""
            if order == "oldest"
            else f" (by {opts['sort']}{', reversed' if opts['reverse'] else ''})"
        )
        if paged:  # the cursor's page: the next rows in this order
            order = "next"
        console(stderr=True).print(
            text(
                f"settled: showing the {order} {len(rows)} of {total}{by}; raise --limit to see "
                f"the rest, or page on with --after {cursor(sel, rows[-1])}"
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
