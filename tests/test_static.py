"""One command runs every check: the lint and the type checks run as tests, with the
configuration in pyproject.toml (mypy strict on the whole package)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from support import ROOT


def test_ruff_is_clean() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "settled", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_format_is_applied() -> None:
    """pyproject says the formatter wraps at 100; this holds every file to it."""
    p = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_is_clean() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout + p.stderr


SQL = re.compile(
    r"\b(SELECT\b[^;]{0,200}?\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|CREATE\s+(TABLE|INDEX|TRIGGER|SCHEMA)|DROP\s+(TABLE|SCHEMA)|PRAGMA\s+\w+|BEGIN\s+IMMEDIATE)\b"
)
DRIVERS = ("sqlite3", "sqlite_utils", "psycopg", "psycopg_pool")


def test_no_sql_and_no_database_driver_outside_the_storage_package() -> None:
    """The ledger owns every statement (settled/storage): no SQL text and no driver
    import anywhere else in the package, so every storage error is mapped in one place."""
    found = []
    for path in sorted((ROOT / "settled").rglob("*.py")):
        if "storage" in path.relative_to(ROOT / "settled").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if SQL.search(node.value):
                    found.append(f"{where}: SQL text {node.value[:60]!r}")
            elif isinstance(node, ast.Import):
                found += [f"{where}: imports {a.name}" for a in node.names
                          if a.name.split(".")[0] in DRIVERS]  # fmt: skip
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DRIVERS:
                found.append(f"{where}: imports from {node.module}")
    assert found == []


# Typer options are typed as they are: a parameter whose default is None is declared
# `X | None`, so mypy sees the None a command receives when the option is not given.
CLI = ROOT / "settled" / "cli"


def typer_parameters(tree: ast.AST) -> list[tuple[ast.arg, ast.Call]]:
    """Every function parameter whose default is a `typer.Option(...)` or
    `typer.Argument(...)` call."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        positional = fn.args.posonlyargs + fn.args.args
        pairs = list(
            zip(
                positional[len(positional) - len(fn.args.defaults) :], fn.args.defaults, strict=True
            )
        )
        pairs += [
            (a, d)
            for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
            if d is not None
        ]
        for arg, default in pairs:
            if (
                isinstance(default, ast.Call)
                and isinstance(default.func, ast.Attribute)
                and isinstance(default.func.value, ast.Name)
                and default.func.value.id == "typer"
                and default.func.attr in ("Option", "Argument")
            ):
                found.append((arg, default))
    return found


def defaults_to_none(call: ast.Call) -> bool:
    first = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "default":
            first = kw.value
    return isinstance(first, ast.Constant) and first.value is None


def accepts_none(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    nones = [n for n in ast.walk(annotation) if isinstance(n, ast.Constant) and n.value is None]
    return bool(nones) or "Optional" in names or "Any" in names


def test_every_option_with_a_none_default_is_declared_optional() -> None:
    wrong = []
    seen = 0
    for path in sorted(CLI.glob("*.py")):
        for arg, call in typer_parameters(ast.parse(path.read_text())):
            seen += 1
            if defaults_to_none(call) and not accepts_none(arg.annotation):
                declared = ast.unparse(arg.annotation) if arg.annotation else "undeclared"
                wrong.append(f"{path.name}:{arg.lineno} {arg.arg}: {declared}")
    assert seen > 50  # the scan found the CLI's options
    assert wrong == []


def test_the_check_sees_a_wrong_declaration() -> None:
    bad = "import typer\ndef cmd(db: str = typer.Option(None, '--db')) -> None: ...\n"
    good = "import typer\ndef cmd(db: str | None = typer.Option(None, '--db')) -> None: ...\n"
    ((arg, call),) = typer_parameters(ast.parse(bad))
    assert defaults_to_none(call) and not accepts_none(arg.annotation)
    ((arg, call),) = typer_parameters(ast.parse(good))
    assert accepts_none(arg.annotation)
