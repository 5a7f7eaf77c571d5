"""What tests import: the repository root, a sim provider's config, a settled.toml
writer, and `settled` run as a real OS process (with a crash or pause point armed
through ``settled.testing`` when asked). Fixtures live in conftest.py; plain helpers
live here so that tests import them like any module."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import zygote

from settled.providers.sim_server import SimServer

ROOT = Path(__file__).resolve().parent.parent

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
    "providers render",
    "daemon",
    "demo",
    "mcp",
    "migrate",
    "migrate-ledger",
    "verify",
    "serve",
]


# A timeout for the sim where no reply is meant to time out: the shared 0.3 s keeps the
# fault tests quick (a hanging fault holds 1 s), and a loaded machine now and then
# outlasts it on a reply that should have come back.
PATIENT = 5.0


def sim_conf(server: SimServer, **over: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "type": "sim",
        "base_url": server.url,
        "timeout": 0.3,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 1.0,
    }
    conf.update(over)
    return conf


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
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
