"""What tests import: the repository root, a sim provider's config, a settled.toml
writer, and `settled` run as a real OS process (with a crash or pause point armed
through ``settled.testing`` when asked). Fixtures live in conftest.py; plain helpers
live here so that tests import them like any module."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import zygote

from settled.providers.sim_server import SimServer

ROOT = Path(__file__).resolve().parents[2]
# The folder of these modules: what a Python process the tests start puts on its path
# to import them (pytest has it on its own path: pyproject's `pythonpath`).
HELPERS = Path(__file__).resolve().parent

# Every command and subcommand of the CLI, for the tests of help and docs.
COMMANDS = [
    "dispatch",
    "confirm",
    "reconcile",
    "resolve",
    "retry",
    "queue",
    "show",
    "stats",
    "providers",
    "providers audit",
    "providers check",
    "providers render",
    "daemon",
    "demo",
    "mcp",
    "migrate",
    "migrate-ledger",
    "verify",
    "prune",
    "redact",
    "serve",
    "log",
    "unlock",
]


# The sim provider's timeout, for every config that does not ask for another: far more
# than a loaded machine takes to answer, so that no reply that comes back is cut short.
# It outlasts the fixtures' hang (``SimServer(hang=1.0)``): a timeout fault there ends
# with the server closing the connection unanswered. A dispatch's lease is its request
# budget (attempts x timeout) plus grace, so a test that waits for a lease to lapse
# takes the time to wait from the lease it reads, never a fixed bound.
PATIENT = 5.0

# A timeout for a test whose subject is a reply timing out (a timeout fault, a slow
# answer): shorter than the sim's hang, so the client gives up first, however loaded the
# machine is. Only the requests meant to time out are given it (their own provider, or
# their own config), so a reply meant to arrive still has PATIENT.
SHORT = 0.3


def sim_conf(server: SimServer, **over: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "type": "sim",
        "base_url": server.url,
        "timeout": PATIENT,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 1.0,
    }
    conf.update(over)
    return conf


def toml_key(k: str) -> str:
    """A TOML key: bare when it can be, else quoted (a JSON pointer, a JMESPath)."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def write_config(
    path: Path, providers: dict[str, dict[str, Any]], **sections: dict[str, Any]
) -> Path:
    lines: list[str] = []
    for sect, values in sections.items():
        lines.append(f"[{sect}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    for name, conf in providers.items():
        ops = conf.pop("operations", None)
        lines.append(f"[providers.{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in conf.items()]
        for op, oconf in (ops or {}).items():
            lines.append(f"[providers.{name}.operations.{op}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in oconf.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def command(args: tuple[str, ...], crash_at: str | None, pause_at: str | None = None) -> list[str]:
    """`settled ARGS` as a real process; with ``crash_at`` (or ``pause_at``), through
    the entry point that arms that crash point (``settled.testing``)."""
    if crash_at:
        return [sys.executable, "-m", "settled.testing", "--crash-at", crash_at, *args]
    if pause_at:
        return [sys.executable, "-m", "settled.testing", "--pause-at", pause_at, *args]
    return [sys.executable, "-m", "settled", *args]


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    timeout: float = 60,
    crash_at: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `settled` as a real OS process (``python -m settled``): forked from a warm
    interpreter when it can be (``zygote``), a new interpreter when it cannot."""
    armed = ["settled.testing", "--crash-at", crash_at] if crash_at else ["settled"]
    return run_module(
        [*armed, *args],
        env={**os.environ, **(env or {})},
        cwd=str(ROOT),
        input=input,
        timeout=timeout,
    )


def run_module(
    module_args: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    input: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE_ARGS`` as a real OS process with exactly ``env``, forked from
    the warm interpreter when it can be."""
    cmd = [sys.executable, "-m", *module_args]
    if zygote.usable(env):
        return zygote.run(cmd, module_args, env=env, cwd=cwd, input=input, timeout=timeout)
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, input=input, timeout=timeout, cwd=cwd
    )


# Every `settled` started by popen_cli, so that none outlives the test that started it
# (conftest's ``_reaped``): a test that fails while a daemon runs, or whose bounded
# wait for it to stop runs out, leaves no process behind to load the next tests.
STARTED: list[subprocess.Popen[str]] = []


def popen_cli(
    *args: str,
    env: dict[str, str] | None = None,
    crash_at: str | None = None,
    pause_at: str | None = None,
) -> subprocess.Popen[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc: subprocess.Popen[str]
    if zygote.usable(full_env):
        arm = ["--crash-at", crash_at] if crash_at else ["--pause-at", pause_at] if pause_at else []
        module = ["settled.testing", *arm] if arm else ["settled"]
        proc = zygote.popen(
            command(args, crash_at, pause_at), [*module, *args], env=full_env, cwd=str(ROOT)
        )
    else:
        proc = subprocess.Popen(
            command(args, crash_at, pause_at),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=str(ROOT),
        )
    STARTED.append(proc)
    return proc


def reap(since: int) -> None:
    """Kill every process popen_cli started from ``STARTED[since]`` on that still runs,
    and wait for it."""
    for proc in STARTED[since:]:
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
                proc.communicate(timeout=10)
    del STARTED[since:]
