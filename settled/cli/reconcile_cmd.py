"""reconcile: settling what dispatch left open, by evidence (a person's verdict: resolve_cmd.py)."""

import sys
from typing import Annotated, Any

import typer

from ..display import one_line, term
from . import options
from .common import (
    EXIT_BY_STATUS,
    EXIT_NOT_FOUND,
    STATE,
    emit_json,
    operator,
)
from .render import STATUS_STYLE, console, is_tty, text

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

With - (ids on stdin, one a line; the header of `queue -o tsv` is skipped) or the
selectors of `settled queue` (--provider, --operation, --status, default
DENIED_UNRESOLVED, --older-than, --since, --match, --search, --cause and --delivery;
each only narrows): first shows what it would check and asks on a terminal; --yes skips
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
  settled reconcile --cause http_503 --provider mail --yes
  settled queue --match "HTTP 503" -o name | settled reconcile - --yes
  settled reconcile --due --limit 500 --json | jq .counts
"""


def change_line(ch: Any, make: Any = text) -> Any:
    """One status move (or a check that moved nothing) as it is printed; ``make`` is
    ``render.text`` (a rich Text) or ``plain`` (the same characters as a string)."""
    to = str(ch.to_status)
    return make(
        (ch.action_id, "bold"),
        f"  {ch.from_status} → ",
        (to, STATUS_STYLE.get(to, "")),
        f"  ({ch.kind})",
    )


def plain(*parts: object, style: str | None = None) -> str:
    """What ``render.text(*parts)`` holds, as a string: the characters a pipe gets,
    without building a rich Text (or importing rich) for them."""
    return "".join(term(p[0] if isinstance(p, tuple) else p) for p in parts)


def render_summary(report: Any) -> None:
    for ch in report.skipped:
        if ch.kind != "waiting":
            _say(f"{ch.action_id}  {ch.from_status}  ({ch.kind})")
            _say("  why:  ", one_line(ch.reason))
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts().items())) or "no status change"
    waiting = len(report.waiting)
    tail = f"; {waiting} still waiting" if waiting else ""
    stopped = " (stopped early; the rest was handed back)" if report.stopped else ""
    _say(f"examined {report.examined}: {counts}{tail}{stopped}", stderr=True)


def _say(*parts: object, stderr: bool = False) -> None:
    """One line through rich on a terminal; off one, its characters as they are (a
    cron run or a pipe does not load rich for the pass's last line)."""
    stream = sys.stderr if stderr else sys.stdout
    if is_tty(stream):
        console(stderr=stderr).print(text(*parts))
    else:
        stream.write(plain(*parts) + "\n")
        stream.flush()


def _reconcile(
    ids: list[str],
    due: bool,
    limit: int | None,
    as_json: bool,
    log: str,
    concurrency: int | None = None,
    actor: str = "reconciler",
) -> Any:
    """Run the pass; stream what it does (human lines on stdout, or JSON log lines on
    stderr) as each result commits."""
    from ..log import check_failed, failed, json_lines, transition

    jlog = json_lines() if log == "json" else None
    human = not as_json and jlog is None
    if due:
        total = None if limit is None else limit
    else:
        total = len(ids)
    # Off a terminal a result is a plain line, written by a thread of its own: the
    # pass's thread (which leases, decides and commits) neither renders it with rich
    # nor waits for the pipe (≈ 0.3 ms a row on its thread, docs/performance.md).
    lines = PlainLines() if human and not is_tty(sys.stdout) else None
    with _progress(total, enabled=not as_json) as bar:

        def on_change(ch: Any) -> None:
            bar.advance()
            if jlog is not None:
                if failed(ch):  # the attempt that gave it up could not check either
                    jlog(check_failed(ch, "reconcile"))
                jlog(transition(ch, "reconcile"))
            if lines is not None:
                lines.put((True, ch))
            elif human:
                for line in _lines((True, ch)):
                    bar.line(line)

        def on_check(ch: Any) -> None:
            bar.advance()
            if jlog is not None and failed(ch):
                jlog(check_failed(ch, "reconcile"))
            if lines is not None:
                lines.put((False, ch))
            elif human:
                for line in _lines((False, ch)):
                    bar.line(line)

        r = STATE.reconciler(concurrency, on_change=on_change, on_check=on_check, actor=actor)
        try:
            report = r.run_due(limit) if due else r.run_ids(ids)
        finally:
            if lines is not None:
                lines.close()
    if jlog is not None:
        from ..log import pass_line

        jlog(pass_line(report, "reconcile"))
    return report


def _lines(item: tuple[bool, Any], make: Any = text) -> list[Any]:
    """What one result prints: a status move (``True``) or a check that moved nothing;
    rich Texts, or strings with ``make=plain``."""
    from ..log import failed

    moved, ch = item
    out = [change_line(ch, make)] if moved else []
    if failed(ch):
        out.append(_check_failed_line(ch, make))
    elif not moved:
        out.append(make((ch.action_id, "bold"), f"  {ch.from_status}  (still waiting)"))
    out.append(make("  why:  ", one_line(ch.reason)))
    return out


class PlainLines:
    """Lines of results written to stdout as plain text by a thread of their own, in
    order. ``close`` writes what is left and waits; a stream that failed (a reader that
    went away) is raised there, once the pass has run, and nothing more is written."""

    def __init__(self) -> None:
        import queue
        import threading

        self._queue: Any = queue.SimpleQueue()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._write, name="settled-lines", daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def _write(self) -> None:
        out = sys.stdout
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    out.write("".join(f"{line}\n" for line in _lines(item, plain)))
                except OSError as exc:
                    self._error = exc
        try:
            out.flush()
        except OSError as exc:
            self._error = self._error or exc

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None and sys.exc_info()[1] is None:
            raise self._error


def _check_failed_line(ch: Any, make: Any = text) -> Any:
    from ..log import error_class

    return make((ch.action_id, "bold"), f"  {ch.from_status}  (check_failed: {error_class(ch)})")


def _unusable(report: Any, log: str) -> bool:
    """Say, in one line on stderr, which configured providers cannot be built at all;
    whether there were any."""
    if not report.unusable:
        return False
    if log == "json":
        from ..log import json_lines, unusable

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
    action_ids: Annotated[
        list[str] | None, options.action_ids("Records to check now; - reads ids from stdin.")
    ] = None,
    due: bool = typer.Option(False, "--due", help="One pass over everything due (cron)."),
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
    concurrency: Annotated[
        int | None,
        options.concurrency(
            "Queries in flight at once (default [reconcile] concurrency, else each provider's)."
        ),
    ] = None,
    dry_run: Annotated[bool, options.dry_run("Only show what would be checked.")] = False,
    yes: Annotated[bool, options.yes("Do not ask before checking a selection.")] = False,
    by: Annotated[str | None, options.by("asks for the checks")] = None,
    as_json: Annotated[bool, options.json_output("Print the pass report as JSON.")] = False,
) -> None:
    from .select import Selectors, read_ids

    if log not in ("text", "json"):
        raise _usage(f"--log {log!r}: use text or json")
    actor = operator(by)
    chosen = read_ids(action_ids)
    sel = Selectors(
        provider, operation, status, older_than, since, match, search, cause, delivery
    ).check()
    if due and (chosen.given or sel.given):
        raise _usage("--due is a pass over everything due: give no ACTION_IDs or selectors with it")
    if due and (dry_run or yes):
        raise _usage("--dry-run and --yes apply to ACTION_IDs, - and selectors, not --due")
    if not due and not chosen.given and not sel.given:
        raise _usage(
            "give ACTION_IDs to check, - (ids on stdin), selectors such as --provider, "
            "or --due for a pass over what is due"
        )
    if limit is not None and not (due or sel.given):
        raise _usage("--limit applies to --due and to selectors")
    if due or (chosen.ids and not chosen.from_stdin and not sel.given and not dry_run):
        report = _reconcile(chosen.ids, due, limit, as_json, log, concurrency, actor)
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
            actor=actor,
        )
    )


def _usage(message: str) -> Exception:
    """Click's usage error (exit 2), Click loaded only to say it."""
    import click

    return click.UsageError(message)


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
    report = _reconcile(
        todo, False, None, opt["as_json"], opt["log"], opt["concurrency"], opt["actor"]
    )
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
    app.command(help=RECONCILE_HELP)(reconcile)
