"""The operator's docs are checked: cron lines name their ledger and config, the CI
example runs as written and never sends twice, and the documented systemd unit is
as hardened as docs/daemon.md says."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, sim_conf, write_config

from settled.providers.sim_server import SimServer

README = (ROOT / "README.md").read_text()
DAEMON_DOC = (ROOT / "docs" / "daemon.md").read_text()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_every_cron_line_names_its_ledger_and_config() -> None:
    cron = [
        line
        for doc in (README, DAEMON_DOC)
        for b in blocks(doc, "cron")
        for line in b.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(cron) >= 4
    for line in cron:
        assert "--db " in line and "--config " in line, line


def test_the_ci_example_runs_as_written_and_a_rerun_sends_nothing(
    tmp_path: Path, sim: SimServer
) -> None:
    example = next(b for b in blocks(README, "sh") if "CI_PIPELINE_ID" in b)
    assert '--action-id "release-$CI_PIPELINE_ID-mail"' in example
    write_config(tmp_path / "settled.toml", {"mail": sim_conf(sim, verify_deadline=20.0)})
    (tmp_path / "release-mail.json").write_text('{"to": "team@example.com"}')
    (tmp_path / "deploy").write_text("#!/bin/sh\necho deployed >> deployed.txt\n")
    (tmp_path / "deploy").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "settled").write_text(f'#!/bin/sh\nexec {sys.executable} -m settled "$@"\n')
    (bin_dir / "settled").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CI_PIPELINE_ID": "4711",
        "PYTHONPATH": str(ROOT),
    }
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-e", "-c", example],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert len(sim.requests_for("release-4711-mail")) == 1
    assert (tmp_path / "deployed.txt").read_text() == "deployed\ndeployed\n"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_the_documented_unit_is_hardened(tmp_path: Path) -> None:
    unit = next(b for b in blocks(DAEMON_DOC, "ini") if "ExecStart=" in b)
    assert "Type=notify" in unit and "WatchdogSec=" in unit
    (tmp_path / "settled.service").write_text(unit)
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "settled.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    m = re.search(r"Overall exposure level for settled.service: (\d+\.\d+)", out.stdout)
    if m is None:
        pytest.skip(f"this systemd-analyze cannot rate a unit file offline: {out.stderr[:200]}")
    score = float(m.group(1))
    assert score <= 2.0, out.stdout
    assert f"rates this unit **{score}" in DAEMON_DOC
