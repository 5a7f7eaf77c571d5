"""Typer's app and command, as settled's commands use them, through Typer's own hooks
(``Typer(cls=...)``, ``Typer.command(cls=...)``, ``TyperCommand.format_options``,
``get_params``) rather than by patching Typer.

One place leans on Typer's private names (``typer._coercion``, a parameter's lazy
``_runtime_param``), and does nothing with a Typer that lacks them: the check of plain
option values that spares a command's start-up loading pydantic (``_light``).

One difference: an argument's help names it by its metavar alone. Typer 0.29 prints an
argument's Python type after its name ('ACTION_ID <str>', '[ACTION_ID|-]...
<list[str]>') even when a metavar says what it is, while an option's metavar replaces
its type; every argument here has a metavar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


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

    def get_params(self, ctx: Any) -> list[Any]:
        return _light(super().get_params(ctx))

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


class Group(TyperGroup):
    """A group (the app, ``settled providers``) whose options are checked as a
    :class:`Command`'s are."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _light(super().get_params(ctx))


class App(typer.Typer):
    """A Typer app whose commands are :class:`Command` unless one names its own, and
    whose group is a :class:`Group`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(*args, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


def _light(params: list[Any]) -> list[Any]:
    """Give each of ``params`` that takes a plain value a check that needs no pydantic:
    a ``bool``, a ``str``, a list of them, an ``int`` or a ``float`` written in plain
    digits inside its bounds. Typer 0.2x checks every value of the command that runs
    (even a flag left out, even ``--help``'s) through a pydantic ``TypeAdapter`` built
    on first use, and loading pydantic for it is about a third of the start-up of a
    read-only command such as ``settled show ID --json`` (docs/performance.md, "Cold
    start"). A value
    this cannot vouch for (another type, a clamp, a number out of bounds or spelled
    another way, bytes) goes to Typer's own check, so every answer and every error
    message stays Typer's. With a Typer that has no such check this does nothing."""
    light = _light_class()
    if light is None:
        return params
    for param in params:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(param, "_runtime_param", None) is not None:
            continue
        info = desc.parameter_info
        if desc.is_file or desc.is_path or desc.is_choice or info.parser is not None:
            continue
        if desc.annotation in _PLAIN and not info.clamp:
            light_check = light(parameter_info=info, annotation=desc.annotation)
            param._runtime_param = light_check  # noqa: SLF001  (Typer's lazy slot for it)
    return params


_PLAIN = (bool, str, int, float, list[str])
_LIGHT: list[Any] = []


def _light_class() -> Any:
    """Typer's ``RuntimeParam`` (which answers a missing value and multiple values)
    with a check of its own for the plain cases, and Typer's for the rest; ``None`` for
    a Typer without one. Made on first use: Typer's names it builds on are private."""
    if _LIGHT:
        return _LIGHT[0]
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:  # an older Typer: Click's own types, no pydantic
        _LIGHT.append(None)
        return None
    import re

    digits = re.compile(r"-?[0-9]{1,18}")
    decimal = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")

    class Light(RuntimeParam):
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind, info = self.annotation, self.parameter_info
            if (kind is bool and type(value) is bool) or (kind is str and type(value) is str):
                return value
            if kind == list[str] and isinstance(value, list | tuple):
                if all(type(v) is str for v in value):
                    return list(value)
            if kind is int or kind is float:
                number = value if type(value) is kind else None
                if type(value) is str and (digits if kind is int else decimal).fullmatch(value):
                    number = kind(value)
                if number is not None and (info.min is None or number >= info.min):
                    if info.max is None or number <= info.max:
                        return number
            full = build_runtime_param(param.type_descriptor)  # Typer's check and words
            param._runtime_param = full  # noqa: SLF001  (built once, as Typer would)
            return full._coerce_value(value, param=param, ctx=ctx)  # noqa: SLF001

    _LIGHT.append(Light)
    return Light
