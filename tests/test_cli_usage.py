"""Usage errors are Click's: exit 2 with Click's message, whichever copy of Click
Typer raises them from, and never an "internal error"."""

from __future__ import annotations

import pytest
from support import run_cli


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
