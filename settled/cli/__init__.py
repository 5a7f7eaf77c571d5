"""The command line: parse, call the core, render. Nothing else lives here.

Errors are converted to exit codes and one-line messages in ``main`` only.
Heavy imports (httpx, rich.table, sqlite-utils, apscheduler) happen inside the
commands that need them, so ``settled show ID --json`` starts fast.
"""

from __future__ import annotations

import os
import sqlite3
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


from . import actions, demo, providers_cmd  # noqa: E402  (commands register on `app`)

actions.register(app)
providers_cmd.register(app)
demo.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exit codes per DESIGN.md §2, never a traceback."""
    from ..errors import SettledError

    # Click's exception classes as Typer raises them: its own copy of Click (Typer ≥ 0.2x)
    # or Click itself. Found through a public name, and without importing Click.
    click = sys.modules[typer.BadParameter.__module__]

    debug = bool(os.environ.get("SETTLED_DEBUG"))
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="settled")
    except click.UsageError as exc:
        exc.show()
        code = 2
    except typer.Abort:
        print("settled: aborted", file=sys.stderr)
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except SettledError as exc:
        if debug:
            raise
        print(f"settled: error: {common.one_line(str(exc))}", file=sys.stderr)
        code = exc.exit_code
    except sqlite3.DatabaseError as exc:
        if debug:
            raise
        print(f"settled: error: ledger: {common.one_line(str(exc))}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("settled: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:  # the one broad catch: a bug must not show a traceback
        if debug:
            raise
        print(
            f"settled: internal error: {type(exc).__name__}: {common.one_line(str(exc))} "
            "(set SETTLED_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        code = 1
    else:
        code = rv if isinstance(rv, int) else 0
    finally:
        common.STATE.close()
    sys.exit(code)
