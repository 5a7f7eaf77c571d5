"""The fault matrix through the bulk path: every fault × every tier × deduplicating keys
on/off, each cell one line of a bulk dispatch (``Dispatcher.submit_many`` from a pool of
threads), settled by concurrent verification, then checked against the sim provider's
ground truth. Each cell must end exactly where the single-action matrix says
(``test_rel_fault_matrix.EXPECTED``): the bulk path and concurrent checks change how
fast, never what the evidence proves."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from invariants import check, settle
from test_rel_fault_matrix import EXPECTED, OPS, _registry, provider_for

from settled import Ledger
from settled.bulk import read_lines
from settled.dispatch import Dispatcher, DispatchSettings
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[bool, SimServer]]:
    with SimServer(hang=1.0, honour_keys=True) as on, SimServer(hang=1.0, honour_keys=False) as off:
        yield {True: on, False: off}


@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "nodedupe"])
def test_fault_matrix_through_bulk_dispatch_and_concurrent_checks(
    servers: dict[bool, SimServer], tmp_path: Path, dedupe: bool
) -> None:
    server = servers[dedupe]
    server.reset()
    registry = _registry(server, dedupe)
    cells: dict[str, tuple[str, str]] = {}
    try:
        with Ledger.open(tmp_path / "ledger.db") as ledger:
            d = Dispatcher(ledger, registry, settings=DispatchSettings(lease_grace=0.5, group=4))
            for op in OPS:
                for provider in ("sim", "hung", "down"):
                    rows = []
                    for fault in EXPECTED:
                        if provider_for(fault) != provider:
                            continue
                        aid = f"b-{fault.replace(':', '_')}-{op}-{int(dedupe)}"
                        cells[aid] = (fault, op)
                        if provider != "down":
                            server.plan(aid, fault)
                        rows.append(
                            json.dumps({"action_id": aid, "params": {"name": aid, "value": "v"}})
                        )
                    src = io.BytesIO("\n".join(rows).encode())
                    results = list(d.submit_many(provider, op, read_lines(src), concurrency=4))
                    assert len(results) == len(rows)
            settle(ledger, registry, concurrency=4)
            check(ledger, server, ids=cells, dedupes=dedupe)
            final = {aid: ledger.get(aid) for aid in cells}
    finally:
        registry.close()
    wrong = {}
    for aid, (fault, op) in cells.items():
        expected = EXPECTED[fault][0 if dedupe else 1][OPS.index(op)]
        if final[aid].status is not expected:
            wrong[aid] = (str(final[aid].status), str(expected), final[aid].reason)
    assert not wrong, wrong
    assert len(cells) == 11 * 5
