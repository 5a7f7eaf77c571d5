"""The operator's docs are checked: cron lines name their ledger and config, the CI
example runs as written and never sends twice, and the documented systemd unit is
as hardened as docs/daemon.md says."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, sim_conf, write_config

from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_free

README = (ROOT / "README.md").read_text()
DAEMON_DOC = (ROOT / "docs" / "daemon.md").read_text()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def cron_lines() -> list[str]:
    """Every job line of the documented crontabs (not comments, not NAME=value)."""
    return [
        line
        for doc in (README, DAEMON_DOC)
        for b in blocks(doc, "cron")
        for line in b.splitlines()
        if line.strip() and not line.startswith("#") and not re.match(r"^[A-Z_]+=", line)
    ]


def test_every_cron_line_names_its_ledger_and_config() -> None:
    cron = cron_lines()
    assert len(cron) >= 4
    for line in cron:
        assert "--db " in line and "--config " in line, line


def programs(command: str) -> list[str]:
    """The programs a shell command line runs (builtins that run one: `exec`, `.`)."""
    found = []
    for part in re.split(r"&&|\|\||;|\|", command):
        words = [w for w in shlex.split(part) if not re.match(r"^\d?[<>]", w)]
        while words and words[0] in ("exec", "set", "-a", "+a"):
            words = words[2:] if words[0] == "set" else words[1:]
        if words:
            found.append(words[1] if words[0] == "." else words[0])
    return found


def test_cron_lines_name_every_program_by_its_full_path_and_read_the_secrets_file() -> None:
    """cron's PATH is /usr/bin:/bin and its environment holds none of the operator's
    variables: each program is an absolute path, and each job reads the ${VAR}
    secrets from the file the systemd unit reads."""
    unit = next(b for b in blocks(DAEMON_DOC, "ini") if "ExecStart=" in b)
    env_file = re.search(r"^EnvironmentFile=-?(\S+)", unit, flags=re.M).group(1)  # type: ignore[union-attr]
    for line in cron_lines():
        command = " ".join(line.split()[5:])
        assert programs(command), line
        for prog in programs(command):
            assert prog.startswith("/"), (prog, line)
        assert f"set -a && . {env_file} && " in command, line
    for doc in (README, DAEMON_DOC):
        assert "SHELL=/bin/sh" in "\n".join(blocks(doc, "cron"))
        assert "EnvironmentFile=" in doc and "set -a" in doc


# -- Prometheus -------------------------------------------------------------------------

RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def rules_file() -> str:
    block = next(b for b in blocks(DAEMON_DOC, "yaml") if "alert:" in b)
    return block


def test_the_alert_rules_are_a_prometheus_rules_file() -> None:
    """The rules-file schema: `groups:`, each with a unique name and rules that are
    either an alert or a recording rule, with an expression, a duration for `for:`
    and string labels and annotations. (promtool, where installed, checks the PromQL
    too: the next test.)"""
    import yaml

    doc = yaml.safe_load(rules_file())
    assert isinstance(doc, dict) and set(doc) == {"groups"}, doc
    names = [g["name"] for g in doc["groups"]]
    assert names and len(names) == len(set(names))
    alerts = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= RULE_KEYS, rule
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "for" in rule:
                assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", rule["for"]), rule
            for key in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(key, {}).values()), rule
            alerts.append(rule.get("alert"))
    assert {"SettledPassesFailing", "SettledStalled", "SettledUnresolvedGrowing"} <= set(alerts)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_alert_rules(tmp_path: Path) -> None:
    (tmp_path / "settled.yml").write_text(rules_file())
    out = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "settled.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    import yaml

    n = sum(len(group["rules"]) for group in yaml.safe_load(rules_file())["groups"])
    assert n >= 4 and f"SUCCESS: {n} rules found" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_a_provider_outage_pages_and_a_short_pause_does_not(tmp_path: Path) -> None:
    """promtool's own rule test: the gauges of a provider stuck on 503 (its checks
    failing, its outage gauge at 1 once its outage_after passed) fire
    SettledProviderOutage at once and SettledVerifierBroken after 10 minutes; a
    provider whose outage gauge stays 0 (a pause shorter than outage_after) fires
    neither."""
    import yaml

    (tmp_path / "settled.yml").write_text(rules_file())
    series = [
        {"series": 'settled_provider_outage{provider="mail"}', "values": "0 1x20"},
        {"series": 'settled_checks_failing{provider="mail"}', "values": "40x20"},
        {"series": 'settled_provider_outage{provider="sms"}', "values": "0x20"},
        {"series": 'settled_checks_failing{provider="sms"}', "values": "0 3 0x18"},
        {"series": "settled_healthy", "values": "1x20"},
    ]
    outage = (
        "mail has failed every check for longer than its outage_after (429/503 or "
        "unreachable): settled stats --provider mail"
    )
    broken = (
        "40 mail action(s) cannot be checked: the provider is paused (429/503), "
        "unreachable or cannot be built (settled queue --include-paused --provider mail)"
    )
    page = {"severity": "page", "provider": "mail"}
    cases = [
        ("0m", "SettledProviderOutage", []),
        ("2m", "SettledProviderOutage", [(page, outage)]),
        ("5m", "SettledVerifierBroken", []),
        ("12m", "SettledVerifierBroken", [(page, broken)]),
    ]
    test = {
        "rule_files": ["settled.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": name,
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": {"summary": summary}}
                            for labels, summary in fired
                        ],
                    }
                    for at, name, fired in cases
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- agents ---------------------------------------------------------------------------


def test_the_mcp_client_block_uses_the_daemons_ledger() -> None:
    """An MCP client that sets no ledger writes its own per-user default, which no
    daemon reconciles: the documented block names SETTLED_DB, the daemon the doc tells
    to run beside it uses the same --db, and the doc says why."""
    import json

    agents = (ROOT / "docs" / "agents.md").read_text()
    block = json.loads(next(b for b in blocks(agents, "json") if "mcpServers" in b))
    env = block["mcpServers"]["settled"]["env"]
    ledger, config = env["SETTLED_DB"], env["SETTLED_CONFIG"]
    assert ledger.startswith("/") and config.startswith("/")
    daemon = next(
        line for b in blocks(agents, "sh") for line in b.splitlines() if " daemon" in line
    )
    assert f"--db {ledger}" in daemon and f"--config {config}" in daemon
    claude = next(
        line for b in blocks(agents, "sh") for line in b.splitlines() if "claude mcp add" in line
    )
    assert f"SETTLED_DB={ledger}" in claude
    assert "~/.local/share/settled/settled.db" in agents and "where no daemon" in agents


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
