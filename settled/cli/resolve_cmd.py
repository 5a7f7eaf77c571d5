"""resolve: a person's verdict, weighed against the world first (rule 14), for one action
or many (chosen as ``settled.cli.select`` says)."""

from typing import Annotated, Any

import typer

from ..advice import next_step, resolvable, verdict_becomes
from ..display import one_line
from ..selection import Target
from . import options
from .common import STATE, emit_json, exit_for, person
from .render import console, say, status_text, text
from .select import Selectors, confirm, plan, preview, read_ids, report_skipped, skipped_code

RESOLVE_HELP = """Settle unresolved actions by a person's attested verdict.

Give ACTION_IDs (or - to read ids from stdin, one per line; the header line of a TSV
listing is skipped and a row gives its first field), or select with the selectors of
`settled queue`: --provider, --operation, --status (default DENIED_UNRESOLVED),
--older-than, --since, --match, --search, --cause and --delivery (each only narrows;
with ids, they narrow the ids). Selecting, or
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
tell, the verdict is refused (exit 7) and the status stays, unless --no-recheck,
which the event records. A refused verdict is kept as a note event with your claim
(who, reason, evidence) and why it was refused; it moves nothing.

--correct corrects a person's earlier verdict that later proved wrong (the customer
did receive it): one ACTION_ID, with --evidence, only while its status is the one
that verdict set on this attempt (never once a retry opened a new attempt); the
event names the verdict it corrects. A --not-applied correction is checked first
like any other.

The person is --by, else $SETTLED_OPERATOR, else the OS user; a name holding ' via '
or a control character is refused (exit 1) before anything is written.

Exit 0 when every verdict was recorded; else the highest of 6 (not found) and 7 (not
allowed now, or refused by the check), after recording the others.

\b
Examples:
  settled resolve order-42-mail --applied --reason "customer replied" --evidence "ticket 991"
  settled resolve order-42-mail --not-applied --reason "bounce report 991"
  settled resolve order-42-mail --applied --correct --reason "customer has it" --evidence "ticket 995"
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --dry-run
  settled resolve --provider mail --older-than 1d --not-applied --reason "bounced" --yes
  settled resolve --search "10927" --cause blind --applied --reason "in the CRM" --yes
  settled queue -o tsv | settled resolve - --applied --reason "seen in CRM" --yes
"""


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


def resolve(
    action_ids: Annotated[
        list[str] | None, options.action_ids("Actions to settle; - reads ids from stdin.")
    ] = None,
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
    by: Annotated[str | None, options.by("attests it")] = None,
    provider: options.SelectProvider = None,
    operation: options.SelectOperation = None,
    status: Annotated[
        str | None, options.status("Select by status (default DENIED_UNRESOLVED).")
    ] = None,
    older_than: Annotated[
        str | None, options.older_than("Select actions created longer ago than e.g. 1d.")
    ] = None,
    since: options.Since = None,
    match: options.Match = None,
    search: options.Search = None,
    cause: options.Cause = None,
    delivery: options.Delivery = None,
    no_recheck: Annotated[
        bool,
        options.no_recheck(
            "Record a --not-applied verdict without checking the provider first (the "
            "event says so)."
        ),
    ] = False,
    correct: bool = typer.Option(
        False,
        "--correct",
        help="Correct a person's earlier verdict on this attempt (one action; needs --evidence).",
    ),
    dry_run: Annotated[bool, options.dry_run("Only show what would be settled.")] = False,
    yes: Annotated[bool, options.yes("Do not ask before settling a selection.")] = False,
    as_json: options.JsonRecords = False,
) -> None:
    import click

    from ..errors import InvalidInput
    from ..resolve import resolve as do_resolve

    verdict = _verdict(applied, reason, by, evidence, object_id)
    assert applied is not None  # _verdict refused a missing --applied/--not-applied
    chosen = read_ids(action_ids)
    sel = Selectors(
        provider, operation, status, older_than, since, match, search, cause, delivery
    ).check()
    if not chosen.given and not sel.given:
        raise click.UsageError("give ACTION_IDs, - (ids on stdin), or selectors such as --provider")
    ledger = STATE.ledger(create=False)
    now = ledger.clock(anchor=False).now()  # a refused or previewed resolve writes nothing
    verdict.update(now=now, registry=STATE.registry(), recheck=not no_recheck, probe=STATE.probe)
    single = len(chosen.ids) == 1 and not sel.given and not chosen.from_stdin
    if correct and (not single or dry_run):
        raise InvalidInput("--correct corrects one verdict: give exactly one ACTION_ID")
    if single and not dry_run:  # one named action: as it always was
        rec = do_resolve(ledger, chosen.ids[0], **verdict, correct=correct)
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
    actor = person(by)
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
    """Record the verdict for each target not skipped (``resolve.record_verdicts``),
    with a progress bar. Returns the exit code and each target as it ended."""
    from ..resolve import record_verdicts as record
    from .progress import Progress

    code = 0
    with Progress("resolving", sum(1 for t in targets if not t.skip), enabled=bar) as progress:
        ended = record(ledger, targets, verdict, advance=progress.advance)
    for t, refused in ended:
        if refused is not None:
            code = max(code, exit_for(refused))
        elif t.skip:
            code = max(code, skipped_code(t.skip))
    return code, [t for t, _ in ended]


def _plan_json(t: Target, applied: bool, done: bool) -> dict[str, Any]:
    data: dict[str, Any] = (
        t.record.to_json() if t.record is not None else {"action_id": t.action_id}
    )
    data["resolved"] = done and not t.skip
    data["verdict"] = "applied" if applied else "not_applied"
    data["skipped"] = t.skip or None
    return data


def register(app: typer.Typer) -> None:
    app.command(help=RESOLVE_HELP)(resolve)
