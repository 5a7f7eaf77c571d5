"""reconcile, resolve, retry: settling what dispatch left open, by evidence or by a person."""

from __future__ import annotations

from typing import Any

import typer

from .common import (
    EXIT_BY_STATUS,
    STATE,
    STATUS_STYLE,
    console,
    default_actor,
    emit_json,
    next_step,
    one_line,
)

RECONCILE_HELP = """Settle records by querying the provider for the real effect.

With --due: one pass over every record due now (expired dispatch leases first become
DENIED_UNRESOLVED; queryable ones are checked). This is the cron entry; it exits 0
whenever the pass ran, whatever it found.

With ACTION_IDs: check those records now, whatever their schedule. With one id the
exit code is that record's status afterwards (0 CONFIRMED, 3 pending, 4 unresolved,
5 FAILED); with several, 0 when the pass ran. An unknown id exits 6 before anything
is checked.
"""


def render_pass(report: Any) -> None:
    con = console()
    for ch in report.changes:
        style = STATUS_STYLE.get(ch.to_status, "white")
        con.print(
            f"[bold]{ch.action_id}[/]  {ch.from_status} → [{style}]{ch.to_status}[/]  ({ch.kind})"
        )
        con.print(f"  why:  {one_line(ch.reason)}", markup=False)
    for ch in [*report.waiting, *report.skipped]:
        con.print(f"{ch.action_id}  {ch.from_status}  ({ch.kind})", markup=False)
        con.print(f"  why:  {one_line(ch.reason)}", markup=False)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts().items())) or "no status change"
    waiting = len(report.waiting)
    tail = f"; {waiting} still waiting" if waiting else ""
    stopped = " (stopped early; the rest was handed back)" if report.stopped else ""
    console(stderr=True).print(f"examined {report.examined}: {counts}{tail}{stopped}", markup=False)


def render_record(rec: Any, headline: str) -> None:
    con = console()
    style = STATUS_STYLE.get(str(rec.status), "white")
    con.print(
        f"[bold]{rec.action_id}[/]  {rec.provider}.{rec.operation} ({rec.tier})  "
        f"[{style}]{rec.status}[/]  {headline}"
    )
    if rec.reason:
        con.print(f"  why:  {one_line(rec.reason)}", markup=False)
    if rec.confirmed_by:
        con.print(f"  confirmed by: {rec.confirmed_by}", markup=False)
    con.print(f"  next: {next_step(rec)}", markup=False)


def register(app: typer.Typer) -> None:
    @app.command(help=RECONCILE_HELP)
    def reconcile(
        action_ids: list[str] = typer.Argument(None, help="Records to check now.", show_default=False),
        due: bool = typer.Option(False, "--due", help="One pass over everything due (cron)."),
        limit: int = typer.Option(
            None, "--limit", min=1, help="With --due: examine at most N records.", show_default=False
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the pass report as JSON."),
        concurrency: int = typer.Option(
            None, "--concurrency", min=1, max=100, show_default=False,
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
        r = STATE.reconciler(concurrency=concurrency)
        report = r.run_due(limit) if due else r.run_ids(ids)
        if as_json:
            emit_json(report.to_json())
        else:
            render_pass(report)
        if len(ids) == 1:
            raise typer.Exit(EXIT_BY_STATUS[STATE.ledger().get(ids[0]).status])
        raise typer.Exit(0)

    @app.command()
    def resolve(
        action_id: str = typer.Argument(..., help="The unresolved action."),
        applied: bool = typer.Option(None, "--applied/--not-applied",
                                     help="Your verdict: the effect happened, or it did not.",
                                     show_default=False),
        reason: str = typer.Option(..., "--reason", help="How you know (required)."),
        evidence: str = typer.Option(None, "--evidence", help="A reference: ticket, log line, URL."),
        object_id: str = typer.Option(None, "--object-id", help="The provider's id for the effect."),
        by: str = typer.Option(None, "--by", help="Who attests it (default: the OS user).",
                               show_default=False),
        as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
    ) -> None:
        """Settle an unresolved action by a person's attested verdict.

        Allowed from DENIED_UNRESOLVED, and from AWAITING_VERIFICATION when the
        operation needs manual verification (partial, blind); anything else exits 7.
        --applied confirms it (confirmed_by operator:NAME); --not-applied fails it,
        after which `settled retry` may open a new attempt. Exit code: the new status
        (0 CONFIRMED, 5 FAILED).
        """
        import click

        from ..clock import utcnow
        from ..resolve import resolve as do_resolve
        from .actions import check_id

        check_id(action_id)
        if applied is None:
            raise click.UsageError("say what happened: --applied or --not-applied")
        rec = do_resolve(
            STATE.ledger(),
            action_id,
            applied=applied,
            reason=reason,
            by=default_actor() if by is None else by,
            now=utcnow(),
            evidence=evidence,
            object_id=object_id,
        )
        if as_json:
            emit_json(rec.to_json())
        else:
            render_record(rec, "resolved")
        raise typer.Exit(EXIT_BY_STATUS[rec.status])

    @app.command()
    def retry(
        action_id: str = typer.Argument(..., help="A FAILED action."),
        as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
    ) -> None:
        """Open a new attempt (idempotency key ID:N+1) of a FAILED action and dispatch it.

        Allowed only from FAILED, i.e. after evidence that the last attempt did not
        apply. From DENIED_UNRESOLVED it is refused (exit 7): run `settled reconcile`
        or `settled resolve` first. Exit code: the new attempt's status, as dispatch.
        """
        from .actions import _report_out, check_id

        check_id(action_id)
        d = STATE.dispatcher(actor="retry")
        raise typer.Exit(_report_out(d.retry(action_id), as_json))
