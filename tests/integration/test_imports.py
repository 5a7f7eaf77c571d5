"""Cold start: a cron job pays for every import on every call, so the CLI imports
heavy libraries only inside the commands that need them. Checked in fresh processes
(sys.modules), never by timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from records import new_record

import settled
from settled import Ledger

pytestmark = pytest.mark.ledger_incidental

HEAVY = ("httpx", "apscheduler", "sqlite_utils", "rich.table")


def loaded_after(
    code: str, *names: str, env: dict[str, str] | None = None, expect_out: str = ""
) -> list[str]:
    probe = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: print('\\nLOADED=' + json.dumps([m for m in {names!r}"
        " if m in sys.modules]), file=sys.stderr))\n" + code
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    line = [x for x in out.stderr.splitlines() if x.startswith("LOADED=")]
    assert line, out.stderr
    assert expect_out in out.stdout, out.stderr
    return json.loads(line[-1][len("LOADED=") :])  # type: ignore[no-any-return]


def test_import_settled_cli_stays_light() -> None:
    assert loaded_after("import settled.cli", *HEAVY, "rich") == []


def test_import_settled_loads_no_submodule_until_used() -> None:
    mods = ("settled.storage", "settled.dispatch", "settled.reconcile", "settled.config")
    assert loaded_after("import settled", *mods) == []
    assert loaded_after("from settled import Ledger", *mods) == ["settled.storage"]


def test_opentelemetry_waits_for_the_first_span() -> None:
    """The core that makes spans imports no part of OpenTelemetry by itself: a process
    that sends nothing (every command but the sending ones) never pays for it."""
    code = (
        "import settled.cli, settled.dispatch, settled.reconcile, settled.resolve, settled.tracing"
    )
    assert loaded_after(code, "opentelemetry", "opentelemetry.trace") == []


def test_public_names_all_resolve() -> None:
    for name in settled.__all__:
        assert getattr(settled, name) is not None
    assert set(dir(settled)) >= set(settled.__all__)


def test_show_json_loads_nothing_heavy(db_path: Path, tmp_path: Path) -> None:
    import os

    with Ledger.open(db_path) as led:
        led.record(new_record(), actor="test")
    code = (
        "import sys\nsys.argv = ['settled', 'show', 'a-1', '--json']\n"
        "from settled.cli import main\nmain()\n"
    )
    loaded = loaded_after(
        code,
        *HEAVY,
        "rich",
        "pydantic",
        "settled.dispatch",
        "settled.providers.base",
        env=dict(os.environ),
        expect_out='"action_id": "a-1"',
    )
    assert loaded == []


def test_read_only_commands_load_no_pydantic(db_path: Path) -> None:
    """Typer checks option values through pydantic; the CLI's own check of plain values
    (``cli.typerapp``) spares a read-only command loading it. A value only Typer can
    check still loads it, and gets Typer's message."""
    with Ledger.open(db_path) as led:
        led.record(new_record(), actor="test")
    probe = (
        "import sys\nfrom settled.cli import main\nsys.argv = ['settled', *sys.argv[1:]]\n"
        "code = 0\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('PYDANTIC', 'pydantic' in sys.modules, code, file=sys.stderr)\n"
    )

    def run(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", probe, "--db", str(db_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stderr

    assert "PYDANTIC False 0" in run("queue")
    assert "PYDANTIC False 0" in run("queue", "--limit", "5", "--json")
    assert "PYDANTIC False 0" in run("show", "--help")
    err = run("queue", "--limit", "0")
    assert "PYDANTIC True 2" in err
    assert "Input should be greater than or equal to 1" in err


def test_reconcile_due_on_a_pipe_loads_no_rich(db_path: Path) -> None:
    """A cron pass writes plain lines: rich, pydantic and Click stay unloaded (a usage
    error still loads Click to say it)."""
    with Ledger.open(db_path):
        pass
    code = (
        "import sys\nsys.argv = ['settled', '--db', sys.argv[1], 'reconcile', '--due']\n"
        "from settled.cli import main\nmain()\n"
    )
    probe = (
        "import atexit, sys\natexit.register(lambda: print('LOADED', "
        "[m for m in ('rich', 'pydantic', 'click') if m in sys.modules], file=sys.stderr))\n" + code
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(db_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "examined 0: no status change" in out.stderr
    assert "LOADED []" in out.stderr
