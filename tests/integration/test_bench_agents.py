"""The agent benchmark measures what it says: the same transcript through each
framework's plain tool duplicates sends and says done too early, and through settled's
does neither (bench/agents.py; its figures are in docs/agents.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support import ROOT

pytestmark = [pytest.mark.ledger_incidental, pytest.mark.slow(seconds=60)]

sys.path.insert(0, str(ROOT))
from bench import agents  # noqa: E402


@pytest.mark.parametrize("framework", agents.FRAMEWORKS, ids=lambda c: c.__name__)
def test_the_plain_tool_duplicates_and_settled_does_not(tmp_path: Path, framework: type) -> None:
    plain = agents.run_one(framework, True, tmp_path)
    ours = agents.run_one(framework, False, tmp_path)
    assert plain["duplicates"] == ["5xx", "approval", "resume", "timeout"], plain["told"]
    assert plain["false_done"] == ["late", "lost"], plain["told"]
    assert ours["duplicates"] == [] and ours["false_done"] == [], ours["told"]
    assert ours["sends"] == len(agents.STEPS) - 1  # every intent once; the lost one never applied
