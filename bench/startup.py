"""Cold start: whole commands, timed with ``subprocess`` and ``time.perf_counter``.

``settled show ID --json`` and ``settled queue`` against a minimal Typer app with one
command that prints a JSON object, all run by this interpreter, in alternation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

from .common import Row

MINIMAL_TYPER_APP = """\
import json

import typer

app = typer.Typer(add_completion=False)


@app.command()
def show(action_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    print(json.dumps({"action_id": action_id, "status": "CONFIRMED"}))


app()
"""

# What `settled show ID --json` must not load (heavy imports happen inside commands).
HEAVY = ("httpx", "apscheduler", "sqlite_utils", "rich.table", "rich", "pydantic", "click")


def _time(cmd: list[str], env: dict[str, str]) -> float:
    """Wall time of one whole command, in ms. A blocking wait, never
    ``subprocess.run(timeout=...)``: waiting with a timeout polls with sleeps of up to
    50 ms, which would round every figure up to the next poll. A timer bounds it."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    watchdog = threading.Timer(60.0, proc.kill)
    watchdog.start()
    try:
        proc.wait()
    finally:
        watchdog.cancel()
    return (time.perf_counter() - t) * 1000


def loaded_by_show(env: dict[str, str], action_id: str) -> list[str]:
    """Which heavy modules a real `settled show ID --json` process has loaded."""
    code = (
        "import sys, atexit\n"
        f"heavy = {HEAVY!r}\n"
        "atexit.register(lambda: print('LOADED', *[m for m in heavy if m in sys.modules],"
        " file=sys.stderr))\n"
        f"sys.argv = ['settled', 'show', {action_id!r}, '--json']\n"
        "from settled.cli import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    ).stderr
    for line in out.splitlines():
        if line.startswith("LOADED"):
            return line.split()[1:]
    return ["?"]


def cold_start(tmp: str, repeats: int) -> list[Row]:
    from settled import Ledger
    from settled.dispatch import Dispatcher

    from .fixtures import null_registry

    db = os.path.join(tmp, "cli.db")
    with Ledger.open(db) as led:
        Dispatcher(led, null_registry(), actor="bench").submit(
            "null", "do", {"n": 1}, action_id="bench-1"
        )
    app = os.path.join(tmp, "minimal_app.py")
    with open(app, "w", encoding="utf-8") as fh:
        fh.write(MINIMAL_TYPER_APP)
    env = dict(os.environ, SETTLED_DB=db, SETTLED_CONFIG="", NO_COLOR="1")

    check = subprocess.run(
        [sys.executable, "-m", "settled", "show", "bench-1", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if check.returncode != 0 or json.loads(check.stdout)["action_id"] != "bench-1":
        raise RuntimeError(f"settled show failed: {check.stderr.strip()}")

    cmds = {
        "settled": [sys.executable, "-m", "settled", "show", "bench-1", "--json"],
        "queue": [sys.executable, "-m", "settled", "queue"],
        "typer": [sys.executable, app, "bench-1", "--json"],
        "pass": [sys.executable, "-c", "pass"],
        "import": [sys.executable, "-c", "import settled.cli"],
    }
    sqlite_cli = shutil.which("sqlite3")
    if sqlite_cli:
        cmds["sqlite3"] = [sqlite_cli, db, "SELECT * FROM actions WHERE action_id = 'bench-1'"]
    # An installed package has its bytecode compiled at install time (pip does it for
    # typer, pydantic and the rest). Compile settled's the same way: with
    # PYTHONDONTWRITEBYTECODE set, as on some CI machines, the warm-up below would
    # leave none, and every run would compile settled from source (≈ 8 ms here).
    import compileall

    import settled

    compileall.compile_dir(os.path.dirname(settled.__file__), quiet=1)
    for c in cmds.values():  # warm the page cache
        _time(c, env)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for r in range(repeats):
        names = list(cmds) if r % 2 == 0 else list(reversed(cmds))
        for name in names:
            times[name].append(_time(cmds[name], env))

    loaded = loaded_by_show(env, "bench-1")
    rows = [
        Row(
            "startup",
            "cold start: settled show ID --json",
            "ms",
            times["settled"],
            times["typer"],
            "minimal Typer app, one command",
            higher_is_better=False,
            target=1.1,
            note="loads: " + (", ".join(loaded) or "none of " + "/".join(HEAVY)),
        ),
        Row(
            "startup",
            "cold start: settled queue",
            "ms",
            times["queue"],
            times["typer"],
            "minimal Typer app, one command",
            higher_is_better=False,
            target=1.1,
            note="the default listing of what needs attention, as a table on a pipe",
        ),
        Row(
            "startup",
            "import settled.cli",
            "ms",
            times["import"],
            times["pass"],
            "python -c pass",
            higher_is_better=False,
        ),
    ]
    if sqlite_cli:
        rows.append(
            Row(
                "startup",
                "sqlite3 command-line shell, same row",
                "ms",
                times["sqlite3"],
                times["pass"],
                "python -c pass",
                higher_is_better=False,
            )
        )
    return rows
