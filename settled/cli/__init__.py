"""The command line: parse, call the core, render. Nothing else lives here.

Errors are converted to exit codes and one-line messages in ``main`` only.
Heavy imports (httpx, rich.table, sqlite-utils, apscheduler) happen inside the
commands that need them, so ``settled show ID --json`` starts fast.
"""

from __future__ import annotations

import os
import sys

import typer

from . import common

app = typer.Typer(
    name="settled",
    help="An honest ledger for side effects: never 'done' before the effect is observed.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _globals(
    db: str = typer.Option(
        None, "--db", envvar="SETTLED_DB", help="Ledger file (env SETTLED_DB).", show_default=False
    ),
    config: str = typer.Option(
        None,
        "--config",
        envvar="SETTLED_CONFIG",
        help="Config file (env SETTLED_CONFIG; default ./settled.toml when present).",
        show_default=False,
    ),
) -> None:
    common.STATE.db = db
    common.STATE.config_path = config


from . import actions, daemon_cmd, demo, migrate_cmd, providers_cmd, settle  # noqa: E402  (commands register on `app`)

actions.register(app)
settle.register(app)
daemon_cmd.register(app)
providers_cmd.register(app)
demo.register(app)
migrate_cmd.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exit codes per DESIGN.md §2, never a traceback.

    Typer/Click handle usage errors (exit 2) and ``typer.Exit`` codes themselves;
    everything else is converted here, in one place."""
    from ..errors import SettledError

    debug = bool(os.environ.get("SETTLED_DEBUG"))
    code = 0
    try:
        app(args=argv, prog_name="settled")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(f"settled: error: {exc.code}", file=sys.stderr)
    except SettledError as exc:
        if debug:
            raise
        print(f"settled: error: {common.one_line(str(exc))}", file=sys.stderr)
        code = common.exit_for(exc)
    except KeyboardInterrupt:
        print("settled: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:  # the one broad catch: a bug must not show a traceback
        if _is_click_error(exc):
            exc.show()  # type: ignore[attr-defined]
            code = exc.exit_code  # type: ignore[attr-defined]
        elif debug:
            raise
        else:
            print(
                f"settled: internal error: {type(exc).__name__}: {common.one_line(str(exc))} "
                "(set SETTLED_DEBUG=1 for the traceback)",
                file=sys.stderr,
            )
            code = 1
    finally:
        common.STATE.close()
    sys.exit(code)


def _is_click_error(exc: BaseException) -> bool:
    """A Click-family error (Click's own, or the copy Typer vendors) raised by a
    command outside Typer's own handling: it carries its message and exit code
    (2 for usage errors)."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)
