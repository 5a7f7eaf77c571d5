"""The suite's own machinery: no process a test started outlives it."""

from __future__ import annotations

import signal

import pytest
import support
from support import popen_cli

pytestmark = pytest.mark.ledger_incidental


def test_reap_kills_what_still_runs_and_leaves_what_ended() -> None:
    since = len(support.STARTED)
    ended = popen_cli("--version")
    ended.communicate(timeout=60)  # it ended by itself
    assert ended.returncode == 0
    daemon = popen_cli("daemon", "--interval", "60")
    assert daemon.stderr is not None
    assert "started" in daemon.stderr.readline()  # it runs, and would for a minute
    support.reap(since)
    assert daemon.returncode == -signal.SIGKILL
    assert ended.returncode == 0
    assert support.STARTED[since:] == []
