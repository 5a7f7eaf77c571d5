"""The invariants every reliability test checks: the ledger against the sim provider's
ground truth (what was really applied, what was really received), and the event log
against the transition table.

    check(ledger, server, ids=..., dedupes=...)   -> Counter of final statuses
    settle(ledger, registry)                      -> run reconciliation until nothing is due
    budget(), scaled(n)                           -> the SETTLED_TEST_BUDGET multiplier

A failed check raises AssertionError naming the action and what it saw, so a test can
simply call ``check`` after its scenario.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import rawdb

from settled import Ledger
from settled.clock import Clock, from_text
from settled.model import (
    CORRECTIONS,
    EVIDENCE_CORRECTIONS,
    TRANSITIONS,
    Acceptance,
    ActionRecord,
    EventKind,
    Status,
)
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler

SETTLED_STATUSES = frozenset({Status.CONFIRMED, Status.FAILED, Status.DENIED_UNRESOLVED})


def budget() -> float:
    """``SETTLED_TEST_BUDGET`` (default 1): multiplies example counts and durations."""
    raw = os.environ.get("SETTLED_TEST_BUDGET", "1")
    try:
        value = float(raw)
    except ValueError:
        raise RuntimeError(f"SETTLED_TEST_BUDGET={raw!r} is not a number") from None
    return max(value, 0.1)


def scaled(n: float) -> int:
    return max(1, round(n * budget()))


# ------------------------------------------------------------------------ the ledger


def all_records(ledger: Ledger) -> list[ActionRecord]:
    return ledger.query()


def dump(path: str | os.PathLike[str]) -> list[tuple[Any, ...]]:
    """Every row of every table, read through a separate connection: what a rejected
    command must leave unchanged (either backend)."""
    return rawdb.dump(path)


def check_events(ledger: Ledger, rec: ActionRecord) -> int:
    """Every stored move is in the table, and replaying the log gives the current
    status (and attempt). Returns the number of events."""
    events = ledger.events(rec.action_id)
    assert events, f"{rec.action_id}: no events"
    first = events[0]
    assert (first.kind, first.from_status, first.to_status) == ("recorded", None, "PENDING"), (
        f"{rec.action_id}: log does not start with the recording: {first}"
    )
    state = Status.PENDING
    for ev in events[1:]:
        assert ev.from_status == state, (
            f"{rec.action_id}: event {ev.id} ({ev.kind}) moves from {ev.from_status}, "
            f"but the log had reached {state}"
        )
        move = (Status(ev.from_status), Status(ev.to_status))
        if ev.kind == EventKind.NOTE:  # evidence that moves nothing
            assert move[0] is move[1], f"{rec.action_id}: note {ev.id} moves {move}"
            continue
        allowed = (
            move in TRANSITIONS
            or (ev.kind == EventKind.RESOLVED and move in CORRECTIONS)
            or (ev.kind == EventKind.RECONCILED and move in EVIDENCE_CORRECTIONS)
        )
        assert allowed, f"{rec.action_id}: event {ev.id} {move} is not in the table"
        assert ev.actor, f"{rec.action_id}: event {ev.id} has no actor"
        state = Status(ev.to_status)
    assert state is rec.status, f"{rec.action_id}: log replays to {state}, record says {rec.status}"
    assert events[-1].attempt == rec.attempt, f"{rec.action_id}: attempt differs from its log"
    return len(events)


# ------------------------------------------------------------------------ the checks


def check(
    ledger: Ledger,
    server: SimServer | None,
    *,
    ids: Iterable[str] | None = None,
    dedupes: bool = False,
    final: bool = True,
    open_ok: Iterable[str] = (),
) -> Counter[str]:
    """Assert the invariants over every record in ``ledger``:

    - no CONFIRMED without an applied effect, no FAILED with one;
    - at most one effect per action;
    - at most one request per attempt (idempotency key; in all, when the operation
      sends no key) when the provider does not deduplicate; no request for an attempt
      the ledger does not know;
    - every action accounted for: the ledger holds exactly ``ids`` (when given), every
      request the provider saw belongs to a recorded action, and (``final``) nothing is
      left PENDING or IN_FLIGHT except ``open_ok``;
    - the event log replays to each record and uses only allowed moves;
    - ``PRAGMA integrity_check`` is ok.
    """
    records = all_records(ledger)
    by_id = {r.action_id: r for r in records}
    if ids is not None:
        want = set(ids)
        assert set(by_id) == want, (
            f"ledger rows differ from the actions submitted: lost {sorted(want - set(by_id))}, "
            f"stray {sorted(set(by_id) - want)}"
        )
    truth = server.truth() if server is not None else {"requests": [], "effects": {}}
    seen_ids = {r["action_id"] for r in truth["requests"]}
    assert seen_ids <= set(by_id), (
        f"provider saw unrecorded actions: {sorted(seen_ids - set(by_id))}"
    )
    requests: dict[str, list[dict[str, Any]]] = {}
    for r in truth["requests"]:
        requests.setdefault(r["action_id"], []).append(r)
    open_ok = set(open_ok)
    statuses: Counter[str] = Counter()
    for rec in records:
        aid = rec.action_id
        effects = int(truth["effects"].get(aid, 0))
        reqs = requests.get(aid, [])
        where = f"{aid} ({rec.provider}.{rec.operation}, {rec.status}, attempt {rec.attempt})"
        assert effects <= 1, f"{where}: {effects} effects applied"
        if rec.status is Status.CONFIRMED:
            assert effects == 1, f"{where}: CONFIRMED without an applied effect"
            assert rec.acceptance is Acceptance.APPLIED and rec.confirmed_by, where
        if rec.status is Status.FAILED:
            # No late effect after FAILED: once FAILED, no request of the attempt can
            # still land (rule 9), so the provider never shows an effect later.
            assert effects == 0, f"{where}: FAILED although the effect was applied"
            assert rec.acceptance is Acceptance.NOT_APPLIED, where
        known = {f"{aid}:{n}" for n in range(1, rec.attempt + 1)}
        keys = Counter(r["idempotency_key"] for r in reqs if r["idempotency_key"] is not None)
        assert set(keys) <= known, f"{where}: requests under unknown keys {set(keys) - known}"
        if not dedupes:
            dup = {k: n for k, n in keys.items() if n > 1}
            assert not dup, f"{where}: sent more than once per attempt without dedupe: {dup}"
            # An operation without an idempotency header sends no key: then at most one
            # request per attempt in all.
            keyless = sum(1 for r in reqs if r["idempotency_key"] is None)
            assert keyless + sum(keys.values()) <= rec.attempt or not keyless, (
                f"{where}: {keyless} keyless request(s) for {rec.attempt} attempt(s)"
            )
        if final and aid not in open_ok:
            assert rec.status in SETTLED_STATUSES, f"{where}: left {rec.status}"
            assert rec.next_check_at is None or rec.status is Status.DENIED_UNRESOLVED, where
        if rec.status is Status.DENIED_UNRESOLVED:
            assert rec.reason, f"{where}: unresolved without a reason"
        check_events(ledger, rec)
        statuses[str(rec.status)] += 1
    assert ledger.integrity_check() == "ok"
    return statuses


def no_second_effect_after_a_verdict(ledger: Ledger, server: SimServer) -> list[str]:
    """Rule 14: no action a person said was not applied, on an operation with a query,
    has its effect applied twice: the check made before the verdict (and again before
    any retry) refuses it when the effect is visible. Returns the actions that break it."""
    broken = []
    for rec in all_records(ledger):
        if rec.declared is None or not rec.declared.queryable:
            continue
        said = [
            e
            for e in ledger.events(rec.action_id)
            if e.kind == EventKind.RESOLVED and e.detail.get("verdict") == "not_applied"
        ]
        if said and server.effects_for(rec.action_id) > 1:
            broken.append(rec.action_id)
    return broken


def contradictions_block_retry(ledger: Ledger, dispatcher: Any, server: SimServer | None) -> int:
    """Every record flagged with a contradiction refuses ``retry`` and sends nothing;
    returns how many there are."""
    from settled.errors import TransitionNotAllowed

    flagged = [r for r in all_records(ledger) if r.contradiction is not None]
    for rec in flagged:
        sent = len(server.requests_for(rec.action_id)) if server is not None else 0
        try:
            dispatcher.retry(rec.action_id)
        except TransitionNotAllowed:
            pass
        else:
            raise AssertionError(f"{rec.action_id}: retry went ahead despite {rec.contradiction}")
        if server is not None:
            assert len(server.requests_for(rec.action_id)) == sent, rec.action_id
        assert ledger.get(rec.action_id).attempt == rec.attempt, rec.action_id
    return len(flagged)


# ------------------------------------------------------------------------ driving


def settle(
    ledger: Ledger,
    registry: Any,
    *,
    clock: Clock | None = None,
    lease: float = 5.0,
    timeout: float = 20.0,
    concurrency: int = 1,
) -> int:
    """Run reconciliation passes (real time) until no record has a check scheduled.
    Returns the number of passes. Bounded by ``timeout`` seconds. ``concurrency`` > 1
    runs each batch's queries from that many threads."""
    clock = clock or Clock()
    reconciler = Reconciler(ledger, registry, clock=clock, lease=lease, concurrency=concurrency)
    deadline = time.monotonic() + timeout
    passes = 0
    while True:
        reconciler.run_due()
        passes += 1
        pending = [r.next_check_at for r in ledger.query() if r.next_check_at is not None]
        if not pending:
            return passes
        assert time.monotonic() < deadline, f"records still scheduled after {timeout} s: {pending}"
        soonest = min(from_text(t) for t in pending)  # type: ignore[type-var]
        gap = (soonest - clock.now()).total_seconds()  # type: ignore[operator]
        time.sleep(min(max(gap, 0.005), 0.2))
