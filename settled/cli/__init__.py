"""The command line: parse, call the core, render. Nothing else lives here.

Errors are converted to exit codes and one-line messages in ``main`` only. This
module stays tiny: the Typer app (``settled.cli.commands``) is imported inside ``main``,
so a Ctrl-C at any moment of start-up ends with "interrupted" and exit 130, never a
traceback. Heavy imports (httpx, rich.table, sqlite-utils, apscheduler) happen
inside the commands that need them, so ``settled show ID --json`` starts fast.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def __getattr__(name: str) -> Any:
    """``settled.cli:app``, the Typer app, for tools that take an app by its import
    path; loaded on first use, so ``import settled.cli`` stays light (PEP 562)."""
    if name == "app":
        from .commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exit codes per the exit codes in the README, never a traceback.

    Typer/Click handle usage errors (exit 2) and ``typer.Exit`` codes themselves;
    everything else is converted here, in one place."""
    try:
        from . import signals
    except KeyboardInterrupt:  # while the signal module itself was being imported
        _quiet_interrupt()
        sys.exit(130)

    previous = signals.hold()  # until the command says what SIGTERM means for it (cli.signals)
    code = 1
    try:
        code = _run(argv)
        signals.returned()  # inside the try: one that comes before it is caught below
    except signals.Terminated:
        _quiet_interrupt("terminated (SIGTERM)")
        code = 143
    except KeyboardInterrupt:
        signals.returned()  # a SIGTERM while Ctrl-C is said is noted, not raised
        _quiet_interrupt()
        code = 130
    finally:
        try:
            from . import common

            common.STATE.close()
        except BaseException:  # noqa: S110 - closing after an interrupt: nothing left to report
            pass
    if signals.held() and code != 143:  # it came while nothing took it (help, --version,
        # the record being printed after a first SIGTERM, the ledger being closed)
        _quiet_interrupt("terminated (SIGTERM)")
        code = 143
    signals.restore(previous)
    sys.exit(code)


def _quiet_interrupt(what: str = "interrupted") -> None:
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while we say so
    except ValueError:  # not the main thread
        pass
    try:
        print(f"settled: {what}", file=sys.stderr)
    except (OSError, ValueError):
        pass


def _run(argv: list[str] | None) -> int:
    import gc

    from typer.main import get_command

    from ..errors import SettledError
    from . import common, completion
    from .commands import app_for
    from .typerapp import Interrupted

    # What start-up made (modules, classes, the app: ≈35,000 objects) lives as long as the
    # process, so the collector never needs to look at it again. Unfrozen, one full
    # collection of it took ≈50 ms on a loaded 2-core machine, and a pause like that in
    # the middle of a bulk send was enough to spend a request's whole deadline (0.3 s).
    gc.freeze()
    debug = bool(os.environ.get("SETTLED_DEBUG"))
    common.STATE.close()  # main() may run more than once in a process (tests, embedding)
    try:
        command = get_command(app_for(sys.argv[1:] if argv is None else argv))
        completion.install()  # after Typer registered its own completion classes, in get_command
        # Not standalone: Click's own errors come here, to be shown through the sanitizer.
        rv = command.main(args=argv, prog_name="settled", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SystemExit as exc:
        if isinstance(exc.code, int):
            return exc.code
        if exc.code is None:
            return 0
        print(f"settled: error: {exc.code}", file=sys.stderr)
        return 1
    except common.AfterSend as exc:  # the request left: the record's code, whatever failed
        if debug:
            raise
        print(f"settled: {_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except SettledError as exc:
        if debug:
            raise
        print(f"settled: error: {_line(exc)}", file=sys.stderr)
        return common.exit_for(exc)
    except KeyboardInterrupt:
        raise
    except Interrupted as exc:  # a command's, carried past Typer (cli.typerapp)
        raise exc.interrupt from None
    except Exception as exc:  # the one broad catch: a bug must not show a traceback
        if _is_click_error(exc):
            _show_click_error(exc)
            return exc.exit_code  # type: ignore[attr-defined,no-any-return]
        if type(exc).__name__ == "Abort":  # Click's: end of input at a prompt
            print("Aborted!", file=sys.stderr)
            return 1
        if debug:
            raise
        print(
            f"settled: internal error: {type(exc).__name__}: {_line(exc)} "
            "(set SETTLED_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _show_click_error(exc: BaseException) -> None:
    """A usage error as Click words it, with what the user typed written out safely
    (an option or command name may carry escape characters)."""
    import io

    from ..display import term

    buf = io.StringIO()
    exc.show(file=buf)  # type: ignore[attr-defined]
    sys.stderr.write("\n".join(term(line, limit=2000) for line in buf.getvalue().split("\n")))
    sys.stderr.flush()


def _line(exc: BaseException) -> str:
    """An error's message as one safe line: no markup is involved, but control and
    escape characters from ids or provider text are written out (rule 13)."""
    from ..display import one_line, term

    return term(one_line(str(exc)), limit=2000)


def _is_click_error(exc: BaseException) -> bool:
    """A Click-family error (Click's own, or the copy Typer vendors) raised by a
    command outside Typer's own handling: it carries its message and exit code
    (2 for usage errors)."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)
