"""docs/cli.md, the command-line reference, generated from every command's ``--help``.

    python -m settled.cli.reference            print it
    python -m settled.cli.reference --write    write docs/cli.md (the suite fails when it drifts)

The page is never edited by hand: each command's help is the one source. The list of
commands is read from the Typer app (so a new command appears without a change here);
each help text is what ``settled COMMAND --help`` prints in a fresh process, with a
fixed width (``COLUMNS``), no colour and no settled environment, so the page is the
same on every machine."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HEADER = (
    "<!-- Generated from each command's --help by `python -m settled.cli.reference --write`; "
    "do not edit. -->"
)
WIDTH = "100"
FIX = "python -m settled.cli.reference --write"


def commands() -> list[str]:
    """Every command and subcommand, in the order `settled --help` lists them."""
    import typer

    from .commands import app

    found: list[str] = []

    def walk(group: Any, prefix: str) -> None:
        # a group has `commands` (Typer's own Click or the installed one: duck-typed)
        for name, sub in getattr(group, "commands", {}).items():
            if getattr(sub, "hidden", False):
                continue
            found.append(f"{prefix}{name}")
            walk(sub, f"{prefix}{name} ")

    walk(typer.main.get_command(app), "")
    return found


Run = Callable[[list[str], dict[str, str], str], "subprocess.CompletedProcess[str]"]


def _run(args: list[str], env: dict[str, str], cwd: str) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` in a fresh process of this interpreter."""
    return subprocess.run(  # noqa: S603  (this interpreter, settled, a command name from the app)
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def help_text(command: str, run: Run = _run) -> str:
    """What `settled COMMAND --help` prints, in a new process with a fixed terminal
    (``run`` starts it: ``python -m`` its arguments, with that environment and folder)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
    env.update(COLUMNS=WIDTH, LINES="50", NO_COLOR="1", TERM="dumb")
    env.pop("FORCE_COLOR", None)
    with tempfile.TemporaryDirectory() as empty:  # no ./settled.toml nearby
        p = run(["settled", *command.split(), "--help"], env, empty)
    if p.returncode != 0:
        raise RuntimeError(f"settled {command} --help exited {p.returncode}: {p.stderr.strip()}")
    return "\n".join(line.rstrip() for line in p.stdout.splitlines()).strip("\n")


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render(run: Run = _run) -> str:
    names = commands()
    out = [
        HEADER,
        "",
        "# Command-line reference",
        "",
        "Every command's `--help`, as settled prints it. The README shows the commands in",
        "use; the exit codes are in the README's table.",
        "",
    ]
    titles = ["settled", *(f"settled {n}" for n in names)]
    out += [f"- [`{t}`](#{_anchor(t)})" for t in titles]
    out.append("")
    for title, cmd in zip(titles, ["", *names], strict=True):
        out += [f"## {title}", "", "```text", help_text(cmd, run), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def target() -> Path:
    return Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"]):
        print("usage: python -m settled.cli.reference [--write]", file=sys.stderr)
        return 2
    text = render()
    if args == ["--write"]:
        target().write_text(text, encoding="utf-8")
        print(f"wrote {target().name}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
