"""show and queue: the commands that only read. They never create a ledger: a
missing one is exit 1 with its path."""

import json
import sys
from typing import Annotated, Any

import typer

from .. import cause
from ..advice import next_step
from ..display import ago, event_detail, iso, term
from . import completion, options
from .common import EXIT_BY_STATUS, STATE, emit_json
from .render import console, print_trimmed, status_text, text

SHOW_HELP = """Show actions: what each was (params, times), where it stands, and every event.

Give one or more ACTION_IDs, or - to read ids from stdin (one a line; the header line
of `queue -o tsv` is skipped, and a whole TSV line is read up to its first TAB).
Several actions print one block each; --json prints the object for one ACTION_ID
given as an argument, and an array for several or for -.

Exit code 0 when every action exists (6 when one does not: the others are still
shown), so that `settled show ID --json | jq -r .status` is safe under `set -e`;
--exit-status exits with the status code instead (0 CONFIRMED, 3 pending,
4 unresolved, 5 FAILED; the highest of them for several, 6 when one is missing).
Times are ISO-8601 in UTC ('Z').

\b
Examples:
  settled show order-42-mail
  settled show order-42-mail --json | jq '.events[-1]'
  settled show order-42-mail --exit-status && echo done
  settled show order-42-mail order-43-mail
  settled queue --match timeout -o name | settled show - --json | jq -r '.[].reason'
"""


def config_changes(rec: Any) -> list[str] | None:
    """How the current config's declaration of the record's operation differs from
    what the record was recorded with (rule 11: the stored one governs it); None when
    nothing can be compared (an older record, or the operation is not configured or
    cannot be loaded here)."""
    from ..errors import SettledError
    from ..model import Declared

    if rec.declared is None:
        return None
    try:
        spec = STATE.registry().operation(rec.provider, rec.operation)
    except SettledError:
        return None
    changes: list[str] = rec.declared.differences(Declared.of(spec))
    return changes


def render_show(
    rec: Any, events: list[Any], now: Any, changes: list[str] | None = None, waiting: int = 0
) -> None:
    from rich.padding import Padding
    from rich.table import Table

    from ..display import redact_params
    from .common import config_secrets

    con = console()
    con.print(
        text((rec.action_id, "bold"), "  ") + status_text(rec.status),
        no_wrap=True,
        overflow="ignore",
        crop=False,
    )
    try:
        params = json.dumps(redact_params(rec.params, config_secrets()), ensure_ascii=False)
    except (RecursionError, ValueError):
        params = "(nested too deeply to show here; see --json)"

    def when(t: str | None, never: str = "-") -> str:
        if not t:
            return never
        rel = ago(t, now)
        return f"{iso(t)} ({rel})" if rel.startswith("in ") else f"{iso(t)} ({rel} ago)"

    manual = "a person (manual verification)" if rec.requires_manual_verification else "queries"
    fields = [
        ("operation", f"{rec.provider}/{rec.operation}"),
        ("tier", f"{rec.tier}; verified by {manual}"),
        ("params", params),
        ("created", when(rec.created_at)),
        ("dispatched", when(rec.dispatched_at, "not yet")),
        ("eligible at", iso(rec.eligible_at) if rec.eligible_at else "never (manual verification)"),
        (
            "confirmed",
            f"{when(rec.confirmed_at)} by {rec.confirmed_by}" if rec.confirmed_at else "-",
        ),
        ("updated", when(rec.updated_at)),
        ("attempt", f"{rec.attempt} (idempotency key {rec.idempotency_key})"),
        ("delivery/acceptance", f"{rec.delivery} / {rec.acceptance}"),
        ("reconciliation key", rec.reconciliation_key or "-"),
        ("provider object", rec.provider_object_id or "-"),
    ]
    if rec.lease_expires_at:
        fields.append(("dispatch lease", f"until {iso(rec.lease_expires_at)}"))
    if rec.next_check_at:
        fields.append(("next check", f"{iso(rec.next_check_at)} (checks so far: {rec.checks})"))
    if rec.verify_deadline_at:
        declared = getattr(rec, "declared", None)
        least = declared.verify_min_checks if declared is not None else 3
        fields.append(
            (
                "verify until",
                f"{iso(rec.verify_deadline_at)}, and at least {least} checks "
                f"({getattr(rec, 'counted_checks', 0)} made)",
            )
        )
    said = cause.sentence(rec)
    if said and not getattr(rec, "contradiction", None):
        fields.insert(0, ("cause", f"{said} ({cause.shown(rec)})"))
    if getattr(rec, "check_error", None) and not rec.terminal:
        fields.append(("last check failed", rec.check_error))
    if getattr(rec, "lands_by", None) and not rec.terminal:
        fields.append(("may land until", iso(rec.lands_by)))
    if getattr(rec, "contradiction", None):
        fields.append(
            (
                "CONTRADICTED",
                f"{rec.contradiction}; retry is blocked until a person "
                "resolves it (settled resolve)",
            )
        )
    if waiting:
        fields.append(
            (
                "callbacks kept",
                f"{waiting} signed callback(s) name this action and wait for its outcome "
                "(matched when it is written, or by the next reconciler pass)",
            )
        )
    if changes:
        fields.append(
            (
                "config changed",
                f"since this action was recorded: {'; '.join(changes)} (it keeps what it was "
                "recorded with; new actions use the current config)",
            )
        )
    fields += [("why", rec.reason or "-"), ("next", next_step(rec))]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for k, v in fields:
        grid.add_row(text(k), text((v, "bold red" if k == "CONTRADICTED" else "")))
    print_trimmed(con, Padding(grid, (0, 0, 0, 2), expand=False))
    con.print(text(("events", "bold")))
    for e in events:
        move = f"{e.from_status or '∅'} → {e.to_status}"
        con.print(
            Padding(
                text(f"{e.id:>3}  {iso(e.at)}  ", (e.actor, "bold"), f"  {e.kind}  {move}"),
                (0, 0, 0, 1),
                expand=False,
            )
        )
        con.print(Padding(text(event_detail(e)), (0, 0, 0, 7), expand=False))


def _show_json(ledger: Any, rec: Any) -> dict[str, Any]:
    data: dict[str, Any] = {**rec.to_json(), **cause.to_json(rec)}
    data["config_changes"] = config_changes(rec)
    data["pending_callbacks"] = ledger.pending_callbacks(rec)
    data["events"] = [e.to_json() for e in ledger.events(rec.action_id)]
    return data


def _show_many(ledger: Any, ids: list[str], *, as_json: bool, exit_status: bool) -> int:
    """Several actions: a block each (or one JSON array), in the order given; a
    missing one is named on stderr, exit 6, and the others are still shown."""
    from .common import EXIT_NOT_FOUND

    found: list[Any] = []
    code = 0
    for aid in ids:
        rec = ledger.find(aid)
        if rec is None:
            sys.stderr.write(f"settled: error: {term(f'no action {aid!r} in {ledger.location}')}\n")
            code = EXIT_NOT_FOUND
            continue
        found.append(rec)
        if exit_status:
            code = max(code, EXIT_BY_STATUS[rec.status])
    if as_json:
        emit_json([_show_json(ledger, rec) for rec in found])
        return code
    now = ledger.clock(anchor=False).now()
    for i, rec in enumerate(found):
        if i:
            console().print()
        render_show(
            rec,
            ledger.events(rec.action_id),
            now,
            config_changes(rec),
            ledger.pending_callbacks(rec),
        )
    return code


def register(app: typer.Typer) -> None:
    @app.command(help=SHOW_HELP)
    def show(
        action_ids: list[str] = typer.Argument(
            ...,
            metavar="ACTION_ID...|-",
            autocompletion=completion.action_ids,
            help="The actions to show; - reads ids from stdin.",
        ),
        exit_status: bool = typer.Option(
            False, "--exit-status", help="Exit with the status code (0, 3, 4, 5) instead of 0."
        ),
        as_json: Annotated[bool, options.json_output("The record(s) and events as JSON.")] = False,
    ) -> None:
        from .select import read_ids

        chosen = read_ids(action_ids)
        ledger = STATE.ledger(read_only=True)
        if len(chosen.ids) == 1 and not chosen.from_stdin:  # one action: as it always was
            rec = ledger.get(chosen.ids[0])
            if as_json:
                emit_json(_show_json(ledger, rec))
            else:
                render_show(
                    rec,
                    ledger.events(rec.action_id),
                    ledger.clock(anchor=False).now(),
                    config_changes(rec),
                    ledger.pending_callbacks(rec),
                )
            raise typer.Exit(EXIT_BY_STATUS[rec.status] if exit_status else 0)
        raise typer.Exit(_show_many(ledger, chosen.ids, as_json=as_json, exit_status=exit_status))
