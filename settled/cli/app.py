"""The Typer app: global options, ``--version``, ``-h``, shell completion, and the
commands (each group registers itself from its own module)."""

from __future__ import annotations

import typer

from . import common
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


from . import (  # noqa: E402  (commands register on `app`)
    actions,
    daemon_cmd,
    demo,
    listing,
    mcp_cmd,
    migrate_cmd,
    providers_cmd,
    queue_cmd,
    schema_cmd,
    serve_cmd,
    settle,
    stats_cmd,
    verify_cmd,
)

actions.register(app)
listing.register(app)
queue_cmd.register(app)
settle.register(app)
stats_cmd.register(app)
daemon_cmd.register(app)
providers_cmd.register(app)
demo.register(app)
mcp_cmd.register(app)
schema_cmd.register(app)
migrate_cmd.register(app)
verify_cmd.register(app)
serve_cmd.register(app)
