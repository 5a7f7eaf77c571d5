"""Typer's app and command, as settled's commands use them, through Typer's own hooks
(``Typer.command(cls=...)``, ``TyperCommand.format_options``) rather than by patching
Typer.

One difference: an argument's help names it by its metavar alone. Typer 0.29 prints an
argument's Python type after its name ('ACTION_ID <str>', '[ACTION_ID|-]...
<list[str]>') even when a metavar says what it is, while an option's metavar replaces
its type; every argument here has a metavar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand


class Interrupted(Exception):
    """A ``KeyboardInterrupt`` (Ctrl-C, or ``signals.Terminated``) that ended a command,
    carried past Typer, which turns every one into a silent exit 130; ``cli.main``
    raises it again, to say "interrupted" (130) or "terminated (SIGTERM)" (143)."""

    def __init__(self, interrupt: KeyboardInterrupt) -> None:
        super().__init__()
        self.interrupt = interrupt


class Command(TyperCommand):
    """A command whose help lists arguments by their metavar, options as Typer does,
    and whose interrupts reach ``cli.main`` (``Interrupted``)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Interrupted(exc) from None

    def format_options(self, ctx: Any, formatter: Any) -> None:
        rows: dict[str, list[tuple[str, str]]] = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or param.param_type_name not in rows:
                continue
            name, text = record
            if param.param_type_name == "argument" and param.metavar:
                name = param.metavar
            rows[param.param_type_name].append((name, text))
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if rows[kind]:
                with formatter.section(title):
                    formatter.write_dl(rows[kind])


class App(typer.Typer):
    """A Typer app whose commands are :class:`Command` unless one names its own."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)
