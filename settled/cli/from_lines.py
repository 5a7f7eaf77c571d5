"""`dispatch --from FILE|-`: many actions from JSON lines (``settled.bulk`` does the work).

Machine output (``--json``) is one JSON line per action on stdout as each settles,
then one summary line; people get the problems on stderr, a progress bar there when
it is a terminal, and the summary by status on stdout. The exit code is 0 when every
line did what was asked, else the highest code among the lines (the exit codes in the README).

Ctrl-C or SIGTERM stops the run in order, wherever it lands (``_stop_on_signal``): no
line is read and no request starts after it; the requests already out are waited for
(each within its request budget) and their outcomes written; what was claimed but
never sent is released (FAILED, "never sent": ``settled retry`` may send it); then the
summary, and "interrupted" (130) or "terminated (SIGTERM)" (143). A second signal
stops the wait: the actions still in flight stay IN_FLIGHT until their lease lapses
and reconciliation settles them.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from ..display import one_line
from . import signals
from .common import (
    EXIT_BY_STATUS,
    EXIT_CONFLICT,
    EXIT_ERROR,
    STATE,
    exit_for,
    report_exit,
    stdout_gone,
)


def line_exit(settled: Any) -> int:
    """One line's exit code: a bad line 1, a conflict 7, else as a single dispatch."""
    if settled.report is None:
        return EXIT_CONFLICT if settled.conflict else EXIT_ERROR
    return report_exit(settled.report)


@contextmanager
def _source(path: str) -> Iterator[IO[bytes]]:
    from ..errors import InvalidInput

    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InvalidInput(f"--from {path}: file not found") from None
    except OSError as exc:
        raise InvalidInput(f"--from {path}: cannot read: {exc.strerror}") from None
    try:
        yield fh
    finally:
        fh.close()


def check_bulk_options(
    source: str | None,
    params: str | None,
    action_id: str | None,
    needs_confirmation: bool,
    wait: bool,
) -> str:
    """The --from source, once the options given with it are ones it takes."""
    import click

    if source is None:
        raise click.UsageError("--concurrency applies to --from only")
    given = [
        name
        for name, on in (
            ("--params", params is not None),
            ("--action-id", action_id is not None),
            ("--needs-confirmation", needs_confirmation),
            ("--wait", wait),
        )
        if on
    ]
    if given:
        raise click.UsageError(f"--from takes each line's action_id and params; drop {given[0]}")
    return source


def dispatch_from(
    provider: str, operation: str, path: str, concurrency: int | None, as_json: bool
) -> int:
    from ..bulk import read_lines
    from ..display import term
    from ..errors import SettledError
    from ..throttle import Gate

    threads = STATE.send_concurrency(provider, concurrency)
    d = STATE.dispatcher(actor="dispatch")
    counts: dict[str, int] = {}
    code = 0
    lines = 0
    written = 0  # JSON lines that reached stdout
    gone = False  # stdout's reader went away: read no more lines, report the rest
    err = sys.stderr
    with _source(path) as fh, _progress() as tick, _stop_on_signal() as stopped:
        results = d.submit_many(
            provider,
            operation,
            read_lines(fh),
            concurrency=threads,
            gate=Gate(threads),
            stop_requested=lambda: gone or stopped() is not None,
        )
        try:
            for r in results:
                lines += 1
                code = max(code, line_exit(r))
                key = (
                    str(r.report.record.status)
                    if r.report and r.report.record
                    else ("conflict" if r.conflict else "invalid")
                )
                counts[key] = counts.get(key, 0) + 1
                if as_json and not gone:
                    try:
                        sys.stdout.write(
                            json.dumps(r.to_json(), ensure_ascii=False, default=str) + "\n"
                        )
                        sys.stdout.flush()
                        written += 1
                    except OSError as exc:
                        if not stdout_gone(exc):
                            raise
                        gone = True
                elif r.report is None:
                    what = "conflict" if r.conflict else "bad line"
                    err.write(f"settled: line {r.line}: {what}: {term(one_line(r.problem))}\n")
                tick(lines)
        except SettledError as exc:
            err.write(f"settled: error: {one_line(str(exc))}\n")
            code = max(code, exit_for(exc))
    if not gone:
        try:
            _summary(counts, lines, code, as_json)
        except OSError as exc:
            if not stdout_gone(exc):
                raise
            gone = True
    if gone:
        err.write(f"settled: {_closed(counts, lines, written, code)}\n")
    came = stopped()
    if came is not None:  # after the summary: main says "interrupted" and exits 130 (143)
        raise signals.Terminated if came == signal.SIGTERM else KeyboardInterrupt
    return code


@contextmanager
def _stop_on_signal() -> Iterator[Callable[[], int | None]]:
    """While a bulk run runs, SIGINT and SIGTERM ask it to stop (the module says how)
    instead of raising wherever they land, which could leave a group claimed but never
    handed to the pool, or outcomes received but never written. Yields what says which
    signal came (None: none yet); a second one raises at once."""
    came: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if came:  # the second: stop waiting
            raise signals.Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        came.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (settled embedded in another program)
        yield lambda: None
        return
    if signals.take(handler):  # a SIGTERM came during start-up
        came.append(signal.SIGTERM)
    try:
        yield lambda: came[0] if came else None
    finally:
        signal.signal(signal.SIGINT, previous)
        signals.hold()  # SIGTERM is noted again, as main left it


def _closed(counts: dict[str, int], lines: int, written: int, code: int) -> str:
    """One line for a stdout closed under a bulk run: what was done, and where to see it."""
    done = ", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing"
    return (
        f"stdout was closed after {written} of {lines} line(s) were printed; no line was "
        f"read after that, and each line read is recorded ({done}); exit {code}, the "
        "highest among them; see `settled queue --status all`"
    )


def _summary(counts: dict[str, int], lines: int, code: int, as_json: bool) -> None:
    order = [str(s) for s in EXIT_BY_STATUS] + ["conflict", "invalid"]
    by = {k: counts[k] for k in order if k in counts}
    if as_json:
        sys.stdout.write(json.dumps({"summary": by, "lines": lines, "exit_code": code}) + "\n")
        sys.stdout.flush()
        return
    text = ", ".join(f"{n} {k}" for k, n in by.items()) or "nothing to do"
    sys.stdout.write(f"{lines} line(s): {text}\n")


@contextmanager
def _progress() -> Iterator[Any]:
    """The command line's progress bar on stderr when it is a terminal; else nothing."""
    from .progress import Progress

    with Progress("dispatching", None) as bar:
        yield lambda n: bar.advance()
