"""Usage errors are Click's own (exit 2 with a usage line), never an "internal error":
Typer 0.29+ raises the exceptions of its vendored Click, which the CLI boundary must
recognise as well."""

from __future__ import annotations

import pytest

from conftest import run_cli


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
