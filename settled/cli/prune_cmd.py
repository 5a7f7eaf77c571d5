"""prune: archive settled records past --older-than, then remove them from the ledger
(``retention.py`` does the work)."""

from typing import Annotated, Any

import typer

from ..model import TERMINAL, Status
from . import options
from .common import STATE, emit_json, person
from .render import say

PRUNE_HELP = """Archive settled records whose last change is older than --older-than, then
remove them and their events from the ledger.

Only settled records are pruned: CONFIRMED or FAILED (--status narrows it), with no
contradiction, nothing scheduled and no pending callback bound to them; never an open,
held or contradicted one. The run writes ONE new archive (--archive FILE, JSON Lines,
never overwritten): every record as stored with its whole event log, in batches, each
sealed with a SHA-256 over every byte before it and made durable before the
transaction that deletes the batch commits. Each batch is recorded as a `pruned`
event of the ledger itself (run, batch, digest, who). Killed at any point, every
record is in the ledger or in a sealed batch of the archive; `settled verify
--archive FILE` checks it.

First shows what it would prune and asks on a terminal; --yes skips the question,
--dry-run only shows (exit 0). Refused on a ledger that migrate-ledger moved. Exit 0
when done (or nothing to prune), 1 on bad input or an unwritable archive.

\b
Examples:
  settled prune --older-than 90d --dry-run
  settled prune --older-than 90d --archive settled-2026-12.jsonl --yes
  settled prune --older-than 30d --status FAILED --provider mail --archive f.jsonl --yes
"""


def register(app: typer.Typer) -> None:
    app.command("prune", help=PRUNE_HELP)(prune)


def prune(
    older_than: str = typer.Option(
        ...,
        "--older-than",
        metavar="AGE",
        help="Prune records last changed longer ago than this (e.g. 90d).",
    ),
    archive: str | None = typer.Option(
        None,
        "--archive",
        metavar="FILE",
        help="The new archive file this run writes (required unless --dry-run).",
        show_default=False,
    ),
    status: Annotated[
        str | None, options.status("Only CONFIRMED, or only FAILED (default: both).")
    ] = None,
    provider: Annotated[str | None, options.provider("Only this provider's records.")] = None,
    operation: Annotated[str | None, options.operation("Only this operation's records.")] = None,
    by: Annotated[str | None, options.by("prunes")] = None,
    batch: int = typer.Option(
        200,
        "--batch",
        metavar="N",
        min=1,
        max=10000,
        help="Records per transaction (each batch sealed in the archive, then deleted).",
    ),
    dry_run: Annotated[bool, options.dry_run("Only show what would be pruned.")] = False,
    yes: Annotated[bool, options.yes("Do not ask before pruning.")] = False,
    as_json: Annotated[bool, options.json_output("Print the preview or the run as JSON.")] = False,
) -> None:
    from pathlib import Path

    from ..clock import plus, to_text
    from ..errors import InvalidInput
    from ..retention import prune as do_prune
    from ..selection import parse_duration
    from ..storage.ledger import Prunable
    from .common import check_filters
    from .select import confirm

    seconds = parse_duration(older_than)
    statuses = _statuses(status)
    actor = person(by)
    if archive is None and not dry_run:
        raise InvalidInput("--archive FILE is required: the run writes its records there first")
    target = Path(archive) if archive is not None else None
    if target is not None and target.exists():
        raise InvalidInput(f"archive {target} exists already: name a new file")
    ledger = STATE.ledger(create=False)  # refused on a moved ledger, named
    check_filters(ledger, provider, operation)  # a typo must not read as nothing to prune
    clock = ledger.clock(anchor=False)  # a preview or a refusal writes nothing
    which = Prunable(
        before=to_text(plus(clock.now(), -seconds)),
        statuses=statuses,
        provider=provider,
        operation=operation,
    )
    counts = ledger.prunable(which)
    n = sum(counts.values())
    if as_json and dry_run:
        emit_json(_preview_json(which, counts))
        raise typer.Exit(0)
    if not as_json or (n and not yes and not dry_run):
        _preview(which, counts)
    if dry_run:
        say(f"--dry-run: nothing pruned ({n} record(s) would be)")
        raise typer.Exit(0)
    if not n:
        say("nothing to prune; no archive written")
        if as_json:
            emit_json({"records": 0, "archive": None})
        raise typer.Exit(0)
    if not yes and not confirm(
        n,
        question=f"Archive and remove {n} record(s) and their events?",
        doing="prune",
        asked=True,
    ):
        say("nothing pruned")
        raise typer.Exit(0)
    assert target is not None
    report = do_prune(
        ledger,
        which,
        target,
        actor=actor,
        at=lambda: to_text(clock.now()),
        size=batch,
        probe=STATE.probe,
    )
    if as_json:
        emit_json(report.to_json())
    else:
        say(
            f"pruned {report.records} record(s) and {report.events} event(s) in "
            f"{report.batches} batch(es); archive {report.archive} (sha256 {report.sha256})"
        )


def _statuses(status: str | None) -> tuple[str, ...]:
    from ..errors import InvalidInput

    allowed = tuple(str(s) for s in Status if s in TERMINAL)
    if status is None:
        return allowed
    chosen = tuple(dict.fromkeys(s.strip().upper() for s in status.split(",") if s.strip()))
    bad = [s for s in chosen if s not in allowed]
    if bad or not chosen:
        raise InvalidInput(
            f"--status {status}: only settled records are pruned; use CONFIRMED, FAILED or both"
        )
    return chosen


def _preview_json(which: Any, counts: dict[tuple[str, str, str], int]) -> dict[str, Any]:
    return {
        "before": which.before,
        "records": sum(counts.values()),
        "by": [
            {"status": s, "provider": p, "operation": o, "count": n}
            for (s, p, o), n in sorted(counts.items())
        ],
    }


def _preview(which: Any, counts: dict[tuple[str, str, str], int]) -> None:
    from .render import Col, listing

    rows = [(s, f"{p}/{o}", str(n)) for (s, p, o), n in sorted(counts.items())]
    cols = [
        Col("status", lambda r: r[0]),
        Col("operation", lambda r: r[1]),
        Col("records", lambda r: r[2], right=True),
    ]
    title = f"prune: {sum(counts.values())} settled record(s) last changed before {which.before}"
    if rows:
        listing(cols, rows, "table", title=title, err=True)
    else:
        say(title)
