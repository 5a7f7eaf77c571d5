"""A new record column is one place: the field on ``ActionRecord`` and one schema step
per backend, nothing else (``storage.columns``).

The proof makes exactly those three edits to a copy of the package and runs it, as a
real process on a real ledger of each backend: a ledger made new and one made by the
schema before the step, then migrated, have the same schema; the field's value is
written, moved, read back, shown in the record's JSON and in the API's description,
and copied to another ledger with the rest. If any other place had to know the new
column (a column list, a statement, a mapping, the copy, the API), the copy fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import HELPERS, ROOT

pytestmark = pytest.mark.slow(seconds=20)

FIELD = "    cause: str | None = None\n"
STEPS = {  # the step each backend's schema module gains, before its LATEST is counted
    "sqlite_schema.py": (
        '("011_priority", lambda db: db.execute('
        '"ALTER TABLE actions ADD COLUMN priority INTEGER NOT NULL DEFAULT 0"))'
    ),
    "postgres_schema.py": (
        '("008_priority", lambda cur: cur.execute('
        '"ALTER TABLE actions ADD COLUMN priority integer NOT NULL DEFAULT 0"))'
    ),
}

SCRIPT = """
import os
import sys
from dataclasses import replace
sys.path[:0] = sys.argv[3].split(os.pathsep)  # the suite's helpers, over the copy of settled
import test_schema as schema
from records import move, new_record

import settled
from settled import Ledger, Status
from settled.serve.api import openapi

assert settled.__file__.startswith(sys.argv[4]), settled.__file__  # the copy runs
new, old = sys.argv[1], sys.argv[2]

# the schema: made new, and migrated from the schema before the step, are the same
schema.made_new(new)
steps = schema.steps_of(new)
schema.old_ledger(old, len(steps) - 1)
assert schema.migrated(old) == [(len(steps), steps[-1][0])]
assert schema.schema_of(old) == schema.schema_of(new)

# the value: written, moved, read back, shown, described and copied
with Ledger.open(new) as led, Ledger.open(old) as copy:
    led.record(replace(new_record("a-1"), priority=3), actor="t")
    assert led.get("a-1").priority == 3
    moved = led.move(move("a-1", Status.PENDING, Status.IN_FLIGHT, delivery="IN_FLIGHT",
                          priority=4))
    assert moved is not None and moved.priority == 4 == led.get("a-1").priority
    assert led.get("a-1").to_json()["priority"] == 4
    assert openapi.RECORD["properties"]["priority"] == {"type": "integer"}
    assert "priority" in openapi.RECORD["required"]
    copy.restore(led.export())
    assert copy.get("a-1") == led.get("a-1") and copy.verify().findings == []
print("ok")
"""


def _copy_with_a_new_column(into: Path) -> Path:
    """The package, with the field and one step per backend (and nothing else)."""
    pkg = into / "settled"
    shutil.copytree(ROOT / "settled", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    model = pkg / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(FIELD) == 1, "the record's last field moved: update FIELD"
    model.write_text(text.replace(FIELD, FIELD + "    priority: int = 0\n"), encoding="utf-8")
    for name, step in STEPS.items():
        path = pkg / "storage" / name
        text = path.read_text(encoding="utf-8")
        assert text.count("\nLATEST = len(MIGRATIONS)\n") == 1
        added = f"\nMIGRATIONS.append({step})\nLATEST = len(MIGRATIONS)\n"
        path.write_text(text.replace("\nLATEST = len(MIGRATIONS)\n", added), encoding="utf-8")
    return into


def test_a_new_field_and_one_step_per_backend_are_the_whole_change(
    tmp_path: Path, fresh_location: Callable[[str], Any]
) -> None:
    copy = _copy_with_a_new_column(tmp_path / "copy")
    new, old = fresh_location("new.db"), fresh_location("old.db")
    paths = os.pathsep.join([str(HELPERS), str(Path(__file__).resolve().parent)])  # test_schema
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(new), str(old), paths, str(copy)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "PYTHONPATH": str(copy)},
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
