"""The example agent loop runs as a user would run it, and keeps its promises."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

pytestmark = pytest.mark.slow


def test_the_example_agent_loop_never_reports_a_lost_mail_and_books_once() -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent_loop.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    mail = [line for line in out.splitlines() if "receipt-42" in line]
    assert mail[0].startswith("  model context <- mail_send: accepted:")
    assert "uncertain: mail.send receipt-42" in out
    assert "success: mail.send" not in out and "Done: the receipt mail" not in out
    assert "bookings made: 1, requests sent: 1 -> ok" in out
    assert "Done: the Tuesday 10:00 booking." in out
    assert "background job: settled confirm ->" in out
    assert out.rstrip().endswith("all promises kept")
    assert "Traceback" not in p.stderr
