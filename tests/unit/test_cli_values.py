"""The CLI's own check of plain option values (``cli.typerapp``, which spares a
command's start-up pydantic) gives what Typer's check gives: the same value of the
same type, or the same usage error with the same message, for every value tried."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from settled.cli.typerapp import App

pytestmark = pytest.mark.ledger_free

VALUES = {
    "text": ["x", "", "-", "é ü", "  padded  ", "1", "a\tb"],
    "count": ["5", "007", "0", "-3", "100", "101", "1_000", " 5", "+5", "abc", "5.0", "9" * 25],
    "number": ["0", "2", "2.5", "-0.5", "007.10", "1e3", "nan", "inf", " 2", "x", "1_0"],
    "bounded": ["0.1", "1", "10", "10.5", "-1", "5"],
}


def app_of(kind: type[typer.Typer]) -> typer.Typer:
    app = kind(add_completion=False)

    @app.command()
    def run(
        ids: list[str] | None = typer.Argument(None),  # noqa: B008  (Typer's way)
        text: str | None = typer.Option(None, "--text"),
        count: int | None = typer.Option(None, "--count", min=1, max=100),
        free: int = typer.Option(7, "--free"),
        number: float = typer.Option(2.0, "--number"),
        bounded: float | None = typer.Option(None, "--bounded", min=0.5, max=10.0),
        flag: bool = typer.Option(False, "--flag"),
    ) -> None:
        values = [ids, text, count, free, number, bounded, flag]
        print(json.dumps([[type(v).__name__, repr(v)] for v in values]))

    @app.command()
    def other() -> None:  # two commands: `run` is a subcommand, as settled's are
        pass

    return app


def answers(kind: type[typer.Typer], *args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app_of(kind), ["run", *args])
    return out.exit_code, out.output


CASES: list[tuple[str, ...]] = [()]
CASES += [(f"--{opt}", v) for opt, values in VALUES.items() for v in values]
CASES += [("--free", v) for v in VALUES["count"]]
CASES += [("--flag",), ("a", "b", "c"), ("a", "--text", "t", "--count", "3", "--flag")]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "(none)")
def test_the_light_check_answers_as_typer_does(args: tuple[str, ...]) -> None:
    assert answers(App, *args) == answers(typer.Typer, *args)
