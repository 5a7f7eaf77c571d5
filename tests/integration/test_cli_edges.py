"""The command line at its edges: exit codes after a real send, bounded input,
Ctrl-C at start-up, a missing ledger, filters that name what exists, the --limit
note, the re-run hint, --wait feedback, streamed reconcile output, the demo's kept
ledger, help, version and shell completion."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from invariants import dump
from ledger_rows import add
from support import COMMANDS, ROOT, popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer

# -- once the request has left, the exit code is the record's ----------------------------


@pytest.mark.parametrize("aid", ["x[/]", "[reverse]boom", "[ops] carrier"])
def test_markup_in_an_action_id_is_shown_and_exits_by_status(
    sim_config: Path, sim: SimServer, aid: str
) -> None:
    out = run_cli("dispatch", "sim", "book", "--action-id", aid)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(aid) and "CONFIRMED" in out.stdout
    assert len(sim.requests_for(aid)) == 1
    shown = run_cli("show", aid)
    assert shown.returncode == 0 and shown.stdout.startswith(aid), shown.stderr


def test_params_nested_600_deep_print_as_json_and_exit_by_status(
    sim_config: Path, sim: SimServer
) -> None:
    deep = '{"a": ' * 600 + "1" + "}" * 600
    out = run_cli("dispatch", "sim", "book", "--action-id", "deep", "--params", deep, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "CONFIRMED"
    human = run_cli("show", "deep")
    assert human.returncode == 0 and "Traceback" not in human.stderr


def test_a_failure_while_printing_after_the_send_keeps_the_records_code(
    sim_config: Path, sim: SimServer
) -> None:
    """Printing is made to fail after the send (stdout closed): exit by the record's
    status, and stderr says the request was sent."""
    code = (
        "import sys, os\n"
        "from settled.cli import dispatch_cmd\n"
        "def boom(report):\n    raise RuntimeError('terminal went away')\n"
        "dispatch_cmd.render_report = boom\n"
        "from settled.cli import main\n"
        "main(['dispatch', 'sim', 'send', '--action-id', 'r1'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3, out.stderr
    assert (
        "the request was sent and recorded" in out.stderr and "AWAITING_VERIFICATION" in out.stderr
    )
    assert "internal error" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert len(sim.requests_for("r1")) == 1


# -- bounded input ----------------------------------------------------------------------


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("source", ["@/dev/zero", "-"])
def test_params_are_read_up_to_a_cap(
    sim_config: Path, sim: SimServer, db_path: Path, source: str
) -> None:
    big = "x" * (2 * 1024 * 1024)
    out = run_cli(
        "dispatch", "sim", "book", "--params", source, input=big if source == "-" else None
    )
    assert out.returncode == 1 and "larger than 1024 KiB" in out.stderr, out.stderr
    assert sim.truth()["requests"] == [] and not db_path.exists()


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("interval", ["1e300", "inf", "86401"])
def test_daemon_interval_out_of_range_is_one_line(sim_config: Path, interval: str) -> None:
    out = run_cli("daemon", "--interval", interval)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "--interval" in out.stderr


@pytest.mark.slow
@pytest.mark.ledger_incidental
def test_ctrl_c_during_start_up_never_shows_a_traceback(tmp_path: Path) -> None:
    """SIGINT at many moments of the first few hundred ms: exit 130 (or killed by the
    signal before Python set its handler), never a traceback."""
    clean = 0
    for delay in [0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.13, 0.17, 0.2, 0.3, 0.4, 0.6]:
        p = subprocess.Popen(
            [sys.executable, "-m", "settled", "queue", "--status", "all"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        frames = re.findall(r'File "([^"]+)"', err)
        if "Fatal Python error: init_import_site" in err:
            continue  # during site's imports (the editable-install finder), before settled's code
        ours = [f for f in frames if "/settled/" in f and not f.endswith("settled/__init__.py")]
        if frames and not ours:
            continue  # the interpreter's start-up (site, runpy, the package's imports): before the entry point
        assert "Traceback" not in err, (delay, err)
        assert p.returncode in (130, -signal.SIGINT, 1, 0), (delay, p.returncode, err)
        clean += 1
    assert clean >= 3  # most moments fall in settled's own start-up, and all of those are clean


# -- read-only commands and filters -----------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "a"],
        ["queue"],
        ["queue", "--fail-if-any"],
        ["providers", "audit"],
        ["resolve", "--provider", "x", "--applied", "--reason", "r"],
    ],
)
def test_read_only_commands_never_create_a_ledger(db_path: Path, argv: list[str]) -> None:
    out = run_cli(*argv)
    assert out.returncode == 1, out.stderr
    assert f"no ledger at {db_path}" in out.stderr and out.stderr.count("\n") == 1
    assert not db_path.exists()


@pytest.fixture
def two_providers(db_path: Path) -> None:
    with Ledger.open(db_path) as led:
        for i in range(5):
            add(
                led,
                f"bill-{i}",
                provider="billing-eu-west-1-production",
                operation="charge",
                age=60 * i,
            )
        add(led, "mail-1", provider="mail", operation="send")
        add(led, "mail-2", provider="mail", operation="bounce")


def test_queue_operation_filter_and_unknown_names(two_providers: None) -> None:
    out = run_cli("queue", "--operation", "send", "--json")
    assert [r["action_id"] for r in json.loads(out.stdout)] == ["mail-1"]
    out = run_cli("queue", "--provider", "mail", "--operation", "bounce", "-o", "tsv")
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["action", "mail-2"]
    bad = run_cli("queue", "--provider", "billing")
    assert bad.returncode == 1
    assert "known: billing-eu-west-1-production, mail" in bad.stderr
    bad = run_cli("queue", "--provider", "mail", "--operation", "charge")
    assert bad.returncode == 1 and "known: bounce, send" in bad.stderr


def test_a_limit_that_cuts_rows_says_so(two_providers: None) -> None:
    out = run_cli("queue", "--limit", "3")
    assert out.returncode == 0
    assert len(out.stdout.splitlines()) == 4  # header + 3
    assert "showing the oldest 3 of 7" in out.stderr
    assert "showing" not in run_cli("queue", "--limit", "7").stderr


@pytest.mark.parametrize("fmt", ["table", "wide", "tsv", "json"])
def test_output_formats(two_providers: None, fmt: str) -> None:
    out = run_cli("queue", "-o", fmt, env={"COLUMNS": "120"})
    assert out.returncode == 0, out.stderr
    if fmt == "json":
        assert len(json.loads(out.stdout)) == 7
    elif fmt == "tsv":
        assert all(line.count("\t") == 9 for line in out.stdout.splitlines())
    else:
        assert "bill-0" in out.stdout and "mail-1" in out.stdout
        assert ("created" in out.stdout) == (fmt == "wide")
        if fmt == "wide":
            assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out.stdout)


# -- feedback ---------------------------------------------------------------------------


def test_dispatch_without_an_action_id_in_a_script_hints_that_a_rerun_sends_again(
    sim_config: Path, sim: SimServer
) -> None:
    out = run_cli("dispatch", "sim", "book", input="")
    assert out.returncode == 0
    assert "will send it again" in out.stderr and out.stderr.count("\n") == 1
    quiet = run_cli("dispatch", "sim", "book", "--action-id", "named", input="")
    assert quiet.stderr == ""


def test_wait_says_what_it_is_waiting_for(sim_config: Path, sim: SimServer, tmp_path: Path) -> None:
    write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim, verify_deadline=20.0)})
    sim.plan("lag", "lag:0.5")
    out = run_cli("dispatch", "sim", "send", "--action-id", "lag", "--wait", "--wait-timeout", "20")
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("--wait: lag is AWAITING_VERIFICATION: waiting for the provider")
    assert "next check of sim/send at" in first and "giving up in" in first


@pytest.fixture
def blackhole() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    yield s
    s.close()


def test_reconcile_prints_results_as_they_come(
    tmp_path: Path, sim: SimServer, db_path: Path, blackhole: socket.socket
) -> None:
    conf = sim_conf(sim, verify_deadline=600.0)
    reg = Registry({"fast": conf, "slow": conf}, source="test")
    with Ledger.open(db_path) as led:
        d = Dispatcher(led, reg)
        d.submit("fast", "send", {"n": 1}, action_id="quick")
        d.submit("slow", "send", {"n": 2}, action_id="stuck")
    reg.close()
    url = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
    write_config(
        tmp_path / "settled.toml",
        {"fast": dict(conf), "slow": sim_conf(sim, base_url=url, timeout=30.0)},
    )
    proc = popen_cli("reconcile", "quick", "stuck")
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("quick  AWAITING_VERIFICATION → CONFIRMED"), first
        assert proc.poll() is None  # the slow check is still going: the line came as it settled
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
@pytest.mark.ledger_incidental
def test_demo_keep_leaves_a_ledger_its_hint_works_on(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    out = run_cli("demo", "--keep", str(keep), timeout=120)
    assert out.returncode == 0, out.stderr
    hint = next(
        line.strip() for line in out.stdout.splitlines() if line.strip().startswith("settled --db")
    )
    argv = shlex.split(hint)[1:]
    done = run_cli(*argv, env={"SETTLED_DB": ""})
    assert done.returncode == 0, done.stderr
    again = run_cli("demo", "--keep", str(keep))
    assert again.returncode == 1 and "exists already" in again.stderr


# -- help, version, completion ----------------------------------------------------------


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_has_examples_and_clean_metavars(cmd: str) -> None:
    out = run_cli(*cmd.split(), "-h", env={"COLUMNS": "100"})
    assert out.returncode == 0 and "Usage:" in out.stdout
    assert "Examples:" in out.stdout and "settled " in out.stdout.split("Examples:")[1]
    assert re.search(r"Examples:\n +settled ", out.stdout), out.stdout  # one example a line
    assert not re.search(r"<[a-z]+(\[[a-z]+\])?>|<int range>|<float>|<text>", out.stdout), (
        out.stdout
    )


@pytest.mark.ledger_incidental
def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0
    assert re.fullmatch(
        r"settled \S+ \(ledger schema \d+; PostgreSQL ledger schema \d+\)\n", out.stdout
    )


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_are_generated(shell: str) -> None:
    out = run_cli(
        "--show-completion", shell, env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    )
    assert out.returncode == 0, out.stderr
    assert "_SETTLED_COMPLETE" in out.stdout
    assert ("compdef" in out.stdout) == (shell == "zsh")
    assert ("complete -o default -F" in out.stdout) == (shell == "bash")


def test_bash_completes_action_ids_and_provider_names(two_providers: None, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "settled").write_text(f'#!/bin/sh\nexec {sys.executable} -m settled "$@"\n')
    (bin_dir / "settled").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1",
    }
    script = subprocess.run(
        ["settled", "--show-completion", "bash"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=ROOT,
    ).stdout

    def complete(words: str) -> list[str]:
        prog = (
            f"{script}\nCOMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n"
            "_settled_completion settled\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
        )
        out = subprocess.run(
            ["bash", "--norc", "-c", prog],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            cwd=ROOT,
        )
        return [x for x in out.stdout.splitlines() if x]

    assert complete("settled show bill-") == [f"bill-{i}" for i in range(5)]
    assert complete("settled queue --provider b") == ["billing-eu-west-1-production"]
    assert complete("settled resolve ma") == ["mail-1", "mail-2"]
    assert dump(os.environ["SETTLED_DB"])  # completion read it, changed nothing


def test_completion_without_a_ledger_completes_nothing_and_creates_none(db_path: Path) -> None:
    out = run_cli(
        env={
            "_SETTLED_COMPLETE": "complete_bash",
            "COMP_WORDS": "settled show a",
            "COMP_CWORD": "2",
        }
    )
    assert out.returncode == 0 and out.stdout.strip() == "" and not db_path.exists()


@pytest.mark.ledger_incidental
def test_import_settled_cli_loads_no_daemon_or_metrics_library() -> None:
    code = (
        "import sys, settled.cli; print(sorted(m for m in ('apscheduler', 'httpx', "
        "'prometheus_client', 'rich', 'typer') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.ledger_incidental
@pytest.mark.parametrize(
    "argv", [["\x1b[2Jbogus"], ["queue", "--\x1b]8;;x\x07"], ["show", "a", "--\u202eevil"]]
)
def test_usage_errors_write_out_what_was_typed(argv: list[str]) -> None:
    out = run_cli(*argv)
    assert out.returncode == 2 and "Usage: settled" in out.stderr
    assert "\x1b" not in out.stderr and "\u202e" not in out.stderr and "\x07" not in out.stderr
    assert "\\x1b" in out.stderr or "\\u202e" in out.stderr
