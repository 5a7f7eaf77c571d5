"""What a real terminal shows: a command run in a detached tmux session of a given
size, read back with ``capture-pane``. Each test gets its own tmux server socket."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from support import ROOT

DONE = "__settled_done__"


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


def run_in_terminal(
    args: list[str],
    *,
    width: int,
    height: int = 60,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    keys: list[str] | None = None,
    wait_for: str | None = None,
) -> str:
    """Run ``settled ARGS`` in a width × height terminal; return what the screen shows
    (the whole scrollback) once the command ended. ``keys`` are typed once
    ``wait_for`` appears on the screen."""
    sock = f"settled-test-{uuid.uuid4().hex[:8]}"
    full_env = {**os.environ, **(env or {})}
    full_env.pop("NO_COLOR", None)
    for sized in ("COLUMNS", "LINES"):  # the pane's size is the terminal's, nothing else
        full_env.pop(sized, None)
    full_env["TERM"] = "xterm-256color"
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "settled", *args])
    envs = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in full_env.items()
        if k.startswith(("SETTLED_", "XDG_", "PATH", "HOME", "PYTHON"))
    )
    script = f"cd {shlex.quote(str(ROOT))} && env {envs} {cmd}; echo; echo {DONE}$?; sleep 600"
    base = ["tmux", "-L", sock]
    subprocess.run(
        [
            *base,
            "new-session",
            "-d",
            "-x",
            str(width),
            "-y",
            str(height),
            "bash",
            "--norc",
            "-c",
            script,
        ],
        check=True,
        env=full_env,
    )
    try:
        subprocess.run([*base, "set-option", "-g", "history-limit", "10000"], check=False)
        end = time.monotonic() + timeout
        typed = False
        while True:
            screen = capture(base)
            if keys and not typed and wait_for and wait_for in screen:
                for k in keys:
                    subprocess.run([*base, "send-keys", "-t", "0", k], check=True)
                typed = True
            if DONE in screen:
                return capture(base)
            assert time.monotonic() < end, screen
            time.sleep(0.1)
    finally:
        subprocess.run([*base, "kill-server"], check=False, capture_output=True)


def capture(base: list[str]) -> str:
    out = subprocess.run(
        [*base, "capture-pane", "-p", "-S", "-", "-t", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout


def exit_code(screen: str) -> int:
    line = next(x for x in screen.splitlines() if x.startswith(DONE))
    return int(line[len(DONE) :])


def screen_lines(screen: str) -> list[str]:
    return [x.rstrip() for x in screen.split(DONE, maxsplit=1)[0].splitlines()]


class Terminal:
    """A command in a live terminal, for tests that act while it runs (``--watch``):
    ``wait_for(text)`` until the screen shows it, ``send(*keys)``, ``screen()``."""

    def __init__(
        self,
        args: list[str],
        *,
        width: int = 120,
        height: int = 40,
        env: dict[str, str] | None = None,
    ) -> None:
        self.sock = f"settled-test-{uuid.uuid4().hex[:8]}"
        self.base = ["tmux", "-L", self.sock]
        full_env = {**os.environ, **(env or {})}
        full_env.pop("NO_COLOR", None)
        for sized in ("COLUMNS", "LINES"):
            full_env.pop(sized, None)
        full_env["TERM"] = "xterm-256color"
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "settled", *args])
        envs = " ".join(
            f"{k}={shlex.quote(v)}"
            for k, v in full_env.items()
            if k.startswith(("SETTLED_", "XDG_", "PATH", "HOME", "PYTHON"))
        )
        script = f"cd {shlex.quote(str(ROOT))} && env {envs} {cmd}; echo; echo {DONE}$?; sleep 600"
        subprocess.run(
            [
                *self.base,
                "new-session",
                "-d",
                "-x",
                str(width),
                "-y",
                str(height),
                "bash",
                "--norc",
                "-c",
                script,
            ],
            check=True,
            env=full_env,
        )

    def screen(self) -> str:
        """What the pane shows now (its visible part)."""
        out = subprocess.run(
            [*self.base, "capture-pane", "-p", "-t", "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout

    def wait_for(self, text: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            assert time.monotonic() < end, f"{text!r} never appeared:\n{screen}"
            time.sleep(0.1)

    def send(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "0", *keys], check=True)

    def pid(self) -> int:
        """The command's process (the pane runs bash, whose child it is)."""
        out = subprocess.run(
            [*self.base, "list-panes", "-F", "#{pane_pid}"],
            capture_output=True,
            text=True,
            check=True,
        )
        shell = int(out.stdout.split()[0])
        kids = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        return int(kids[0])

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], check=False, capture_output=True)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SHELLS = {
    "bash": ["bash", "--norc", "--noprofile", "-i"],
    "zsh": ["zsh", "-f", "-i"],
    "fish": ["fish", "--no-config", "-i"],
}


class InteractiveShell:
    """A real interactive shell (bash, zsh or fish) on a tmux pty, typed into key by
    key as a person would. ``ready()`` waits until a command typed after everything
    before it has run (a marker only its output shows)."""

    def __init__(self, shell: str, cwd: Path, env: dict[str, str], timeout: float = 180) -> None:
        self.shell = shell
        self.timeout = timeout
        self.base = ["tmux", "-L", f"settled-sh-{uuid.uuid4().hex[:8]}"]
        self._marks = 0
        subprocess.run(
            [
                *self.base,
                "new-session",
                "-d",
                "-x",
                "220",
                "-y",
                "50",
                "-c",
                str(cwd),
                *SHELLS[shell],
            ],
            check=True,
            env=env,
        )
        subprocess.run([*self.base, "set-option", "-g", "history-limit", "10000"], check=False)

    def type(self, text: str) -> None:
        """Type ``text`` literally (no key names)."""
        subprocess.run([*self.base, "send-keys", "-t", "0", "-l", text], check=True)

    def press(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "0", *keys], check=True)

    def screen(self) -> str:
        return capture(self.base)

    def wait_for(self, predicate: object, what: str) -> str:
        """The screen, once ``predicate(screen)`` holds (bounded by the timeout)."""
        end = time.monotonic() + self.timeout
        while True:
            screen = self.screen()
            if predicate(screen):  # type: ignore[operator]
                return screen
            assert time.monotonic() < end, f"{self.shell}: waited for {what}:\n{screen}"
            time.sleep(0.05)

    def ready(self) -> None:
        """Run a marker command and wait for its output: what was typed before it ran."""
        self._marks += 1
        mark = f"READY{self._marks}X"
        self.type(f'echo READY""{self._marks}X')
        self.press("Enter")
        self.wait_for(lambda s: mark in s, mark)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], check=False, capture_output=True)

    def __enter__(self) -> InteractiveShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "SHELLS",
    "InteractiveShell",
    "Path",
    "Terminal",
    "capture",
    "exit_code",
    "run_in_terminal",
    "screen_lines",
    "tmux_available",
]
