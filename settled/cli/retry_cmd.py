"""retry: a new attempt of FAILED actions, each weighed against the world first (rule 14),
for one action or many (chosen as ``settled.cli.select`` says)."""

from typing import Annotated, Any

import typer

from ..advice import next_attempt, retryable
from ..display import one_line
from ..selection import Target
from . import options
from .common import STATE, emit_json, finish, operator
from .render import console, say, status_text, text
from .select import Selectors, confirm, plan, preview, read_ids, skipped_code

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
listing is skipped), or select with the selectors of `settled queue`: --provider,
--operation, --status (default FAILED; records in any other status are refused, each
with why), --older-than, --since, --match, --search, --cause and --delivery (each only
narrows). Selecting, or reading ids from stdin, first shows what would be retried and
asks on a terminal, and says how many of them a check comes first for (their
operation has a query: the check, made as each is retried and never for the preview,
refuses a retry whose effect it sees or cannot tell); --yes skips the question,
--dry-run only shows (with --json, each row's `checked_first`). Many retries go out as
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
  settled retry --provider mail --cause http_503 --since 1d --yes
  settled queue --status FAILED -o tsv | settled retry - --yes
"""


def retry(
    action_ids: Annotated[
        list[str] | None, options.action_ids("FAILED actions; - reads ids from stdin.")
    ] = None,
    provider: options.SelectProvider = None,
    operation: options.SelectOperation = None,
    status: Annotated[
        str | None,
        options.status("Select by status (default FAILED; any other is refused, each with why)."),
    ] = None,
    older_than: Annotated[
        str | None, options.older_than("Select actions created longer ago than e.g. 1h.")
    ] = None,
    since: options.Since = None,
    match: options.Match = None,
    search: options.Search = None,
    cause: options.Cause = None,
    delivery: options.Delivery = None,
    no_recheck: Annotated[
        bool,
        options.no_recheck(
            "Retry without checking the provider first (the retry's event says so)."
        ),
    ] = False,
    dry_run: Annotated[bool, options.dry_run("Only show what would be retried.")] = False,
    yes: Annotated[bool, options.yes("Do not ask before retrying a selection.")] = False,
    concurrency: Annotated[
        int | None,
        options.concurrency(
            "Many retries: requests in flight at once (default: the provider's, capped by "
            "its max_in_flight)."
        ),
    ] = None,
    by: Annotated[str | None, options.by("retries them")] = None,
    as_json: options.JsonRecords = False,
) -> None:
    import click

    from .sent import render_report

    actor = operator(by)

    chosen = read_ids(action_ids)
    sel = Selectors(
        provider, operation, status, older_than, since, match, search, cause, delivery
    ).check()
    if not chosen.given and not sel.given:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    single = len(chosen.ids) == 1 and not sel.given and not chosen.from_stdin
    if single and not dry_run:  # one named action: its new attempt's status, as dispatch
        d = STATE.dispatcher(actor=actor)
        report = d.retry(chosen.ids[0], recheck=not no_recheck)
        raise typer.Exit(finish(report, as_json, render_report))
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()
    targets = plan(ledger, chosen, sel, now, retryable, default=("FAILED",))
    n = sum(1 for t in targets if not t.skip)
    checked = checked_first(targets, recheck=not no_recheck)
    if as_json and dry_run:
        first = {t.action_id for t in checked}
        emit_json(
            [{**_retry_json(t, None), "checked_first": t.action_id in first} for t in targets]
        )
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
        if checked:
            say(
                f"{len(checked)} of the {n} would first be checked (their operation has a "
                "query): a check that sees the effect, or cannot tell, refuses that retry"
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
        _retry_all(
            targets, recheck=not no_recheck, concurrency=concurrency, as_json=as_json, actor=actor
        )
    )


def checked_first(targets: list[Target], *, recheck: bool) -> list[Target]:
    """The targets a retry would check first (rule 14): those it acts on whose
    operation has a query that can observe the effect; the check is made when they
    are retried, never for the preview. None with ``recheck`` off."""
    from ..policy import recheck_needed

    if not recheck:
        return []
    return [t for t in targets if not t.skip and not recheck_needed(t.record, t.record.declared)]


def _retry_all(
    targets: list[Target], *, recheck: bool, concurrency: int | None, as_json: bool, actor: str
) -> int:
    """Retry what the plan did not skip through the bulk path; print each result as it
    is durable (people) or all of them at the end (JSON); return the exit code."""
    from .from_lines import line_exit
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
    d = STATE.dispatcher(actor=actor)
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
    app.command(help=RETRY_HELP)(retry)
