"""Usage errors are Click's: exit 2 with Click's message, whichever copy of Click
Typer raises them from, and never an "internal error"."""

from __future__ import annotations

import pytest
from support import run_cli

pytestmark = pytest.mark.ledger_free


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("show",), "Missing argument"),
        (("bogus",), "No such command"),
        (("show", "a", "--nope"), "No such option"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], says: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("command", "argument"),
    [
        ("confirm", "ACTION_ID"),
        ("show", "ACTION_ID...|-"),
        ("resolve", "[ACTION_ID|-]..."),
        ("providers render", "PROVIDER"),
        ("migrate-ledger", "FROM"),
    ],
)
def test_help_names_an_argument_by_its_metavar_alone(command: str, argument: str) -> None:
    """Typer's own layout prints the Python type after it ('ACTION_ID <str>')."""
    out = run_cli(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    section = out.stdout.split("Arguments:\n", 1)[1].split("\n\n", 1)[0]
    (row,) = [line for line in section.splitlines() if line.strip().startswith(argument)]
    assert row.split()[0] == argument
    assert "<" not in row, row
