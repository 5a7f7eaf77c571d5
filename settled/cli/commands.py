"""The Typer app: global options, ``--version``, ``-h``, shell completion, and the
commands: ``COMMANDS``, one module per verb, each adding its command itself."""

from __future__ import annotations

from typing import Protocol

import typer

from . import (
    common,
    confirm_cmd,
    daemon_cmd,
    demo_cmd,
    dispatch_cmd,
    log_cmd,
    mcp_cmd,
    migrate_cmd,
    migrate_ledger_cmd,
    providers_cmd,
    prune_cmd,
    queue_cmd,
    reconcile_cmd,
    redact_cmd,
    resolve_cmd,
    retry_cmd,
    serve_cmd,
    show_cmd,
    stats_cmd,
    unlock_cmd,
    verify_cmd,
)
from .typerapp import App

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

app = App(
    name="settled",
    help=(
        "An honest ledger for side effects: never 'done' before the effect is observed.\n\n"
        "Exit codes: 0 done/listed, 1 error, 2 usage, 3 pending, 4 unresolved, 5 failed,"
        " 6 not found, 7 conflict."
    ),
    epilog=(
        "Shell completion: `settled --install-completion` (bash, zsh, fish), or "
        "`settled --show-completion` to print the script."
    ),
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=CONTEXT,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__
        from ..storage import postgres_schema
        from ..storage.sqlite import SCHEMA_VERSION

        typer.echo(
            f"settled {__version__} (ledger schema {SCHEMA_VERSION}; "
            f"PostgreSQL ledger schema {postgres_schema.LATEST})"
        )
        raise typer.Exit(0)


# Commands that take SIGTERM themselves from the very start (cli.signals); for every
# other command it means the end of the process, as it always did.
TAKES_SIGTERM = frozenset({"daemon", "serve"})


@app.callback()
def _globals(
    ctx: typer.Context,
    db: str | None = typer.Option(
        None,
        "--db",
        envvar="SETTLED_DB",
        metavar="PATH",
        help="Ledger file, or a postgresql:// URL (env SETTLED_DB).",
        show_default=False,
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        envvar="SETTLED_CONFIG",
        metavar="PATH",
        help="Config file (env SETTLED_CONFIG; default ./settled.toml when present).",
        show_default=False,
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print settled's version and its ledger schema versions, and exit.",
    ),
) -> None:
    from . import signals

    common.STATE.db = db
    common.STATE.config_path = config
    if ctx.invoked_subcommand not in TAKES_SIGTERM:
        signals.default()


class Verb(Protocol):
    """A command's module (``<verb>_cmd.py``): it adds its command to the app."""

    def register(self, app: typer.Typer) -> None: ...


# Every command, in the order `settled --help` lists them (tests/integration/test_cli_verbs.py): a
# new verb is its own `<verb>_cmd.py`, whose `register(app)` adds it, and one entry here.
COMMANDS: tuple[Verb, ...] = (
    dispatch_cmd,
    confirm_cmd,
    show_cmd,
    queue_cmd,
    reconcile_cmd,
    resolve_cmd,
    retry_cmd,
    stats_cmd,
    daemon_cmd,
    demo_cmd,
    mcp_cmd,
    migrate_cmd,
    migrate_ledger_cmd,
    verify_cmd,
    prune_cmd,
    redact_cmd,
    log_cmd,
    unlock_cmd,
    serve_cmd,
    providers_cmd,  # a group: Typer lists groups after the commands
)

for _command in COMMANDS:
    _command.register(app)
