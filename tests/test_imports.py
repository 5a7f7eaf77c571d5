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
        "settled.dispatch",
        "settled.providers.base",
        env=dict(os.environ),
        expect_out='"action_id": "a-1"',
    )
    assert loaded == []
