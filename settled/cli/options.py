"""The options and arguments several commands take, each defined once.

Two forms, both used as ``Annotated`` metadata so that a parameter's type and default
are its own (``as_json: JsonRecord = False``):

- an alias, where every command words the option alike (``Since``, ``Wait``,
  ``JsonRecord``, the selectors ``SelectProvider``…);
- a function taking the one part that says what this command does with it (``by``:
  "Who attests it", ``yes``, ``dry_run``, ``json_output``, ``concurrency``…); the flag
  names, metavar, completion and defaults shown stay here.

Typer reads the annotations when the app is built, so a command module imports these
names at module level, and its annotations are objects, not strings: a ``*_cmd.py``
has no ``from __future__ import annotations``. With it, Typer evaluated every
parameter's annotation string (``Annotated[...]`` built and these functions called)
three or four times per command as it built the app, ≈9 ms of CPU on every run;
evaluated once, at ``def``, building the app costs less than before the aliases.
Nothing here imports more than Typer and ``cli.completion``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .completion import action_ids as complete_action_ids
from .completion import causes, deliveries, operations, providers, statuses

# -- who, and asking first --------------------------------------------------------------


def by(what: str) -> Any:
    """``--by NAME`` as every command that changes a record takes it."""
    return typer.Option(
        "--by",
        metavar="NAME",
        help=f"Who {what} (default: $SETTLED_OPERATOR, else the OS user).",
        show_default=False,
    )


def yes(help: str) -> Any:
    """``--yes``/``-y``: do not ask first."""
    return typer.Option("--yes", "-y", help=help)


def dry_run(help: str) -> Any:
    """``--dry-run``: show, write nothing."""
    return typer.Option("--dry-run", help=help)


def no_recheck(help: str) -> Any:
    """``--no-recheck``: act without asking the provider first (rule 14)."""
    return typer.Option("--no-recheck", help=help)


# -- output ------------------------------------------------------------------------------


def json_output(help: str) -> Any:
    """``--json``: machine output, worded as what it prints."""
    return typer.Option("--json", help=help)


JsonRecord = Annotated[bool, json_output("Print the record as JSON.")]
JsonRecords = Annotated[bool, json_output("Print the record(s) as JSON.")]
JsonReport = Annotated[bool, json_output("Print the report as JSON.")]

# -- sending -----------------------------------------------------------------------------

# What an action sends, read by ``cli.inputs.parse_params`` (dispatch, providers render).
Params = Annotated[
    str | None,
    typer.Option(
        "--params",
        metavar="JSON|@FILE|-",
        help="JSON object, @FILE, or - for stdin (at most 1 MiB).",
    ),
]

Wait = Annotated[bool, typer.Option("--wait", help="Verify in-process until settled.")]
WaitTimeout = Annotated[
    float, typer.Option("--wait-timeout", metavar="S", help="Seconds --wait may take.")
]


def concurrency(help: str) -> Any:
    """``--concurrency N``: requests or queries in flight at once, 1 to 100."""
    return typer.Option("--concurrency", metavar="N", min=1, max=100, show_default=False, help=help)


# -- which actions -----------------------------------------------------------------------


def action_id(help: str) -> Any:
    """One ``ACTION_ID`` argument, completed from the ledger."""
    return typer.Argument(metavar="ACTION_ID", autocompletion=complete_action_ids, help=help)


def action_ids(help: str) -> Any:
    """``[ACTION_ID|-]...``: ids, or - for ids on stdin (``cli.select.read_ids``)."""
    return typer.Argument(
        metavar="[ACTION_ID|-]...",
        autocompletion=complete_action_ids,
        help=help,
        show_default=False,
    )


def provider(help: str) -> Any:
    return typer.Option("--provider", metavar="NAME", autocompletion=providers, help=help)


def operation(help: str) -> Any:
    return typer.Option("--operation", metavar="NAME", autocompletion=operations, help=help)


def status(help: str, metavar: str = "STATUS[,STATUS…]") -> Any:
    return typer.Option(
        "--status", metavar=metavar, autocompletion=statuses, help=help, show_default=False
    )


def older_than(help: str) -> Any:
    return typer.Option("--older-than", metavar="DURATION", help=help)


# The bulk verbs (reconcile, resolve, retry) select as one; queue and stats filter as one.
SelectProvider = Annotated[str | None, provider("Select by provider.")]
SelectOperation = Annotated[str | None, operation("Select by operation.")]
OnlyProvider = Annotated[str | None, provider("Only this provider.")]
OnlyOperation = Annotated[str | None, operation("Only this operation.")]

# The narrowing selectors every bulk verb takes as ``queue`` does (``cli.select``).
Since = Annotated[
    str | None,
    typer.Option("--since", metavar="DURATION", help="Only actions created within e.g. 1h."),
]
Match = Annotated[
    str | None,
    typer.Option(
        "--match",
        metavar="TEXT",
        help="Only actions whose reason or provider reply holds TEXT (any case).",
    ),
]
Search = Annotated[
    str | None,
    typer.Option(
        "--search",
        metavar="WORDS",
        help="Only actions whose id, params values or reason hold every word (any case).",
    ),
]
Cause = Annotated[
    str | None,
    typer.Option(
        "--cause",
        metavar="CAUSE[,…]",
        autocompletion=causes,
        help="Only actions held for these causes: http_503, reply_lost, blind, contradicted…",
    ),
]
Delivery = Annotated[
    str | None,
    typer.Option(
        "--delivery",
        metavar="DELIVERY[,…]",
        autocompletion=deliveries,
        help="Only these deliveries: PENDING, IN_FLIGHT, DELIVERED, FAILED, UNKNOWN.",
    ),
]
