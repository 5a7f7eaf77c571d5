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
