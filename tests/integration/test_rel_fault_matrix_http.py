"""The fault matrix for the declarative ``http`` provider: the sim server described by an
http config (docs/providers.md), every fault × every tier the http provider can express ×
``idempotency_header`` on/off, run to completion and checked against the server's
ground truth.

The sim server takes a generic client's plain params body: the key in the
``reconciliation_key`` field, the action named by the ``Idempotency-Key`` header when
there is one, else by the ``action_id`` field of the params. One server (it
deduplicates keys it is sent) serves every cell; with the header off it is sent no
key, so it cannot deduplicate.

Each cell asserts the exact final status, the most specific one the evidence allows,
and the invariants of ``invariants.check``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

VERIFY_DEADLINE = 0.4  # s of verification budget
LAG_INSIDE = "lag:0.05"
LAG_OUTSIDE = "lag:60"

# The tiers an http operation can be declared with. A full operation may have a query
# (it settles a lost reply by evidence) or not (only its reply proves anything).
OPS: dict[str, dict[str, Any]] = {
    "book": {"tier": "full", "path": "/v1/book", "applied": ["booked", "applied"], "query": True},
    "book_replyonly": {"tier": "full", "path": "/v1/book", "applied": ["booked"], "query": False},
    "send": {"tier": "reconcilable", "path": "/v1/send", "applied": ["delivered"], "query": True},
    "deliver": {"tier": "partial", "path": "/v1/deliver", "query": False},
    "notify": {"tier": "blind", "path": "/v1/notify", "query": False},
}
NAMES = tuple(OPS)

# fault -> (idempotency_header on, off), per op in NAMES order:
#          book  book_replyonly  send  deliver  notify
_APPLIED_LATE = ((C, C, C, U, U), (C, U, C, U, U))  # applied; the reply was lost
EXPECTED: dict[str, tuple[tuple[Status, ...], tuple[Status, ...]]] = {
    # "queued", then dropped: nothing ever shows and nothing proves absence
    "lost_after_accept": ((U, U, U, U, U), (U, U, U, U, U)),
    # the full reply proves it; within the budget the query observes it too
    LAG_INSIDE: ((C, C, C, U, U), (C, C, C, U, U)),
    LAG_OUTSIDE: ((C, C, U, U, U), (C, C, U, U, U)),
    # "queued", then bounced: only a query can prove the absence
    "bounce": ((F, U, F, U, U), (F, U, F, U, U)),
    # applied, reply lost: with the header a repeat replays the stored reply (a full
    # reply proves it); without, only a query can tell
    "timeout_after_apply": _APPLIED_LATE,
    "reset_after_apply": _APPLIED_LATE,
    "5xx_after": _APPLIED_LATE,
    # not applied, answer ambiguous: with the header the repeat applies it once;
    # without, no repeat, and nothing proves absence
    "5xx_before": ((C, C, C, U, U), (U, U, U, U, U)),
    "drop": ((C, C, C, U, U), (U, U, U, U, U)),
    # provably not applied
    "never_connected": ((F,) * 5, (F,) * 5),
    "reject": ((F,) * 5, (F,) * 5),
}

# Faults whose subject is a reply that never comes in time: their cells go through a
# provider with a timeout shorter than the sim's hang (``hung``), so that the client
# gives up first; every other cell's replies come back, and get a timeout no loaded
# machine outlasts.
HUNG = frozenset({"timeout_after_apply"})


def provider_for(fault: str) -> str:
    """The registry's provider a cell of ``fault`` is sent through (``_registry``)."""
    return "down" if fault == "never_connected" else "hung" if fault in HUNG else "api"


CELLS = [
    pytest.param(fault, op, header, id=f"{fault}-{op}-{'header' if header else 'noheader'}")
    for fault in EXPECTED
    for op in NAMES
    for header in (True, False)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0, honour_keys=True) as s:
        yield s


def _operation(
    name: str, header: bool, timeout: float = PATIENT, deadline: float = VERIFY_DEADLINE
) -> dict[str, Any]:
    d = OPS[name]
    conf: dict[str, Any] = {
        "tier": d["tier"],
        "consistency_window": 0,
        "attempts": 3,
        "timeout": timeout,
        "request": {"method": "POST", "path": d["path"]},
    }
    if header:
        conf["idempotency_header"] = "Idempotency-Key"
    if d["tier"] != "blind":
        conf["reconciliation_key_field"] = "reconciliation_key"
    if d["tier"] == "full":
        conf.update(object_id="/id", status="/status", applied=d["applied"])
    if d["query"]:
        conf.update(
            query={"method": "GET", "path": "/v1/effects/{reconciliation_key}"},
            status="/status",
            applied=d["applied"],
            not_applied=["bounced"],
            verify={"interval": 0.05, "deadline": deadline},
        )
    return conf


def _registry(server: SimServer, header: bool) -> Registry:
    ops = {name: _operation(name, header) for name in NAMES}
    # The same server, where a reply is meant to time out: its queries and repeats get
    # the short timeout too, and so a longer budget to land one in.
    hung = {name: _operation(name, header, SHORT, 5.0) for name in NAMES}
    return Registry(
        {
            "api": {"type": "http", "base_url": server.url, "timeout": PATIENT, "operations": ops},
            "hung": {"type": "http", "base_url": server.url, "timeout": SHORT, "operations": hung},
            "down": {
                "type": "http",
                "base_url": f"http://127.0.0.1:{_free_port()}",
                "timeout": PATIENT,
                "operations": ops,
            },
        },
        source="test",
    )


@pytest.mark.parametrize(("fault", "op", "header"), CELLS)
def test_http_fault_matrix_cell(
    server: SimServer, db_path: Path, fault: str, op: str, header: bool
) -> None:
    server.reset()
    registry = _registry(server, header)
    aid = f"h-{fault.replace(':', '_')}-{op}-{int(header)}"
    provider = provider_for(fault)
    if provider != "down":
        server.plan(aid, fault)
    try:
        with Ledger.open(db_path) as ledger:
            d = Dispatcher(
                ledger,
                registry,
                settings=DispatchSettings(lease_grace=0.5, backoff=0.01),
                actor="t",
            )
            d.submit(provider, op, {"to": "a@example.com", "action_id": aid}, action_id=aid)
            settle(ledger, registry)
            statuses = check(ledger, server, ids=[aid], dedupes=header)
            rec = ledger.get(aid)
    finally:
        registry.close()
    expected = EXPECTED[fault][0 if header else 1][NAMES.index(op)]
    assert rec.status is expected, (
        f"{fault} on {op} (header {header}): {rec.status}, expected {expected}: {rec.reason}"
    )
    assert statuses == {str(expected): 1}
    requests = server.requests_for(aid)
    if provider == "down":
        assert requests == []
        return
    assert requests and requests[0]["fault"] == fault  # the scripted fault was met
    # What the server received: the header only when declared, the key in its field
    # only where the tier carries one.
    assert {r["idempotency_key"] for r in requests} == ({f"{aid}:1"} if header else {None})
    want_key = None if OPS[op]["tier"] == "blind" else rec.reconciliation_key
    assert {r["reconciliation_key"] for r in requests} == {want_key}
    assert server.effects_for(aid) <= 1
    if not header:
        assert len(requests) == 1, "repeated without a deduplicating key"


def test_http_matrix_covers_every_fault_tier_and_header() -> None:
    assert len(CELLS) == 11 * 5 * 2
    assert {d["tier"] for d in OPS.values()} == {"full", "reconcilable", "partial", "blind"}
