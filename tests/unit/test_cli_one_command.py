"""``settled VERB ...`` builds only VERB's Click command (``cli.commands.app_for``):
what the user sees is the same as from the app with every command built, for every
verb's help and for usage errors, and anything that lists or guesses the commands
gets them all."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from settled.cli import commands
from settled.cli.commands import app, app_for

pytestmark = pytest.mark.ledger_free

VERBS = sorted(
    {commands._command_name(c) or "" for c in app.registered_commands}
    | {g.name or "" for g in app.registered_groups}
)


def answer(which: typer.Typer, args: list[str]) -> tuple[int, str]:
    got = CliRunner().invoke(which, args, prog_name="settled")
    return got.exit_code, got.output


def test_every_verb_is_found() -> None:
    assert len(VERBS) == len(commands.COMMANDS) and "" not in VERBS
    for verb in VERBS:
        trimmed = app_for([verb])
        assert trimmed is not app
        names = [commands._command_name(c) for c in trimmed.registered_commands]
        names += [g.name for g in trimmed.registered_groups]
        assert names == [verb]


@pytest.mark.parametrize("verb", VERBS)
def test_a_verbs_help_and_its_usage_errors_read_as_with_every_command(verb: str) -> None:
    for args in (
        [verb, "--help"],
        [verb, "--no-such-option"],
        ["--db", "x.db", verb, "--help"],
        ["--config=c.toml", verb, "-h"],
    ):
        trimmed = app_for(args)
        assert trimmed is not app, args
        assert answer(trimmed, args) == answer(app, args), args


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["-h", "show"],
        ["--version"],
        ["bogus"],
        ["shw", "x"],  # Click's "Did you mean" needs every name
        ["--", "show"],
        ["--db"],
        ["--show-completion", "bash"],
    ],
)
def test_what_lists_or_guesses_commands_gets_every_one(args: list[str]) -> None:
    assert app_for(args) is app


def test_shell_completion_gets_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_SETTLED_COMPLETE", "complete_bash")
    assert app_for(["show", "x"]) is app


def test_the_subgroup_is_built_alone_with_its_own_commands() -> None:
    trimmed = app_for(["providers", "audit"])
    assert [g.name for g in trimmed.registered_groups] == ["providers"]
    assert not trimmed.registered_commands
    assert answer(trimmed, ["providers", "--help"]) == answer(app, ["providers", "--help"])
