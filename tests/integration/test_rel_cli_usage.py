"""Usage errors are Click's own (exit 2 with a usage line), never an "internal error":
Typer 0.29+ raises the exceptions of its vendored Click, which the CLI boundary must
recognise as well."""

from __future__ import annotations

import pytest
from support import run_cli

pytestmark = [pytest.mark.ledger_free, pytest.mark.slow]


@pytest.mark.parametrize(
    "argv",
    [
        ["dispatch"],
        ["dispatch", "sim"],
        ["confirm"],
        ["show"],
        ["queue", "--bogus"],
        ["queue", "--limit", "x"],
        ["queue", "--limit", "0"],
        ["dispatch", "sim", "book", "--wait-timeout", "soon"],
        ["no-such-command"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    done = run_cli(*argv)
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert "Usage: settled" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["queue", "--older-than", "1e308d"],
        ["queue", "--older-than", "99999999999999"],
        ["queue", "--older-than", "1e20"],
        ["queue", "--older-than", "2e9d"],
    ],
)
def test_out_of_range_values_are_bad_input_not_internal_errors(argv: list[str]) -> None:
    done = run_cli(*argv)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("settled: error: bad duration"), done.stderr
    assert "internal error" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_limit_beyond_sqlite_integers_just_lists_everything(ledger: object) -> None:
    done = run_cli("queue", "--status", "all", "--limit", "99999999999999999999999", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
