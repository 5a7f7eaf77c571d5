"""resolve and retry: a person's verdict, and a new attempt, each weighed against the
world first (rule 14), for one action or many (chosen as ``settled.cli.select`` says)."""

from __future__ import annotations

from typing import Any

import typer

from . import complete
from .common import (
    EXIT_CONFLICT,
    EXIT_NOT_FOUND,
    STATE,
    default_actor,
    emit_json,
    exit_for,
    finish,
    one_line,
)
from .render import console, text
from .select import Selectors, Target, confirm, plan, preview, read_ids

NOT_FOUND = "not found"


def say(line: str) -> None:
    console(stderr=True).print(text(line))


def skipped_code(why: str) -> int:
    """The exit code of a target skipped before anything was done: 6 not found, else 7."""
    return EXIT_NOT_FOUND if why == NOT_FOUND else EXIT_CONFLICT


def report_skipped(done: list[Target]) -> None:
    for t in done:
        if t.skip:
            say(f"  {t.action_id}: {t.skip}")


RESOLVE_HELP = """Settle unresolved actions by a person's attested verdict.

Give ACTION_IDs (or - to read ids from stdin, one per line; the header line of a TSV
listing is skipped and a row gives its first field), or select with --provider,
--operation, --status (default DENIED_UNRESOLVED) and --older-than. Selecting, or
reading ids from stdin, first shows what would be settled and asks on a terminal;
--yes skips the question, --dry-run only shows. Every record gets its own event with
the same reason, evidence and actor.

Allowed from DENIED_UNRESOLVED, and from AWAITING_VERIFICATION when the operation
needs manual verification (partial, blind). --applied confirms (confirmed_by
operator:NAME); --not-applied fails it, after which `settled retry` may open a new
attempt.

A --not-applied verdict on an operation that has a query is weighed against the
world first: settled checks the provider once more. When the effect is visible the
verdict is refused (exit 7) and the record is CONFIRMED by that evidence; when the
check cannot be made (provider unreachable, not usable here, throttled) or cannot
tell, the verdict is refused (exit 7) and nothing is recorded, unless --no-recheck,
which the event records.

Exit 0 when every verdict was recorded; else the highest of 6 (not found) and 7 (not
allowed now, or refused by the check), after recording the others.

\b
Examples:
  settled resolve order-42-mail --applied --reason "customer replied" --evidence "ticket 991"
  settled resolve order-42-mail --not-applied --reason "bounce report 991"
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --dry-run
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --yes
  settled queue -o tsv | settled resolve - --applied --reason "seen in CRM" --yes
"""

RETRY_HELP = """Open a new attempt (idempotency key ID:N+1) of FAILED actions and dispatch them.

Allowed only from FAILED, i.e. after evidence that the last attempt did not apply,
and never while later evidence contradicts the failure. From DENIED_UNRESOLVED it is
refused (exit 7): run `settled reconcile` or `settled resolve` first.

On an operation that has a query, settled checks the provider once more first: when
the last attempt's effect is visible the retry is refused (exit 7) and the record is
corrected to CONFIRMED by that evidence; when the check cannot be made or cannot
tell, it is refused (exit 7) and nothing is sent, unless --no-recheck, which the
retry's event records.

Give ACTION_IDs (or - to read ids from stdin, one per line; the header line of a TSV
listing is skipped), or select with --provider, --operation, --status (default
FAILED; records in any other status are refused, each with why) and --older-than.
Selecting, or reading ids from stdin, first shows what would be retried and asks on
a terminal; --yes skips the question, --dry-run only shows. Many retries go out as
one bulk dispatch: claims committed in groups before their requests leave, sent from
--concurrency threads.

Exit code: with one ACTION_ID, the new attempt's status, as dispatch; with several,
0 when every retry ended CONFIRMED, else the highest code among them (3 pending,
4 unresolved, 5 failed, 6 not found, 7 refused).

\b
Examples:
  settled retry order-42-mail
  settled retry order-42-mail --json | jq .idempotency_key
  settled retry --provider mail --older-than 1h --dry-run
  settled retry --provider mail --older-than 1h --yes --concurrency 8
  settled queue --status FAILED -o tsv | settled retry - --yes
"""


# ------------------------------------------------------------------ resolve


def resolvable(rec: Any, applied: bool, now: Any) -> str:
    """Why a verdict cannot be recorded on this record now, or '' when it can: the
    core's own rule (``policy.resolution``), asked without writing anything."""
    from ..policy import resolution

    if resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None:
        return ""
    if str(rec.status) == "AWAITING_VERIFICATION":
        return "verified automatically; wait or run `settled reconcile`"
    return f"{rec.status}: resolve applies to unresolved actions only"


def verdict_becomes(applied: bool, recheck: bool) -> Any:
    """The preview's "becomes" cell: the verdict's status, and whether a check of the
    provider comes first (rule 14: a not-applied verdict on a queryable operation)."""
    from ..policy import recheck_needed

    verdict = "CONFIRMED" if applied else "FAILED"

    def cell(t: Target) -> str:
        rec = t.record
        if applied or not recheck or recheck_needed(rec, rec.declared):
            return verdict
        return f"{verdict} unless a check sees it"

    return cell


def resolve(
    action_ids: list[str] | None = typer.Argument(
        None,
        metavar="[ACTION_ID|-]...",
        autocompletion=complete.action_ids,
        help="Actions to settle; - reads ids from stdin.",
        show_default=False,
    ),
    applied: bool | None = typer.Option(
        None,
        "--applied/--not-applied",
        help="Your verdict: the effect happened, or it did not.",
        show_default=False,
    ),
    reason: str = typer.Option(..., "--reason", metavar="TEXT", help="How you know (required)."),
    evidence: str | None = typer.Option(
        None, "--evidence", metavar="TEXT", help="A reference: ticket, log line, URL."
    ),
    object_id: str | None = typer.Option(
        None,
        "--object-id",
        metavar="ID",
        help="The provider's id for the effect (one action only).",
    ),
    by: str | None = typer.Option(
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
    no_recheck: bool = typer.Option(
        False,
        "--no-recheck",
        help="Record a --not-applied verdict without checking the provider first (the "
        "event says so).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be settled."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before settling a selection."),
    as_json: bool = typer.Option(False, "--json", help="Print the record(s) as JSON."),
) -> None:
    import click

    from ..errors import InvalidInput
    from ..resolve import resolve as do_resolve
    from .settle import render_record

    verdict = _verdict(applied, reason, by, evidence, object_id)
    assert applied is not None  # _verdict refused a missing --applied/--not-applied
    chosen = read_ids(action_ids)
    sel = Selectors(provider, operation, status, older_than)
    if not chosen.given and not sel.given:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a refused or previewed resolve writes nothing
    verdict.update(now=now, registry=STATE.registry(), recheck=not no_recheck)
    single = len(chosen.ids) == 1 and not sel.given and not chosen.from_stdin
    if single and not dry_run:  # one named action: as it always was
        rec = do_resolve(ledger, chosen.ids[0], **verdict)
        if as_json:
            emit_json(rec.to_json())
        else:
            render_record(rec, "resolved")
        raise typer.Exit(0)
    if object_id is not None and not single:
        raise InvalidInput("--object-id names one provider object: give exactly one ACTION_ID")
    targets = plan(
        ledger,
        chosen,
        sel,
        now,
        lambda r: resolvable(r, applied, now),
        default=("DENIED_UNRESOLVED",),
    )
    n = sum(1 for t in targets if not t.skip)
    if as_json and dry_run:
        emit_json([_plan_json(t, applied, False) for t in targets])
        raise typer.Exit(0)
    asked = bool(n) and not yes and not dry_run
    note = False
    if not as_json or asked:
        title = (
            f"resolve --{'applied' if applied else 'not-applied'}: {n} of {len(targets)} action(s)"
        )
        note = preview(
            targets,
            title=title,
            becomes=verdict_becomes(applied, not no_recheck),
            now=now,
            err=as_json,
        )
    if dry_run:
        say(f"--dry-run: nothing recorded ({n} would be)")
        raise typer.Exit(0)
    if asked and not confirm(
        n,
        question=f"Record this verdict for {n} action(s)?",
        doing="settle",
        asked=not chosen.from_stdin,
        note=note,
    ):
        say("nothing recorded")
        raise typer.Exit(0)
    code, done = record_verdicts(ledger, targets, verdict, bar=not as_json and n > 1)
    if as_json:
        emit_json([_plan_json(t, applied, True) for t in done])
    else:
        recorded = sum(1 for t in done if not t.skip)
        say(f"recorded {recorded} verdict(s); {len(done) - recorded} skipped")
        report_skipped(done)
    raise typer.Exit(code)


def _verdict(
    applied: bool | None, reason: str, by: str | None, evidence: str | None, object_id: str | None
) -> dict[str, Any]:
    """The verdict's own arguments, checked before the ledger is opened."""
    import click

    from ..errors import InvalidInput

    if applied is None:
        raise click.UsageError("say what happened: --applied or --not-applied")
    if not reason.strip():
        raise InvalidInput("--reason is required: say how you know")
    actor = default_actor() if by is None else by
    if not actor.strip():
        raise InvalidInput("--by must not be empty")
    return {
        "applied": applied,
        "reason": reason,
        "by": actor,
        "evidence": evidence,
        "object_id": object_id,
    }


def record_verdicts(
    ledger: Any, targets: list[Target], verdict: dict[str, Any], *, bar: bool
) -> tuple[int, list[Target]]:
    """Record the verdict for each target not skipped, one at a time (each is its own
    checked move, after its own check of the provider: an action changed meanwhile, or
    whose check refuses the verdict, is reported, not forced). Returns the exit code
    and each target as it ended."""
    from dataclasses import replace

    from ..errors import EffectVisible, NotFound, SettledError
    from ..resolve import resolve as do_resolve
    from .progress import Progress

    code = 0
    done: list[Target] = []
    with Progress("resolving", sum(1 for t in targets if not t.skip), enabled=bar) as progress:
        for t in targets:
            if t.skip:
                code = max(code, skipped_code(t.skip))
                done.append(t)
                continue
            try:
                moved = do_resolve(ledger, t.action_id, **verdict)
            except NotFound as exc:
                code = max(code, exit_for(exc))
                done.append(replace(t, record=None, skip=str(exc)))
            except EffectVisible as exc:  # settled by the evidence instead
                code = max(code, exit_for(exc))
                done.append(replace(t, record=exc.record, skip=str(exc)))
            except SettledError as exc:  # changed meanwhile, or no check possible
                code = max(code, exit_for(exc))
                done.append(replace(t, skip=str(exc)))
            else:
                done.append(replace(t, record=moved))
            progress.advance()
    return code, done


def _plan_json(t: Target, applied: bool, done: bool) -> dict[str, Any]:
    data: dict[str, Any] = (
        t.record.to_json() if t.record is not None else {"action_id": t.action_id}
    )
    data["resolved"] = done and not t.skip
    data["verdict"] = "applied" if applied else "not_applied"
    data["skipped"] = t.skip or None
    return data


# ------------------------------------------------------------------ retry


def retryable(rec: Any) -> str:
    """Why ``rec`` cannot be retried (the dispatcher's own rule), or ''."""
    from ..dispatch import retry_problem

    problem: str = retry_problem(rec)
    return problem.removeprefix(f"action {rec.action_id} is ")


def next_attempt(recheck: bool) -> Any:
    from ..policy import recheck_needed

    def cell(t: Target) -> str:
        rec = t.record
        attempt = f"attempt {rec.attempt + 1}"
        if not recheck or recheck_needed(rec, rec.declared):
            return attempt
        return f"{attempt} unless a check sees it"

    return cell


def retry(
    action_ids: list[str] | None = typer.Argument(
        None,
        metavar="[ACTION_ID|-]...",
        autocompletion=complete.action_ids,
        help="FAILED actions; - reads ids from stdin.",
        show_default=False,
    ),
    provider: str = complete.provider_option("Select by provider."),
    operation: str = complete.operation_option("Select by operation."),
    status: str = complete.status_option(
        "Select by status (default FAILED; any other is refused, each with why)."
    ),
    older_than: str = complete.older_than_option("Select actions created longer ago than e.g. 1h."),
    no_recheck: bool = typer.Option(
        False,
        "--no-recheck",
        help="Retry without checking the provider first (the retry's event says so).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only show what would be retried."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before retrying a selection."),
    concurrency: int | None = typer.Option(
        None,
        "--concurrency",
        metavar="N",
        min=1,
        max=100,
        show_default=False,
        help="Many retries: requests in flight at once (default: the provider's, capped by "
        "its max_in_flight).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the record(s) as JSON."),
) -> None:
    import click

    from .actions import render_report

    chosen = read_ids(action_ids)
    sel = Selectors(provider, operation, status, older_than)
    if not chosen.given and not sel.given:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    single = len(chosen.ids) == 1 and not sel.given and not chosen.from_stdin
    if single and not dry_run:  # one named action: its new attempt's status, as dispatch
        d = STATE.dispatcher(actor="retry")
        report = d.retry(chosen.ids[0], recheck=not no_recheck)
        raise typer.Exit(finish(report, as_json, render_report))
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()
    targets = plan(ledger, chosen, sel, now, retryable, default=("FAILED",))
    n = sum(1 for t in targets if not t.skip)
    if as_json and dry_run:
        emit_json([_retry_json(t, None) for t in targets])
        raise typer.Exit(0)
    asked = bool(n) and not yes and not dry_run
    note = False
    if not as_json or asked:
        note = preview(
            targets,
            title=f"retry: {n} of {len(targets)} action(s)",
            becomes=next_attempt(not no_recheck),
            now=now,
            err=as_json,
        )
    if dry_run:
        say(f"--dry-run: nothing sent ({n} would be retried)")
        raise typer.Exit(0)
    if asked and not confirm(
        n, question=f"Retry {n} action(s)?", doing="retry", asked=not chosen.from_stdin, note=note
    ):
        say("nothing sent")
        raise typer.Exit(0)
    raise typer.Exit(
        _retry_all(targets, recheck=not no_recheck, concurrency=concurrency, as_json=as_json)
    )


def _retry_all(
    targets: list[Target], *, recheck: bool, concurrency: int | None, as_json: bool
) -> int:
    """Retry what the plan did not skip through the bulk path; print each result as it
    is durable (people) or all of them at the end (JSON); return the exit code."""
    from .bulk import line_exit
    from .progress import Progress

    code = 0
    rows: list[dict[str, Any]] = []
    for t in targets:
        if t.skip:
            code = max(code, skipped_code(t.skip))
            rows.append(_retry_json(t, None))
            if not as_json:
                console(stderr=True).print(text(f"{t.action_id}: skipped: ", t.skip))
    wanted = [(t.action_id, t.record) for t in targets if not t.skip]
    providers = sorted({rec.provider for _, rec in wanted})
    threads = {p: STATE.send_concurrency(p, concurrency) for p in providers}
    d = STATE.dispatcher(actor="retry")
    sent = refused = 0
    with Progress("retrying", len(wanted), enabled=not as_json and len(wanted) > 1) as bar:
        for r in d.retry_many([a for a, _ in wanted], recheck=recheck, concurrency=threads):
            code = max(code, line_exit(r))
            bar.advance()
            if r.report is not None:
                sent += 1
            else:
                refused += 1
            if as_json:
                rows.append(_retry_json(None, r))
            else:
                _retry_line(r, bar)
    if as_json:
        emit_json(rows)
    else:
        say(f"retried {sent} action(s); {refused + len(targets) - len(wanted)} not retried")
    return code


def _retry_line(r: Any, bar: Any) -> None:
    from .render import status_text

    if r.report is None:
        bar.line(text((str(r.action_id), "bold"), "  not retried: ", one_line(r.problem)))
        return
    rec = r.report.record
    head = text((rec.action_id, "bold"), f"  attempt {rec.attempt}  ") + status_text(rec.status)
    bar.line(head)
    if r.report.message or rec.reason:
        bar.line(text("  why:  ", one_line(r.report.message or rec.reason or "")))


def _retry_json(t: Target | None, r: Any) -> dict[str, Any]:
    """One retry's JSON: the record as it stands, with ``retried`` and ``skipped``
    (``r``: a retry that was tried; else ``t``: a target skipped before)."""
    if r is not None:
        data: dict[str, Any] = r.to_json()
        data.pop("line", None)
        data["retried"] = r.report is not None
        data["skipped"] = r.problem or None
        return data
    assert t is not None
    data = t.record.to_json() if t.record is not None else {"action_id": t.action_id}
    data.update(retried=False, skipped=t.skip or None)
    return data


def register(app: typer.Typer) -> None:
    app.command(help=RESOLVE_HELP)(resolve)
    app.command(help=RETRY_HELP)(retry)


__all__ = [
    "next_attempt",
    "record_verdicts",
    "register",
    "resolvable",
    "resolve",
    "retry",
    "retryable",
    "verdict_becomes",
]
