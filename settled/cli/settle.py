"""reconcile, resolve, retry: settling what dispatch left open, by evidence or by a person."""

from __future__ import annotations

import sys
from typing import Any

import typer

from . import complete
from .common import (
    EXIT_BY_STATUS,
    STATE,
    default_actor,
    emit_json,
    exit_for,
    finish,
    next_step,
    one_line,
)
from .render import HIDDEN_NOTE, Col, ago, console, hidden, is_tty, status_text, term, text

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

\b
Examples:
  settled reconcile --due
  settled --db /srv/app/settled.db --config /etc/settled/settled.toml reconcile --due --log json
  settled reconcile order-42-mail
  settled reconcile --due --limit 500 --json | jq .counts
"""

RESOLVE_HELP = """Settle unresolved actions by a person's attested verdict.

Give ACTION_IDs (or - to read ids from stdin, one per line), or select with
--provider, --operation, --status (default DENIED_UNRESOLVED) and --older-than.
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
  settled queue -o tsv | tail -n +2 | cut -f1 | settled resolve - --applied --reason "seen in CRM" --yes
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


# ------------------------------------------------------------------ resolve


def _read_ids(ids: list[str]) -> tuple[list[str], bool]:
    """The ids given, with '-' replaced by the lines of stdin; and whether stdin
    was read."""
    from .actions import check_id

    out: list[str] = []
    from_stdin = False
    for a in ids:
        if a == "-":
            if from_stdin:
                continue
            from_stdin = True
            data = sys.stdin.read(16 * 1024 * 1024)
            out += [line.strip() for line in data.splitlines() if line.strip()]
        else:
            out.append(a)
    for a in out:
        check_id(a)
    return list(dict.fromkeys(out)), from_stdin


def _resolvable(rec: Any, applied: bool, now: Any) -> str:
    """Why a verdict cannot be recorded on this record now, or '' when it can: the
    core's own rule (``policy.resolution``), asked without writing anything."""
    from ..policy import resolution

    if resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None:
        return ""
    if str(rec.status) == "AWAITING_VERIFICATION":
        return "verified automatically; wait or run `settled reconcile`"
    return f"{rec.status}: resolve applies to unresolved actions only"


def _preview(plan: list[tuple[str, Any, str]], applied: bool, now: Any) -> bool:
    """Show what would be settled; whether it wrote out hidden characters."""
    from .render import listing

    verdict = "CONFIRMED" if applied else "FAILED"
    cols = [
        Col("action", lambda p: p[0]),
        Col("status", lambda p: str(p[1].status) if p[1] else "-", give_way=3),
        Col("age", lambda p: ago(p[1].created_at, now) if p[1] else "-", give_way=1, right=True),
        Col(
            "operation", lambda p: f"{p[1].provider}/{p[1].operation}" if p[1] else "-", give_way=2
        ),
        Col("becomes", lambda p: verdict if not p[2] else "(skipped)"),
        Col("why", lambda p: p[2] or (one_line(p[1].reason or "") if p[1] else ""), flex=True),
    ]
    n = sum(1 for p in plan if not p[2])
    title = f"resolve --{'applied' if applied else 'not-applied'}: {n} of {len(plan)} action(s)"
    note = _has_hidden(cols, plan)
    fmt = "table" if is_tty() else "tsv"
    if note:
        title += f" {HIDDEN_NOTE}"
        if fmt == "tsv":  # lines without a title: the note goes with the messages
            console(stderr=True).print(text(f"settled: the preview {HIDDEN_NOTE[1:-1]}"))
    listing(cols, plan, fmt, title=title)
    return note


def _has_hidden(cols: list[Col], plan: Plan) -> bool:
    """Whether any value the preview shows holds a character it writes out escaped."""
    return any(hidden(c.cell(p)) for p in plan for c in cols)


def _ask(n: int, note: bool = False) -> bool:
    import click

    question = f"Record this verdict for {n} action(s)?"
    if note:  # the person answers about what the preview showed: say what it escaped
        question += f" {HIDDEN_NOTE}"
    return click.confirm(question, default=False, err=True)


def reconcile(
    action_ids: list[str] = typer.Argument(
        None,
        metavar="[ACTION_ID]...",
        autocompletion=complete.action_ids,
        help="Records to check now.",
        show_default=False,
    ),
    due: bool = typer.Option(False, "--due", help="One pass over everything due (cron)."),
    limit: int = typer.Option(
        None,
        "--limit",
        min=1,
        metavar="N",
        help="With --due: examine at most N records.",
        show_default=False,
    ),
    log: str = typer.Option(
        "text",
        "--log",
        metavar="text|json",
        help="text: lines for people; json: the daemon's JSON lines on stderr.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the pass report as JSON."),
    concurrency: int = typer.Option(
        None,
        "--concurrency",
        metavar="N",
        min=1,
        max=100,
        show_default=False,
        help="With --due: queries in flight at once (default [reconcile] concurrency, "
        "else each provider's).",
    ),
) -> None:
    import click

    from .actions import check_id

    ids = [check_id(a) for a in action_ids or []]
    if ids and due:
        raise click.UsageError("give ACTION_IDs or --due, not both")
    if not ids and not due:
        raise click.UsageError("give ACTION_IDs to check, or --due for a pass over what is due")
    if limit is not None and not due:
        raise click.UsageError("--limit applies to --due only")
    if concurrency is not None and not due:
        raise click.UsageError("--concurrency applies to --due only")
    if log not in ("text", "json"):
        raise click.UsageError(f"--log {log!r}: use text or json")
    report = _reconcile(ids, due, limit, as_json, log, concurrency)
    if as_json:
        emit_json(report.to_json())
    elif log == "text":
        render_summary(report)
    if len(ids) == 1:
        raise typer.Exit(EXIT_BY_STATUS[STATE.ledger().get(ids[0]).status])
    raise typer.Exit(0)


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

    from ..clock import plus, to_text
    from ..errors import UsageError
    from ..resolve import resolve as do_resolve
    from .common import check_filters
    from .listing import parse_statuses

    verdict = _verdict(applied, reason, by, evidence, object_id)
    ids, from_stdin = _read_ids(action_ids or [])
    selecting = any(v is not None for v in (provider, operation, status, older_than))
    if not ids and not selecting and not from_stdin:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a refused or previewed resolve writes nothing
    verdict["now"] = now
    single = len(ids) == 1 and not selecting and not from_stdin
    if single and not dry_run:  # one named action: as it always was
        rec = do_resolve(ledger, ids[0], **verdict)
        if as_json:
            emit_json(rec.to_json())
        else:
            render_record(rec, "resolved")
        raise typer.Exit(0)
    if object_id is not None and not single:
        raise UsageError("--object-id names one provider object: give exactly one ACTION_ID")
    check_filters(ledger, provider, operation)
    statuses = parse_statuses(status) if status else ["DENIED_UNRESOLVED"]
    before = to_text(plus(now, -_duration(older_than))) if older_than else None
    plan = _plan(ledger, ids, selecting, applied, now, statuses=statuses, provider=provider,
                 operation=operation, before=before)  # fmt: skip
    todo = [p for p in plan if not p[2]]
    if as_json and dry_run:
        emit_json([_plan_json(p, applied, False) for p in plan])
        raise typer.Exit(0)
    note = _preview(plan, applied, now) if not as_json else False
    if dry_run:
        console(stderr=True).print(text(f"--dry-run: nothing recorded ({len(todo)} would be)"))
        raise typer.Exit(0)
    if todo and not yes and not _confirmed(len(todo), asked=not from_stdin, note=note):
        console(stderr=True).print(text("nothing recorded"))
        raise typer.Exit(0)
    code, done = _record(ledger, plan, verdict, bar=not as_json and len(todo) > 1)
    if as_json:
        emit_json([_plan_json(p, applied, True) for p in done])
    else:
        recorded = sum(1 for p in done if not p[2])
        console(stderr=True).print(
            text(f"recorded {recorded} verdict(s); {len(done) - recorded} skipped")
        )
        for a, _r, why in done:
            if why:
                console(stderr=True).print(text(f"  {a}: ", why))
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


def _confirmed(n: int, *, asked: bool, note: bool = False) -> bool:
    """A selection is settled only after a yes on a terminal (or --yes); with ids on
    stdin or no terminal there is nobody to ask, so it is refused, not assumed."""
    from ..errors import UsageError

    if not asked or not is_tty(sys.stdin):
        raise UsageError(
            f"refusing to settle {n} action(s) without --yes: there is no terminal "
            "to ask (review with --dry-run, then add --yes)"
        )
    return _ask(n, note)


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


Plan = list[tuple[str, Any, str]]  # (action id, record or None, why it is skipped or "")


def _plan(
    ledger: Any,
    ids: list[str],
    selecting: bool,
    applied: bool,
    now: Any,
    **filters: Any,
) -> Plan:
    """Each named or selected action with the reason it would be skipped ("" when the
    verdict can be recorded). Named ids that the filters do not select are skipped."""
    query = {"statuses": filters["statuses"], "provider": filters["provider"],
             "operation": filters["operation"], "created_before": filters["before"]}  # fmt: skip
    if not ids:
        return [(r.action_id, r, _resolvable(r, applied, now)) for r in ledger.query(**query)]
    wanted = {r.action_id for r in ledger.query(**query)} if selecting else None
    plan: Plan = []
    for a in ids:
        one = ledger.find(a)
        if one is None:
            plan.append((a, None, "not found"))
        elif wanted is not None and a not in wanted:
            plan.append((a, one, "not selected by the filters"))
        else:
            plan.append((a, one, _resolvable(one, applied, now)))
    return plan


def _record(ledger: Any, plan: Plan, verdict: dict[str, Any], *, bar: bool) -> tuple[int, Plan]:
    """Record the verdict for each action the plan did not skip, one at a time (each
    is its own checked move: an action changed meanwhile is reported, not forced).
    Returns the exit code and each action's result."""
    from ..errors import NotFound, SettledError
    from ..resolve import resolve as do_resolve
    from .progress import Progress

    code = 0
    done: Plan = []
    todo = sum(1 for p in plan if not p[2])
    with Progress("resolving", todo, enabled=bar) as progress:
        for a, rec, why in plan:
            if why:
                code = max(code, 6 if why == "not found" else 7)
                done.append((a, rec, why))
                continue
            try:
                moved = do_resolve(ledger, a, **verdict)
            except NotFound as exc:
                code = max(code, exit_for(exc))
                done.append((a, None, str(exc)))
            except SettledError as exc:  # changed meanwhile: reported with its line
                code = max(code, exit_for(exc))
                done.append((a, rec, str(exc)))
            else:
                done.append((a, moved, ""))
            progress.advance()
    return code, done


def _duration(text_: str) -> float:
    from .common import parse_duration

    return parse_duration(text_)


def _plan_json(p: tuple[str, Any, str], applied: bool, done: bool) -> dict[str, Any]:
    a, rec, why = p
    data: dict[str, Any] = rec.to_json() if rec is not None else {"action_id": a}
    data["resolved"] = done and not why
    data["verdict"] = "applied" if applied else "not_applied"
    data["skipped"] = why or None
    return data
