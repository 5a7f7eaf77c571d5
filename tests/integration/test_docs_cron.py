"""The documented crontab runs as cron runs it: ``/bin/sh -c`` with cron's environment
(``PATH=/usr/bin:/bin``, ``HOME``, ``LOGNAME``, ``SHELL``, nothing else), with only its
absolute paths pointed into the test's folder. The reconcile line reads the provider's
``${VAR}`` secret from the environment file and settles a record; without that file's
line the same pass cannot build the provider. The monitor line pages through an
absolute path when an action has sat unresolved, and stays quiet otherwise."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ledger_rows import add
from support import ROOT

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow

DAEMON_DOC = (ROOT / "docs" / "daemon.md").read_text()
TOKEN = "mail-token-5c1e9a"


def documented_jobs() -> list[str]:
    block = re.findall(r"```cron\n(.*?)```", DAEMON_DOC, flags=re.S)[0]
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert "SHELL=/bin/sh" in lines
    return [" ".join(ln.split()[5:]) for ln in lines if not re.match(r"^[A-Z_]+=", ln)]


class Host:
    """The test's folder standing in for the paths the crontab names."""

    def __init__(self, tmp: Path, location: Any) -> None:
        self.tmp = tmp
        self.location = str(location)
        self.settled = tmp / "opt" / "settled" / ".venv" / "bin" / "settled"
        self.settled.parent.mkdir(parents=True)
        self.settled.write_text(f'#!/bin/sh\nexec {sys.executable} -m settled "$@"\n')
        self.settled.chmod(0o755)
        self.pager = tmp / "usr" / "local" / "bin" / "page-oncall"
        self.pager.parent.mkdir(parents=True)
        self.pager.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp}/paged.txt\n')
        self.pager.chmod(0o755)
        self.secrets = tmp / "etc" / "settled" / "secrets.env"
        self.secrets.parent.mkdir(parents=True)
        self.secrets.write_text(f"MAIL_TOKEN='{TOKEN}'\n")
        self.secrets.chmod(0o600)
        self.config = self.secrets.with_name("settled.toml")
        self.log = tmp / "var" / "log" / "settled" / "reconcile.log"
        self.log.parent.mkdir(parents=True)

    def localise(self, command: str) -> str:
        """The job with its absolute paths moved here (still absolute)."""
        return (
            command.replace("/opt/settled/.venv/bin/settled", str(self.settled))
            .replace("/var/lib/settled/settled.db", shlex.quote(self.location))
            .replace("/etc/settled/settled.toml", str(self.config))
            .replace("/etc/settled/secrets.env", str(self.secrets))
            .replace("/var/log/settled/reconcile.log", str(self.log))
            .replace("/usr/local/bin/page-oncall", str(self.pager))
        )

    def cron(self, command: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.tmp),
            "LOGNAME": "settled",
            "SHELL": "/bin/sh",
        }
        return subprocess.run(
            ["/bin/sh", "-c", self.localise(command)],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in self.log.read_text().splitlines() if ln.startswith("{")]


def mail_conf(sim: SimServer) -> dict[str, Any]:
    """An http provider in front of the sim, whose header needs ${MAIL_TOKEN}."""
    return {
        "type": "http",
        "base_url": f"{sim.url}/v1",
        "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
        "operations": {
            "send": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "attempts": 1,
                "idempotency_header": "Idempotency-Key",
                "request": {"method": "POST", "path": "/send"},
                "reconciliation_key_field": "reconciliation_key",
                "query": {"method": "GET", "path": "/effects/{reconciliation_key}"},
                "status": "/status",
                "applied": ["delivered"],
                "not_found": "pending",
                "verify": {"interval": 0.1, "deadline": 120},
            }
        },
    }


def write_toml(path: Path, conf: dict[str, Any]) -> None:
    from support import write_config

    write_config(path, {"mail": conf})


@pytest.fixture
def host(tmp_path: Path, location: Any) -> Host:
    return Host(tmp_path, location)


def test_the_reconcile_job_reads_its_secrets_and_settles_under_crons_environment(
    host: Host, sim: SimServer, location: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = mail_conf(sim)
    write_toml(host.config, json.loads(json.dumps(conf)))
    monkeypatch.setenv("MAIL_TOKEN", TOKEN)

    def dispatch(aid: str) -> None:
        with Registry({"mail": conf}, source="test") as reg, Ledger.open(location) as led:
            rec = Dispatcher(led, reg).submit("mail", "send", {"to": aid}, action_id=aid).record
            assert str(rec.status) == "AWAITING_VERIFICATION"

    job = next(j for j in documented_jobs() if "reconcile --due" in j)
    dispatch("m-1")
    out = host.cron(job)  # as documented
    assert out.returncode == 0, out.stderr
    moves = {e["action_id"]: e["to"] for e in host.log_lines() if e["event"] == "transition"}
    assert moves == {"m-1": "CONFIRMED"}, host.log_lines()
    assert TOKEN not in host.log.read_text()
    assert len(sim.requests_for("m-1")) == 1  # checked, never re-sent

    # Without the environment file's line, cron's environment has no MAIL_TOKEN: the
    # provider cannot be built, so the due record is not settled.
    host.log.write_text("")
    dispatch("m-2")
    bare = job.replace("set -a && . /etc/settled/secrets.env && ", "")
    assert bare != job
    out = host.cron(bare)
    # Rule 15: a verifier that cannot be built is loud under cron: exit 1 (cron mails it,
    # a wrapper alerts), a check_failed line naming the missing variable, and the attempt
    # counts, so the record reaches the queue when its budget is spent.
    assert out.returncode == 1, out.stderr
    lines = host.log_lines()
    [failed] = [e for e in lines if e["event"] == "check_failed"]
    assert failed["action_id"] == "m-2" and "MAIL_TOKEN" in json.dumps(failed), lines
    [summary] = [e for e in lines if e["event"] == "pass"]
    assert summary["failed_checks"] == 1 and summary["counts"] == {}, lines
    assert TOKEN not in host.log.read_text()
    with Ledger.open(location) as led:
        rec = led.get("m-2")
        assert str(rec.status) == "AWAITING_VERIFICATION"
        assert rec.counted_checks == 1 and "MAIL_TOKEN" in (rec.check_error or "")


def test_the_monitor_job_pages_by_its_full_path_only_when_something_waits(
    host: Host, location: Any
) -> None:
    host.config.write_text("")
    job = next(j for j in documented_jobs() if "--fail-if-any" in j)
    with Ledger.open(location) as led:
        add(led, "fresh", age=60)  # unresolved for a minute: not yet
    out = host.cron(job)
    assert out.returncode == 0, out.stderr
    assert not (host.tmp / "paged.txt").exists()
    with Ledger.open(location) as led:
        add(led, "stuck", age=900)  # unresolved for 15 minutes
    out = host.cron(job)
    assert out.returncode == 0, out.stderr
    assert (host.tmp / "paged.txt").read_text() == "settled: unresolved actions\n"


def test_the_jobs_fail_loudly_without_the_environment_file(host: Host) -> None:
    """A missing secrets file stops the job before settled runs (sh's `.` is fatal)."""
    os.remove(host.secrets)
    out = host.cron(next(j for j in documented_jobs() if "reconcile --due" in j))
    assert out.returncode != 0 and "secrets.env" in out.stderr
