"""settled log: who did what, from the ledger's own events (the audit)."""

import json
import sys
from typing import Annotated, Any

import typer

from . import options
from .common import STATE

LOG_HELP = """Who did what: the events people wrote, newest first.

Lists verdicts (resolved), refused verdicts (kept as notes with the person's claim),
confirmations (claimed), retries, checks asked for by a person (reconciled,
unresolved) and the checks made before a verdict or retry (named by who asked), with
the person, the surface that vouched for them (api:TOKEN, ui:HOW:SESSION), the time,
the action and what it said. --all adds the machines' events (dispatcher,
reconciler, callbacks).

Filters combine: --by NAME (the person), --token NAME (the API token), --session ID
(a console login), --kind KIND (repeatable: resolved, note, retry, claimed,
reconciled, unresolved, ...), --command resolve|retry|confirm|reconcile (the kinds
that command writes), --action ID, --since / --until (a duration such as 1h, 2d, or
an ISO time; --since is inclusive, --until exclusive), --limit N (default 100).
More rows than --limit: a note on stderr names --before ID, the cursor that gives
the next page.

Output: a table on a terminal, TSV on a pipe, -o json (one array), -o ndjson (one
event a line). It only reads: it never creates or changes a ledger.

\b
Examples:
  settled log --since 1d
  settled log --by alice --command resolve -o json
  settled log --token support --since 2026-12-03T08:00:00Z --until 2026-12-03T17:00:00Z
  settled log --action order-42-mail --all
  settled log --since 1d -o ndjson | jq -r .person
"""

FORMATS = ("table", "wide", "tsv", "json", "ndjson")


def complete_format(incomplete: str) -> list[str]:
    """``-o``'s values, for shell completion."""
    return [f for f in FORMATS if f.startswith(incomplete)]


def register(app: typer.Typer) -> None:
    @app.command("log", help=LOG_HELP)
    def log(
        by: str | None = typer.Option(None, "--by", metavar="NAME", help="The person."),
        token: str | None = typer.Option(None, "--token", metavar="NAME", help="An API token."),
        session: str | None = typer.Option(
            None, "--session", metavar="ID", help="A console login session."
        ),
        kind: list[str] = typer.Option(
            [], "--kind", metavar="KIND", help="Event kind (repeatable)."
        ),
        command: str | None = typer.Option(
            None,
            "--command",
            metavar="resolve|retry|confirm|reconcile",
            help="The kinds that command writes.",
        ),
        action: str | None = typer.Option(None, "--action", metavar="ID", help="One action."),
        since: str | None = typer.Option(
            None, "--since", metavar="D|TIME", help="From: 1h, 2d or an ISO time (inclusive)."
        ),
        until: str | None = typer.Option(
            None, "--until", metavar="D|TIME", help="To: 1h, 2d or an ISO time (exclusive)."
        ),
        before: int | None = typer.Option(
            None, "--before", metavar="ID", min=1, help="The cursor: events older than this id."
        ),
        everyone: bool = typer.Option(False, "--all", help="The machines' events too."),
        limit: int = typer.Option(
            100,
            "--limit",
            metavar="N",
            min=1,
            max=10_000,
            help="Events per page; the note on stderr names the next page's --before.",
        ),
        output: str | None = typer.Option(
            None,
            "-o",
            "--output",
            metavar="table|wide|tsv|json|ndjson",
            autocompletion=complete_format,
            help="Output format (default: table on a terminal, tsv on a pipe).",
            show_default=False,
        ),
        as_json: Annotated[bool, options.json_output("= -o json.")] = False,
        as_ndjson: bool = typer.Option(False, "--ndjson", help="= -o ndjson."),
    ) -> None:
        from ..errors import InvalidInput
        from ..model import EventKind
        from ..storage import LogFilter
        from ..storage.event_log import parse_when, row_of
        from .render import default_format

        if as_json and as_ndjson:
            raise InvalidInput("--json and --ndjson disagree; give one of them")
        if as_ndjson:
            if output is not None and output.strip().lower() != "ndjson":
                raise InvalidInput(f"--ndjson and -o {output} disagree; give one of them")
            fmt = "ndjson"
        else:
            fmt = default_format(output, as_json, FORMATS)
        known = {str(k) for k in EventKind}
        for k in kind:
            if k not in known:
                raise InvalidInput(f"--kind {k!r}: use one of {', '.join(sorted(known))}")
        kinds = list(kind)
        if command is not None:
            from ..storage.event_log import COMMAND_KINDS

            if command not in COMMAND_KINDS:
                raise InvalidInput(f"--command {command!r}: use one of {', '.join(COMMAND_KINDS)}")
            kinds += [k for k in COMMAND_KINDS[command] if k not in kinds]
        ledger = STATE.ledger(read_only=True)
        now = ledger.clock(anchor=False).now()
        f = LogFilter(
            person=by,
            token=token,
            session=session,
            kinds=tuple(kinds),
            since=parse_when(since, now, "--since") if since else None,
            until=parse_when(until, now, "--until") if until else None,
            action_id=action,
            everyone=everyone,
            before=before,
            limit=limit + 1,  # one more says whether there is a next page
        )
        events = ledger.log(f)
        more = len(events) > limit
        rows = [row_of(e) for e in events[:limit]]
        _print(rows, fmt)
        if more:
            from .render import console, text

            console(stderr=True).print(
                text(f"more events: add --before {rows[-1]['id']} for the next page")
            )


def _print(rows: list[dict[str, Any]], fmt: str) -> None:
    from .common import emit_json
    from .render import Col, listing

    if fmt == "json":
        emit_json(rows)
        return
    if fmt == "ndjson":
        for r in rows:
            sys.stdout.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()
        return
    cols = [
        Col("at", lambda r: r["at"]),
        Col("person", lambda r: r["person"] or "-"),
        Col("via", lambda r: r["via"] or "-", give_way=3),
        Col("kind", lambda r: r["kind"]),
        Col("action", lambda r: r["action_id"], give_way=2),
        Col("move", lambda r: f"{r['from_status'] or '-'} → {r['to_status']}", give_way=1),
        Col("said", lambda r: r["said"], flex=True),
        Col("id", lambda r: str(r["id"]), wide=True, right=True),
    ]
    listing(cols, rows, fmt, title="log", empty="no events match")


__all__ = ["register"]
