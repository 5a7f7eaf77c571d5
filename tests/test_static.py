"""One command runs every check: the lint and the type checks run as tests, with the
configuration in pyproject.toml (mypy strict on the whole package)."""

from __future__ import annotations

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
