"""Each CLI verb is its own ``settled/cli/<verb>_cmd.py``, registered in one list
(``settled.cli.commands.COMMANDS``, in ``--help`` order): a module that is not in the
list, or that adds a command other than the one it is named after, fails here."""

from __future__ import annotations

from typing import Any

from support import ROOT
from typer.main import get_command

from settled.cli import commands
from settled.cli.typerapp import App

CLI = ROOT / "settled" / "cli"


def verb_of(module: object) -> str:
    """``migrate_ledger_cmd`` adds ``migrate-ledger``."""
    name = getattr(module, "__name__", "").rsplit(".", 1)[-1]
    return name.removesuffix("_cmd").replace("_", "-")


def added_by(module: commands.Verb) -> list[str]:
    """The commands one module adds to an app of its own."""
    app = App()
    module.register(app)

    @app.callback()
    def _root() -> None:  # a group, even when the module adds a single command
        pass

    return names(app)


def names(app: Any) -> list[str]:
    """The command names of a Typer app's group, in the order they were added."""
    return list(get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_module_is_registered_once() -> None:
    files = sorted(p.stem for p in CLI.glob("*_cmd.py"))
    listed = [getattr(m, "__name__", "").rsplit(".", 1)[-1] for m in commands.COMMANDS]
    assert sorted(listed) == files
    assert len(set(listed)) == len(listed)


def test_no_command_module_defers_its_annotations() -> None:
    """A command's annotations are Typer's options (cli/options.py): as strings
    (``from __future__ import annotations``) Typer would evaluate each several times
    on every start-up."""
    deferred = [p.name for p in CLI.glob("*_cmd.py") if "from __future__ import" in p.read_text()]
    assert deferred == []


def test_each_module_adds_the_verb_it_is_named_after() -> None:
    for module in commands.COMMANDS:
        assert added_by(module) == [verb_of(module)], module


def test_help_lists_the_commands_in_the_order_of_the_list() -> None:
    assert names(commands.app) == [verb_of(m) for m in commands.COMMANDS]


def test_the_entry_points_resolve() -> None:
    """``settled.cli:main`` (the console script) and ``settled.cli:app`` (the Typer app,
    for tools that take one by its import path) both name what they always did."""
    import importlib.metadata

    import settled.cli

    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "settled"
    ]
    assert script.value == "settled.cli:main" and script.load() is settled.cli.main
    assert settled.cli.app is commands.app
