"""reconcile, resolve, retry: settling what dispatch left open, by evidence or by a person."""

from __future__ import annotations

from typing import Any

import typer

from . import complete
from .common import (
    EXIT_BY_STATUS,
    EXIT_CONFLICT,
    EXIT_NOT_FOUND,
    STATE,
    default_actor,
    emit_json,
    exit_for,
    finish,
    next_step,
    one_line,
)
from .render import console, status_text, term, text

RECONCILE_HELP = """Settle records by querying the provider for the real effect.

With --due: one pass over every record due now (expired dispatch leases first become
DENIED_UNRESOLVED; queryable ones are checked). This is the cron entry; it exits 0
whenever the pass ran, whatever it found. --log json writes the daemon's JSON lines
(one per status move, one warning per failed check, one for the pass) on stderr.

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

RESOLVE_HELP = """Settle unresolved actions by a person's attested verdict.

Give ACTION_IDs (or - to read ids from stdin, one per line; the header line of
`queue -o tsv` is skipped), or select with --provider, --operation, --status
(default DENIED_UNRESOLVED) and --older-than.
Selecting, or reading ids from stdin, first shows what would be settled and asks on
a terminal; --yes skips the question, --dry-run only shows. Every record gets its own
event with the same reason, evidence and actor.

Allowed from DENIED_UNRESOLVED, and from AWAITING_VERIFICATION when the operation
needs manual verification (partial, blind). --applied confirms (confirmed_by
operator:NAME); --not-applied fails it, after which `settled retry` may open a new
attempt. Exit 0 when every verdict was recorded; else the highest of 6 (not found)
and 7 (not allowed now), after recording the others.

\b
Examples:
  settled resolve order-42-mail --applied --reason "customer replied" --evidence "ticket 991"
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --dry-run
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --yes
  settled queue --provider mail -o name | settled resolve - --applied --reason "seen in CRM" --yes
"""

RETRY_HELP = """Open a new attempt (idempotency key ID:N+1) of a FAILED action and dispatch it.

Allowed only from FAILED, i.e. after evidence that the last attempt did not apply.
From DENIED_UNRESOLVED it is refused (exit 7): run `settled reconcile` or
`settled resolve` first. Exit code: the new attempt's status, as dispatch.

\b
Examples:
  settled retry order-42-mail
  settled retry order-42-mail --json | jq .idempotency_key
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


def _reconcile(ids: list[str], due: bool, limit: int | None, as_json: bool, log: str,
               concurrency: int | None = None) -> Any:  # fmt: skip
    """Run the pass; stream what it does (human lines on stdout, or JSON log lines on
    stderr) as each result commits."""
    from ..daemon.log import check_failed, json_lines, transition

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
                jlog(transition(ch, "reconcile"))
            if human:
                bar.line(change_line(ch))
                bar.line(text("  why:  ", one_line(ch.reason)))

        def on_check(ch: Any) -> None:
            bar.advance()
            if jlog is not None and ch.seen == "unknown":
                jlog(check_failed(ch, "reconcile"))
            if human:
                bar.line(text((ch.action_id, "bold"), f"  {ch.from_status}  (still waiting)"))
                bar.line(text("  why:  ", one_line(ch.reason)))

        r = STATE.reconciler(concurrency, on_change=on_change, on_check=on_check)
        report = r.run_due(limit) if due else r.run_ids(ids)
    if jlog is not None:
        from ..daemon.log import pass_line

        jlog(pass_line(report, "reconcile"))
    return report


def _progress(total: int | None, *, enabled: bool) -> Any:
    from .progress import Progress

    return Progress("reconciling", total, enabled=enabled)


def reconcile(
    action_ids: list[str] = typer.Argument(
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
    limit: int = typer.Option(
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
    concurrency: int = typer.Option(
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
        if len(chosen.ids) == 1:
            raise typer.Exit(EXIT_BY_STATUS[STATE.ledger().get(chosen.ids[0]).status])
        raise typer.Exit(0)
    raise typer.Exit(_reconcile_chosen(chosen, sel, limit=limit, log=log, concurrency=concurrency,
                                       dry_run=dry_run, yes=yes, as_json=as_json))  # fmt: skip


def _reconcile_chosen(chosen: Any, sel: Any, **opt: Any) -> int:
    """reconcile with - or selectors: show what would be checked, ask, check."""
    from ..reconcile import why_unchecked
    from .select import confirm, plan, preview

    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a previewed or refused reconcile writes nothing
    targets = plan(ledger, chosen, sel, now, lambda r: why_unchecked(r, now),
                   default=("DENIED_UNRESOLVED",), limit=opt["limit"])  # fmt: skip
    todo = [t.action_id for t in targets if not t.skip]
    missing = any(t.skip == "not found" for t in targets)
    code = EXIT_NOT_FOUND if missing else 0
    if opt["as_json"] and opt["dry_run"]:
        emit_json([_target_json(t, checked=False) for t in targets])
        return code
    asked = todo and not opt["yes"] and not opt["dry_run"]
    if not opt["as_json"] or asked:
        preview(targets, title=f"reconcile: {len(todo)} of {len(targets)} action(s) to check now",
                becomes=_becomes, now=now, err=opt["as_json"])  # fmt: skip
    if opt["dry_run"]:
        console(stderr=True).print(text(f"--dry-run: nothing checked ({len(todo)} would be)"))
        return code
    if asked and not confirm(len(todo), question=f"Check these {len(todo)} action(s) now?",
                             doing="check", asked=not chosen.from_stdin):  # fmt: skip
        console(stderr=True).print(text("nothing checked"))
        return code
    report = _reconcile(todo, False, None, opt["as_json"], opt["log"], opt["concurrency"])
    if opt["as_json"]:
        emit_json({**report.to_json(),
                   "not_checked": [{"action_id": t.action_id, "why": t.skip}
                                   for t in targets if t.skip]})  # fmt: skip
    elif opt["log"] == "text":
        for t in targets:
            if t.skip:
                console(stderr=True).print(text(f"  {t.action_id}: not checked: ", t.skip))
        render_summary(report)
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


# ------------------------------------------------------------------ resolve


def _resolvable(rec: Any, applied: bool, now: Any) -> str:
    """Why a verdict cannot be recorded on this record now, or '' when it can: the
    core's own rule (``policy.resolution``), asked without writing anything."""
    from ..policy import resolution

    if resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None:
        return ""
    if str(rec.status) == "AWAITING_VERIFICATION":
        return "verified automatically; wait or run `settled reconcile`"
    return f"{rec.status}: resolve applies to unresolved actions only"


def _preview(targets: Any, applied: bool, now: Any, *, err: bool = False) -> bool:
    from .select import preview

    verdict = "CONFIRMED" if applied else "FAILED"
    n = sum(1 for t in targets if not t.skip)
    title = f"resolve --{'applied' if applied else 'not-applied'}: {n} of {len(targets)} action(s)"
    return preview(targets, title=title, becomes=lambda _t: verdict, now=now, err=err)


def resolve(
    action_ids: list[str] = typer.Argument(
        None,
        metavar="[ACTION_ID|-]...",
        autocompletion=complete.action_ids,
        help="Actions to settle; - reads ids from stdin.",
        show_default=False,
    ),
    applied: bool = typer.Option(
        None,
        "--applied/--not-applied",
        help="Your verdict: the effect happened, or it did not.",
        show_default=False,
    ),
    reason: str = typer.Option(..., "--reason", metavar="TEXT", help="How you know (required)."),
    evidence: str = typer.Option(
        None, "--evidence", metavar="TEXT", help="A reference: ticket, log line, URL."
    ),
    object_id: str = typer.Option(
        None,
        "--object-id",
        metavar="ID",
        help="The provider's id for the effect (one action only).",
    ),
    by: str = typer.Option(
        None,
        "--by",
        metavar="NAME",
        help="Who attests it (default: the OS user).",
        show_default=False,
    ),
    provider: str = complete.provider_option("Select by provider."),
    operation: str = complete.operation_option("Select by operation."),
    status: str = complete.status_option("Select by status (default DENIED_UNRESOLVED)."),
    older_than: str = complete.older_than_option("Select actions created longer ago than e.g. 1d."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be settled."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before settling a selection."),
    as_json: bool = typer.Option(False, "--json", help="Print the record(s) as JSON."),
) -> None:
    import click

    from ..errors import UsageError
    from ..resolve import resolve as do_resolve
    from .select import Selectors, confirm, plan, read_ids

    verdict = _verdict(applied, reason, by, evidence, object_id)
    chosen = read_ids(action_ids)
    sel = Selectors(provider, operation, status, older_than)
    if not chosen.given and not sel.given:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a refused or previewed resolve writes nothing
    verdict["now"] = now
    single = len(chosen.ids) == 1 and not sel.given and not chosen.from_stdin
    if single and not dry_run:  # one named action: as it always was
        rec = do_resolve(ledger, chosen.ids[0], **verdict)
        if as_json:
            emit_json(rec.to_json())
        else:
            render_record(rec, "resolved")
        raise typer.Exit(0)
    if object_id is not None and not single:
        raise UsageError("--object-id names one provider object: give exactly one ACTION_ID")
    targets = plan(ledger, chosen, sel, now, lambda r: _resolvable(r, applied, now),
                   default=("DENIED_UNRESOLVED",))  # fmt: skip
    todo = [t for t in targets if not t.skip]
    if as_json and dry_run:
        emit_json([_plan_json(t, applied, False) for t in targets])
        raise typer.Exit(0)
    asked = bool(todo) and not yes and not dry_run
    note = _preview(targets, applied, now, err=as_json) if not as_json or asked else False
    if dry_run:
        console(stderr=True).print(text(f"--dry-run: nothing recorded ({len(todo)} would be)"))
        raise typer.Exit(0)
    if asked and not confirm(len(todo), question=f"Record this verdict for {len(todo)} action(s)?",
                             doing="settle", asked=not chosen.from_stdin, note=note):  # fmt: skip
        console(stderr=True).print(text("nothing recorded"))
        raise typer.Exit(0)
    code, done = _record(ledger, targets, verdict, bar=not as_json and len(todo) > 1)
    if as_json:
        emit_json([_plan_json(t, applied, True) for t in done])
    else:
        recorded = sum(1 for t in done if not t.skip)
        console(stderr=True).print(
            text(f"recorded {recorded} verdict(s); {len(done) - recorded} skipped")
        )
        for t in done:
            if t.skip:
                console(stderr=True).print(text(f"  {t.action_id}: ", t.skip))
    raise typer.Exit(code)


def _verdict(
    applied: bool | None, reason: str, by: str | None, evidence: str | None, object_id: str | None
) -> dict[str, Any]:
    """The verdict's own arguments, checked before the ledger is opened."""
    import click

    from ..errors import UsageError

    if applied is None:
        raise click.UsageError("say what happened: --applied or --not-applied")
    if not reason.strip():
        raise UsageError("--reason is required: say how you know")
    actor = default_actor() if by is None else by
    if not actor.strip():
        raise UsageError("--by must not be empty")
    return {"applied": applied, "reason": reason, "by": actor, "evidence": evidence,
            "object_id": object_id}  # fmt: skip


def retry(
    action_id: str = typer.Argument(
        ..., metavar="ACTION_ID", autocompletion=complete.action_ids, help="A FAILED action."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
) -> None:
    from .actions import check_id, render_report

    check_id(action_id)
    d = STATE.dispatcher(actor="retry")
    raise typer.Exit(finish(d.retry(action_id), as_json, render_report))


def register(app: typer.Typer) -> None:
    app.command(help=RECONCILE_HELP)(reconcile)
    app.command(help=RESOLVE_HELP)(resolve)
    app.command(help=RETRY_HELP)(retry)


def _record(ledger: Any, targets: list[Any], verdict: dict[str, Any], *,
            bar: bool) -> tuple[int, list[Any]]:  # fmt: skip
    """Record the verdict for each target not skipped, one at a time (each is its own
    checked move: an action changed meanwhile is reported, not forced). Returns the
    exit code and each target as it ended."""
    from dataclasses import replace

    from ..errors import NotFound, SettledError
    from ..resolve import resolve as do_resolve
    from .progress import Progress

    code = 0
    done: list[Any] = []
    todo = sum(1 for t in targets if not t.skip)
    with Progress("resolving", todo, enabled=bar) as progress:
        for t in targets:
            if t.skip:
                code = max(code, EXIT_NOT_FOUND if t.skip == "not found" else EXIT_CONFLICT)
                done.append(t)
                continue
            try:
                moved = do_resolve(ledger, t.action_id, **verdict)
            except NotFound as exc:
                code = max(code, exit_for(exc))
                done.append(replace(t, record=None, skip=str(exc)))
            except SettledError as exc:  # changed meanwhile: reported with its line
                code = max(code, exit_for(exc))
                done.append(replace(t, skip=str(exc)))
            else:
                done.append(replace(t, record=moved))
            progress.advance()
    return code, done


def _plan_json(t: Any, applied: bool, done: bool) -> dict[str, Any]:
    data: dict[str, Any] = (
        t.record.to_json() if t.record is not None else {"action_id": t.action_id}
    )
    data["resolved"] = done and not t.skip
    data["verdict"] = "applied" if applied else "not_applied"
    data["skipped"] = t.skip or None
    return data
