"""Params that Python's json module accepts but JSON does not (NaN, Infinity, 1e999,
lone surrogates) are refused before anything is recorded. Before, they were recorded
and claimed, and only the request encoding failed: an internal error, a record left
IN_FLIGHT, and a ledger changed by a rejected command."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from invariants import dump
from support import run_cli

from settled import Ledger
from settled.dispatch import Dispatcher
from settled.errors import InvalidInput
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow

NOT_JSON = [
    '{"a": NaN}',
    '{"a": Infinity}',
    '{"a": -Infinity}',
    '{"a": 1e999}',
    '{"a": "\\ud800"}',
    '{"\\udfff": 1}',
]


@pytest.mark.parametrize("raw", NOT_JSON)
def test_cli_refuses_params_that_are_not_json(
    raw: str, sim_config: Path, sim: SimServer, db_path: Path
) -> None:
    run_cli("dispatch", "sim", "book", "--action-id", "first")  # a ledger with a row
    before = dump(db_path)
    done = run_cli("dispatch", "sim", "book", "--params", raw, "--action-id", "x")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("settled: error: --params") and "internal" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert dump(db_path) == before
    assert sim.requests_for("x") == []


@pytest.mark.parametrize("value", [math.nan, math.inf, "\ud800", {1, 2}])
def test_library_refuses_params_that_are_not_json(
    value: object, registry: Registry, sim: SimServer, ledger: Ledger
) -> None:
    with pytest.raises(InvalidInput, match="params are not valid JSON"):
        Dispatcher(ledger, registry).submit("sim", "book", {"a": value}, action_id="x")
    assert ledger.find("x") is None and sim.requests_for("x") == []
