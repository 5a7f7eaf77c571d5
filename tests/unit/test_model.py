"""The state machine and the strategy rules, with an injected clock."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from records import move, new_record

from settled.errors import TransitionNotAllowed
from settled.model import (
    TRANSITIONS,
    EventKind,
    Status,
    Tier,
    build_strategy,
    check_transition,
    idempotency_key,
)
from settled.storage import Ledger

pytestmark = pytest.mark.ledger_free

ALL_PAIRS = list(itertools.product(Status, Status))


def _path_to(target: Status) -> list[tuple[Status, Status]]:
    """The shortest chain of allowed moves from PENDING to ``target`` (breadth first)."""
    paths: dict[Status, list[tuple[Status, Status]]] = {Status.PENDING: []}
    frontier = [Status.PENDING]
    while frontier:
        nxt = []
        for s in frontier:
            for frm, to in sorted(TRANSITIONS):
                if frm is s and to not in paths:
                    paths[to] = [*paths[s], (frm, to)]
                    nxt.append(to)
        frontier = nxt
    return paths[target]


@pytest.mark.parametrize(("frm", "to"), sorted(TRANSITIONS))
def test_every_allowed_move_is_made_by_the_ledger(
    frm: Status, to: Status, mem_ledger: Ledger
) -> None:
    """Each move of the table, replayed through the ledger's one way of moving a
    record: reached from PENDING by allowed moves, then made, logged, and refused a
    second time once the record has left ``frm`` (unless it stays)."""
    mem_ledger.record(new_record("m"), actor="t")
    for a, b in _path_to(frm):
        assert mem_ledger.move(move("m", a, b, EventKind.OUTCOME)) is not None
    moved = mem_ledger.move(move("m", frm, to, EventKind.OUTCOME))
    assert moved is not None and moved.status is to
    last = mem_ledger.events("m")[-1]
    assert (last.from_status, last.to_status) == (frm, to)
    again = mem_ledger.move(move("m", frm, to, EventKind.OUTCOME))
    assert (again is not None) is (frm is to)


@pytest.mark.parametrize(("frm", "to"), [p for p in ALL_PAIRS if p not in TRANSITIONS])
def test_every_other_move_is_refused(frm: Status, to: Status) -> None:
    with pytest.raises(TransitionNotAllowed):
        check_transition(frm, to)


def test_the_table_keeps_the_promises() -> None:
    # Nothing leaves CONFIRMED; a new attempt only from FAILED; unresolved never
    # goes back to PENDING (no silent re-send).
    assert not [p for p in TRANSITIONS if p[0] is Status.CONFIRMED]
    assert [p for p in TRANSITIONS if p[1] is Status.PENDING] == [(Status.FAILED, Status.PENDING)]
    assert (Status.DENIED_UNRESOLVED, Status.IN_FLIGHT) not in TRANSITIONS
    assert [p for p in TRANSITIONS if p[1] is Status.IN_FLIGHT] == [
        (Status.PENDING, Status.IN_FLIGHT)
    ]


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_strategy_full() -> None:
    s = build_strategy(Tier.FULL, NOW, 30)
    assert (s.tier, s.reconciliation_key, s.eligible_at, s.requires_manual_verification) == (
        Tier.FULL,
        None,
        NOW,
        False,
    )


def test_strategy_full_that_carries_a_key_gets_one() -> None:
    s = build_strategy("full", NOW, 30, carries_key=True)
    assert s.reconciliation_key and s.eligible_at == NOW and not s.requires_manual_verification


def test_strategy_reconcilable() -> None:
    s = build_strategy(Tier.RECONCILABLE, NOW, 45)
    assert s.reconciliation_key and s.reconciliation_key.startswith("stl-")
    assert s.eligible_at == NOW + timedelta(seconds=45)
    assert s.requires_manual_verification is False


def test_strategy_partial() -> None:
    s = build_strategy(Tier.PARTIAL, NOW, 10)
    assert s.reconciliation_key
    assert s.eligible_at == NOW + timedelta(seconds=10)
    assert s.requires_manual_verification is True


def test_strategy_blind() -> None:
    s = build_strategy(Tier.BLIND, NOW, 10)
    assert (s.reconciliation_key, s.eligible_at, s.requires_manual_verification) == (
        None,
        None,
        True,
    )


def test_keys_are_unique_and_idempotency_key_format() -> None:
    keys = {build_strategy(Tier.RECONCILABLE, NOW).reconciliation_key for _ in range(200)}
    assert len(keys) == 200
    assert idempotency_key("order-7", 2) == "order-7:2"


def test_bad_tier_and_window() -> None:
    with pytest.raises(ValueError):
        build_strategy("gold", NOW)
    with pytest.raises(ValueError):
        build_strategy(Tier.FULL, NOW, -1)


def test_stored_times_read_back_exactly() -> None:
    from datetime import UTC, datetime

    from settled.clock import _FMT, from_text, to_text

    for text in (
        "2026-01-01T00:00:00.000000Z",
        "2999-12-31T23:59:59.999999Z",
        "2026-03-04T05:06:07.123456Z",
        "0999-01-01T00:00:00.000001Z",
    ):
        slow = datetime.strptime(text, _FMT).replace(tzinfo=UTC)
        assert from_text(text) == slow and from_text(text).tzinfo == UTC  # type: ignore[union-attr]
        assert to_text(from_text(text)) == to_text(slow)
    for bad in (
        "2026-02-30T00:00:00.000000Z",
        "2026-01-01T24:00:00.000000Z",
        "2026-01-01T00:00:00.000000",
        "2026-01-01 00:00:00.000000Z",
        "soon",
    ):
        with pytest.raises(ValueError):
            from_text(bad)


def test_no_module_retypes_a_list_of_the_models_names() -> None:
    """Status, delivery and acceptance lists are derived from the model's enums
    (``selection.STATUSES``, ``model.TERMINAL``), never retyped as string literals: a
    new status then reaches every selector, count and check at once."""
    import ast
    from pathlib import Path

    from settled.model import Acceptance, Delivery, Status

    names = {str(v) for enum in (Status, Delivery, Acceptance) for v in enum}
    package = Path(__file__).resolve().parents[2] / "settled"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "model.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Tuple | ast.List | ast.Set) or len(node.elts) < 2:
                continue
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if all(isinstance(v, str) and v in names for v in values):
                found.append(f"settled/{path.relative_to(package)}:{node.lineno} {values}")
    assert not found, "derive these from settled.model's enums:\n" + "\n".join(found)
    assert "DENIED_UNRESOLVED" in names and "DELIVERED" in names and "ACCEPTED" in names
