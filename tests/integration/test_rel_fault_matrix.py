"""The fault matrix: every fault × every tier × deduplicating keys on/off, run to
completion against the real sim provider, then checked against its ground truth.

Each cell asserts the exact final status: the most specific one the evidence allows
(``DENIED_UNRESOLVED`` only when nothing could tell). The invariants in
``invariants.check`` hold in every cell.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from invariants import check, settle
from support import PATIENT, SHORT

from settled import Ledger
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.ledger_incidental, pytest.mark.slow]

C, F, U = Status.CONFIRMED, Status.FAILED, Status.DENIED_UNRESOLVED

# book = full, send = reconcilable, deliver = partial, notify = blind,
# set = reconcilable by snapshot.
OPS = ("book", "send", "deliver", "notify", "set")

VERIFY_DEADLINE = 0.8  # s of verification budget: room for a loaded CI machine
LAG_INSIDE = "lag:0.05"  # visible well within the budget
LAG_OUTSIDE = "lag:60"  # visible only long after the budget is spent

# fault -> (expected with dedupe on, expected with dedupe off), per op in OPS order.
# The reasoning, cell by cell, is in docs/reliability.md.
_APPLIED_LATE = (C, C, U, U, C)  # applied; the reply was lost or garbled
EXPECTED: dict[str, tuple[tuple[Status, ...], tuple[Status, ...]]] = {
    # accepted, then dropped by the provider: nothing ever shows; nothing proves absence
    "lost_after_accept": ((U, U, U, U, U), (U, U, U, U, U)),
    # visible within the verification budget: observed
    LAG_INSIDE: ((C, C, U, U, C), (C, C, U, U, C)),
    # visible only after the budget: only the full tier's reply proves it
    LAG_OUTSIDE: ((C, U, U, U, U), (C, U, U, U, U)),
    # accepted, then bounced: the effect query proves it absent where there is one
    "bounce": ((F, F, U, U, U), (F, F, U, U, U)),
    # applied, no reply: repeated under the same key when deduped, else reconciled
    "timeout_after_apply": (_APPLIED_LATE, _APPLIED_LATE),
    "reset_after_apply": (_APPLIED_LATE, _APPLIED_LATE),
    "5xx_after": (_APPLIED_LATE, _APPLIED_LATE),
    # not applied, answer ambiguous: a deduped repeat applies it; otherwise nothing
    # shows and nothing proves absence
    "5xx_before": ((C, C, U, U, C), (U, U, U, U, U)),
    "drop": ((C, C, U, U, C), (U, U, U, U, U)),
    # nothing left the machine / a validation rejection: provably not applied
    "never_connected": ((F, F, F, F, F), (F, F, F, F, F)),
    "reject": ((F, F, F, F, F), (F, F, F, F, F)),
}

# Faults whose subject is a reply that never comes in time: their cells go through a
# provider with a timeout shorter than the sim's hang (``hung``), so that the client
# gives up first. Every other cell's replies come back, and get a timeout no loaded
# machine outlasts.
HUNG = frozenset({"timeout_after_apply"})


def provider_for(fault: str) -> str:
    """The registry's provider a cell of ``fault`` is sent through (``_registry``)."""
    return "down" if fault == "never_connected" else "hung" if fault in HUNG else "sim"


CELLS = [
    pytest.param(fault, op, dedupe, id=f"{fault}-{op}-{'dedupe' if dedupe else 'nodedupe'}")
    for fault in EXPECTED
    for op in OPS
    for dedupe in (True, False)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[bool, SimServer]]:
    """One provider that deduplicates keys and one that does not."""
    with SimServer(hang=1.0, honour_keys=True) as on, SimServer(hang=1.0, honour_keys=False) as off:
        yield {True: on, False: off}


def _registry(server: SimServer, dedupe: bool) -> Registry:
    common = {
        "type": "sim",
        "timeout": PATIENT,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": VERIFY_DEADLINE,
        "attempts": 3,
        "dedupe": dedupe,
    }
    return Registry(
        {
            "sim": {**common, "base_url": server.url},
            # The same server, where a reply is meant to time out: its queries and
            # repeats get the short timeout too, and so a longer budget to land one in.
            "hung": {**common, "base_url": server.url, "timeout": SHORT, "verify_deadline": 5.0},
            "down": {**common, "base_url": f"http://127.0.0.1:{_free_port()}"},
        },
        source="test",
    )


@pytest.mark.parametrize(("fault", "op", "dedupe"), CELLS)
def test_fault_matrix_cell(
    servers: dict[bool, SimServer], db_path: Path, fault: str, op: str, dedupe: bool
) -> None:
    server = servers[dedupe]
    server.reset()  # fresh ground truth for this cell
    registry = _registry(server, dedupe)
    aid = f"m-{fault.replace(':', '_')}-{op}-{int(dedupe)}"
    provider = provider_for(fault)
    if provider != "down":
        server.plan(aid, fault)
    try:
        with Ledger.open(db_path) as ledger:
            d = Dispatcher(ledger, registry, settings=DispatchSettings(lease_grace=0.5), actor="t")
            d.submit(provider, op, {"name": aid, "value": "v"}, action_id=aid)
            settle(ledger, registry)
            statuses = check(ledger, server, ids=[aid], dedupes=dedupe)
            rec = ledger.get(aid)
    finally:
        registry.close()
    expected = EXPECTED[fault][0 if dedupe else 1][OPS.index(op)]
    assert rec.status is expected, (
        f"{fault} on {op} (dedupe {dedupe}): {rec.status}, expected {expected}: {rec.reason}"
    )
    assert statuses == {str(expected): 1}
    requests = server.requests_for(aid)
    if provider == "down":
        assert requests == []
    else:
        # The fault plan was used: the provider really saw the scripted fault first.
        assert requests and requests[0]["fault"] == fault
    if expected is U and rec.next_check_at is None:
        assert rec.reason  # the queue says why


def test_matrix_covers_every_fault_tier_and_dedupe() -> None:
    assert len(CELLS) == 11 * 5 * 2
    tiers = {"book": "full", "send": "reconcilable", "deliver": "partial", "notify": "blind"}
    assert set(tiers) <= set(OPS)


def test_two_sets_of_the_same_value_are_not_attributed_to_the_lost_one(
    servers: dict[bool, SimServer], db_path: Path
) -> None:
    server = servers[False]
    server.reset()
    registry = _registry(server, False)
    try:
        with Ledger.open(db_path) as ledger:
            d = Dispatcher(ledger, registry)
            server.plan("lost", "lost_after_accept")
            d.submit("sim", "set", {"name": "tz", "value": "UTC"}, action_id="lost")
            d.submit("sim", "set", {"name": "tz", "value": "UTC"}, action_id="applied")
            settle(ledger, registry)
            check(ledger, server, ids=["lost", "applied"])
    finally:
        registry.close()
