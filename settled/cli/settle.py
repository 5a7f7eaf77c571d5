"""reconcile: settling what dispatch left open, by evidence (resolve and retry: verdicts.py)."""

from __future__ import annotations

from typing import Any

import typer

from . import complete
from .common import (
    EXIT_BY_STATUS,
    EXIT_NOT_FOUND,
    STATE,
    emit_json,
    next_step,
    one_line,
)
from .render import console, status_text, term, text

RECONCILE_HELP = """Settle records by querying the provider for the real effect.

With --due: one pass over every record due now (expired dispatch leases first become
DENIED_UNRESOLVED; queryable ones are checked). This is the cron entry; it exits 0
whenever the pass ran, whatever it found, except 1 (one line on stderr, after the
pass ran for the others) when a configured provider cannot even be built here, e.g. a
${VAR} missing from cron's environment. --log json writes the daemon's JSON lines
(one per status move, one check_failed warning per check that could not be made, one
for the pass) on stderr.

A record is given up (DENIED_UNRESOLVED) only once its verification deadline has
passed and verify.min_checks checks were made, each verify.interval apart: time with
no reconciler running spends nothing, and checks that could not reach or even build
the provider count, so a broken verifier reaches the queue.

With ACTION_IDs: check those records now, whatever their schedule. With one id the
exit code is that record's status afterwards (0 CONFIRMED, 3 pending, 4 unresolved,
5 FAILED); with several, 0 when the pass ran. An unknown id exits 6 before anything
is checked. Results are printed as they come; on a terminal a progress bar runs on
stderr.

With - (ids on stdin, one a line; the header of `queue -o tsv` is skipped) or
selectors (--provider, --operation, --status, default DENIED_UNRESOLVED, and
--older-than): first shows what it would check and asks on a terminal; --yes skips
the question, --dry-run only shows. Exit 0 when the checks ran (6 when a named id was
not found; the others are checked). --concurrency runs the checks from N threads, as
a pass does.

\b
Examples:
  settled reconcile --due
  settled --db /srv/app/settled.db --config /etc/settled/settled.toml reconcile --due --log json
  settled reconcile order-42-mail
  settled reconcile --provider mail --older-than 10m --dry-run
  settled reconcile --provider mail --status all --concurrency 16 --yes
  settled queue --match "HTTP 503" -o name | settled reconcile - --yes
  settled reconcile --due --limit 500 --json | jq .counts
"""


def change_line(ch: Any) -> Any:
    """One status move (or a check that moved nothing) as it is printed."""
    head = text((ch.action_id, "bold"), f"  {ch.from_status} → ") + status_text(ch.to_status)
    head.append(term(f"  ({ch.kind})"))
    return head


def render_summary(report: Any) -> None:
    for ch in report.skipped:
        if ch.kind != "waiting":
            console().print(text(f"{ch.action_id}  {ch.from_status}  ({ch.kind})"))
            console().print(text("  why:  ", one_line(ch.reason)))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts().items())) or "no status change"
    waiting = len(report.waiting)
    tail = f"; {waiting} still waiting" if waiting else ""
    stopped = " (stopped early; the rest was handed back)" if report.stopped else ""
    console(stderr=True).print(text(f"examined {report.examined}: {counts}{tail}{stopped}"))


def render_record(rec: Any, headline: str) -> None:
    con = console()
    con.print(
        text((rec.action_id, "bold"), f"  {rec.provider}.{rec.operation} ({rec.tier})  ")
        + status_text(rec.status)
        + text(f"  {headline}")
    )
    if rec.reason:
        con.print(text("  why:  ", one_line(rec.reason)))
    if rec.confirmed_by:
        con.print(text("  confirmed by: ", rec.confirmed_by))
    con.print(text("  next: ", next_step(rec)))


def _reconcile(
    ids: list[str],
    due: bool,
    limit: int | None,
    as_json: bool,
    log: str,
    concurrency: int | None = None,
) -> Any:
    """Run the pass; stream what it does (human lines on stdout, or JSON log lines on
    stderr) as each result commits."""
    from ..daemon.log import check_failed, failed, json_lines, transition

    jlog = json_lines() if log == "json" else None
    human = not as_json and jlog is None
    if due:
        total = None if limit is None else limit
    else:
        total = len(ids)
    with _progress(total, enabled=not as_json) as bar:

        def on_change(ch: Any) -> None:
            bar.advance()
            if jlog is not None:
                if failed(ch):  # the attempt that gave it up could not check either
                    jlog(check_failed(ch, "reconcile"))
                jlog(transition(ch, "reconcile"))
            if human:
                bar.line(change_line(ch))
                if failed(ch):
                    bar.line(_check_failed_line(ch))
                bar.line(text("  why:  ", one_line(ch.reason)))

        def on_check(ch: Any) -> None:
            bar.advance()
            if jlog is not None and failed(ch):
                jlog(check_failed(ch, "reconcile"))
            if human:
                if failed(ch):
                    bar.line(_check_failed_line(ch))
                else:
                    bar.line(text((ch.action_id, "bold"), f"  {ch.from_status}  (still waiting)"))
                bar.line(text("  why:  ", one_line(ch.reason)))

        r = STATE.reconciler(concurrency, on_change=on_change, on_check=on_check)
        report = r.run_due(limit) if due else r.run_ids(ids)
    if jlog is not None:
        from ..daemon.log import pass_line

        jlog(pass_line(report, "reconcile"))
    return report


def _check_failed_line(ch: Any) -> Any:
    from ..daemon.log import error_class

    return text((ch.action_id, "bold"), f"  {ch.from_status}  (check_failed: {error_class(ch)})")


def _unusable(report: Any, log: str) -> bool:
    """Say, in one line on stderr, which configured providers cannot be built at all;
    whether there were any."""
    if not report.unusable:
        return False
    if log == "json":
        from ..daemon.log import json_lines, unusable

        json_lines()(unusable(report.unusable, "reconcile"))
    else:
        import sys

        what = "; ".join(report.unusable[p] for p in sorted(report.unusable))
        sys.stderr.write(
            f"settled: error: {term(one_line(what), 2000)} (their records' checks count as "
            "failed attempts)\n"
        )
    return True


def _progress(total: int | None, *, enabled: bool) -> Any:
    from .progress import Progress

    return Progress("reconciling", total, enabled=enabled)


def reconcile(
    action_ids: list[str] | None = typer.Argument(
        None,
        metavar="[ACTION_ID|-]...",
        autocompletion=complete.action_ids,
        help="Records to check now; - reads ids from stdin.",
        show_default=False,
    ),
    due: bool = typer.Option(False, "--due", help="One pass over everything due (cron)."),
    provider: str = complete.provider_option("Select by provider."),
    operation: str = complete.operation_option("Select by operation."),
    status: str = complete.status_option("Select by status (default DENIED_UNRESOLVED)."),
    older_than: str = complete.older_than_option("Select actions created longer ago than e.g. 1d."),
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=1,
        metavar="N",
        help="With --due or selectors: examine at most N records.",
        show_default=False,
    ),
    log: str = typer.Option(
        "text",
        "--log",
        metavar="text|json",
        help="text: lines for people; json: the daemon's JSON lines on stderr.",
    ),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        metavar="N",
        min=1,
        max=100,
        show_default=False,
        help="Queries in flight at once (default [reconcile] concurrency, else each provider's).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be checked."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before checking a selection."),
    as_json: bool = typer.Option(False, "--json", help="Print the pass report as JSON."),
) -> None:
    import click

    from .select import Selectors, read_ids

    if log not in ("text", "json"):
        raise click.UsageError(f"--log {log!r}: use text or json")
    chosen = read_ids(action_ids)
    sel = Selectors(provider, operation, status, older_than)
    if due and (chosen.given or sel.given):
        raise click.UsageError(
            "--due is a pass over everything due: give no ACTION_IDs or selectors with it"
        )
    if due and (dry_run or yes):
        raise click.UsageError(
            "--dry-run and --yes apply to ACTION_IDs, - and selectors, not --due"
        )
    if not due and not chosen.given and not sel.given:
        raise click.UsageError(
            "give ACTION_IDs to check, - (ids on stdin), selectors such as --provider, "
            "or --due for a pass over what is due"
        )
    if limit is not None and not (due or sel.given):
        raise click.UsageError("--limit applies to --due and to selectors")
    if due or (chosen.ids and not chosen.from_stdin and not sel.given and not dry_run):
        report = _reconcile(chosen.ids, due, limit, as_json, log, concurrency)  # as it always was
        if as_json:
            emit_json(report.to_json())
        elif log == "text":
            render_summary(report)
        broken = _unusable(report, log)
        if len(chosen.ids) == 1:
            raise typer.Exit(EXIT_BY_STATUS[STATE.ledger().get(chosen.ids[0]).status])
        raise typer.Exit(1 if broken and due else 0)
    raise typer.Exit(
        _reconcile_chosen(
            chosen,
            sel,
            limit=limit,
            log=log,
            concurrency=concurrency,
            dry_run=dry_run,
            yes=yes,
            as_json=as_json,
        )
    )


def _reconcile_chosen(chosen: Any, sel: Any, **opt: Any) -> int:
    """reconcile with - or selectors: show what would be checked, ask, check."""
    from ..reconcile import why_unchecked
    from .select import confirm, plan, preview

    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a previewed or refused reconcile writes nothing
    targets = plan(
        ledger,
        chosen,
        sel,
        now,
        lambda r: why_unchecked(r, now),
        default=("DENIED_UNRESOLVED",),
        limit=opt["limit"],
    )
    todo = [t.action_id for t in targets if not t.skip]
    missing = any(t.skip == "not found" for t in targets)
    code = EXIT_NOT_FOUND if missing else 0
    if opt["as_json"] and opt["dry_run"]:
        emit_json([_target_json(t, checked=False) for t in targets])
        return code
    asked = todo and not opt["yes"] and not opt["dry_run"]
    if not opt["as_json"] or asked:
        preview(
            targets,
            title=f"reconcile: {len(todo)} of {len(targets)} action(s) to check now",
            becomes=_becomes,
            now=now,
            err=opt["as_json"],
        )
    if opt["dry_run"]:
        console(stderr=True).print(text(f"--dry-run: nothing checked ({len(todo)} would be)"))
        return code
    if asked and not confirm(
        len(todo),
        question=f"Check these {len(todo)} action(s) now?",
        doing="check",
        asked=not chosen.from_stdin,
    ):
        console(stderr=True).print(text("nothing checked"))
        return code
    report = _reconcile(todo, False, None, opt["as_json"], opt["log"], opt["concurrency"])
    if opt["as_json"]:
        emit_json(
            {
                **report.to_json(),
                "not_checked": [
                    {"action_id": t.action_id, "why": t.skip} for t in targets if t.skip
                ],
            }
        )
    elif opt["log"] == "text":
        for t in targets:
            if t.skip:
                console(stderr=True).print(text(f"  {t.action_id}: not checked: ", t.skip))
        render_summary(report)
    _unusable(report, opt["log"])
    return code


def _becomes(t: Any) -> str:
    if str(t.record.status) == "IN_FLIGHT":
        return "lease lapsed: DENIED_UNRESOLVED, then checked"
    return "checked now"


def _target_json(t: Any, *, checked: bool) -> dict[str, Any]:
    data: dict[str, Any] = (
        t.record.to_json() if t.record is not None else {"action_id": t.action_id}
    )
    data["checked"] = checked and not t.skip
    data["skipped"] = t.skip or None
    return data


def register(app: typer.Typer) -> None:
    from . import verdicts

    app.command(help=RECONCILE_HELP)(reconcile)
    verdicts.register(app)
