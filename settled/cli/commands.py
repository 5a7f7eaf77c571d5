"""The Typer app: global options, ``--version``, ``-h``, shell completion, and the
commands: ``COMMANDS``, one module per verb, each adding its command itself."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Protocol

import typer
from typer.main import get_command_name
from typer.models import CommandInfo

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


# The global options that take a value (``--db PATH``), so the verb can be found after
# them; any other option before the verb builds every command.
_VALUED = ("--db", "--config")
# What Click's shell completion sets for prog_name "settled" (``cli._run`` passes it).
_COMPLETING = "_SETTLED_COMPLETE"


def app_for(args: Sequence[str]) -> typer.Typer:
    """The app as Click needs to see it for ``settled ARGS``: only the command ARGS names
    (with the global options and their callback) when it names one, else every command.

    Typer turns every command of an app into a Click command before it parses anything:
    for 21 verbs that is about 35 ms of every process's start, three quarters of what a
    read command such as ``settled queue --json`` does once its modules are loaded
    (docs/performance.md, "One command built"). One command's help, options, errors and exit
    codes are the same whichever commands sit beside it, so only what lists or guesses
    the commands gets them all: no verb, an unknown one (Click's "No such command"),
    ``--help`` or another option before the verb, and shell completion."""
    if _COMPLETING in os.environ:
        return app
    verb = _verb(args)
    if verb is None:
        return app
    commands = [c for c in app.registered_commands if _command_name(c) == verb]
    groups = [g for g in app.registered_groups if g.name == verb]
    if len(commands) + len(groups) != 1:
        return app
    trimmed = copy.copy(app)  # the same info, callback and settings; the one command
    trimmed.registered_commands = commands
    trimmed.registered_groups = groups
    return trimmed


def _verb(args: Sequence[str]) -> str | None:
    """The command ``settled ARGS`` runs, when only global options that take a value come
    before it; None when anything else does (then every command is built)."""
    tokens = iter(args)
    for token in tokens:
        if token in _VALUED:
            next(tokens, None)
        elif token.partition("=")[0] in _VALUED:
            continue
        elif token.startswith("-"):
            return None
        else:
            return token
    return None


def _command_name(info: CommandInfo) -> str | None:
    if info.name:
        return info.name
    return get_command_name(info.callback.__name__) if info.callback else None
