"""A provider that costs nothing, and rows shaped like the ones settled writes.

The null provider answers at once: ``do`` (full tier) with a reply that proves the
effect, ``send`` (reconcilable) with an acceptance; its query finds every effect
applied. With it, a benchmark measures settled's own work and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from settled.model import Tier
from settled.providers.base import (
    BaseProvider,
    Observation,
    OperationSpec,
    QueryTarget,
    Request,
    Seen,
    Wire,
    WireResult,
)

T0 = "2026-01-01T00:00:00.000000Z"
PAST = "2026-01-01T00:00:30.000000Z"  # due: every sweep runs "now", long after this
FAR = "2999-01-01T00:00:00.000000Z"
PARAMS = json.dumps({"to": "customer@example.com", "body": "your booking is confirmed"})
PHASH = "0" * 64


class NullProvider(BaseProvider):
    name = "null"

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency  # s each query takes, as a real provider's would
        common: dict[str, Any] = {
            "consistency_window": 0.0,
            "attempts": 1,
            "timeout": 5.0,
            "verify_interval": 1.0,
            "verify_deadline": 1e9,
        }
        self._ops = {
            "do": OperationSpec("do", Tier.FULL, **common),
            "send": OperationSpec(
                "send", Tier.RECONCILABLE, queryable=True, carries_key=True, **common
            ),
        }

    def operations(self) -> Mapping[str, OperationSpec]:
        return self._ops

    def execute(self, request: Request) -> WireResult:
        if request.operation == "do":
            return WireResult(Wire.ANSWERED, 201, "obj-1", True, "HTTP 201")
        return WireResult(Wire.ANSWERED, 202, "obj-1", None, "HTTP 202")

    def query(self, target: QueryTarget) -> Observation:
        if self.latency:
            import time

            time.sleep(self.latency)
        return Observation(Seen.APPLIED, "obj-1", "effect applied", {"status_code": 200})


def null_registry(latency: float = 0.0) -> Any:
    from settled.providers import Registry

    reg = Registry({}, source="bench")
    reg.add(NullProvider(latency))
    return reg


COLUMNS = (
    "action_id",
    "provider",
    "operation",
    "params",
    "params_hash",
    "tier",
    "reconciliation_key",
    "eligible_at",
    "requires_manual_verification",
    "attempt",
    "idempotency_key",
    "dispatch_id",
    "provider_object_id",
    "status",
    "delivery",
    "acceptance",
    "dispatched_at",
    "confirmed_at",
    "confirmed_by",
    "created_at",
    "updated_at",
    "lease_owner",
    "lease_expires_at",
    "next_check_at",
    "verify_started_at",
    "verify_deadline_at",
    "checks",
    "reason",
)
INSERT_ACTION = (
    f"INSERT INTO actions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
)
INSERT_EVENT = (
    "INSERT INTO events (action_id, at, actor, kind, from_status, to_status, attempt, detail)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def pending_row(aid: str, op: str = "do") -> tuple[Any, ...]:
    tier = "full" if op == "do" else "reconcilable"
    key = None if op == "do" else "stl-" + aid
    return (
        aid,
        "null",
        op,
        PARAMS,
        PHASH,
        tier,
        key,
        T0,
        0,
        1,
        f"{aid}:1",
        None,
        None,
        "PENDING",
        "PENDING",
        "UNKNOWN",
        None,
        None,
        None,
        T0,
        T0,
        None,
        None,
        None,
        None,
        None,
        0,
        None,
    )


def awaiting_row(aid: str) -> tuple[Any, ...]:
    """A reconcilable action accepted earlier and due for its check now."""
    return (
        aid,
        "null",
        "send",
        PARAMS,
        PHASH,
        "reconcilable",
        "stl-" + aid,
        T0,
        0,
        1,
        f"{aid}:1",
        "d-" + aid,
        "obj-1",
        "AWAITING_VERIFICATION",
        "DELIVERED",
        "UNKNOWN",
        T0,
        None,
        None,
        T0,
        T0,
        None,
        None,
        PAST,
        T0,
        FAR,
        0,
        "accepted (HTTP 202), not yet observed",
    )


def confirmed_row(aid: str) -> tuple[Any, ...]:
    """A settled action: no check time, so it is outside the due index."""
    return (
        aid,
        "null",
        "send",
        PARAMS,
        PHASH,
        "reconcilable",
        "stl-" + aid,
        T0,
        0,
        1,
        f"{aid}:1",
        "d-" + aid,
        "obj-1",
        "CONFIRMED",
        "DELIVERED",
        "ACCEPTED",
        T0,
        T0,
        "reconciliation",
        T0,
        T0,
        None,
        None,
        None,
        T0,
        FAR,
        1,
        None,
    )


def event_row(
    aid: str, kind: str = "recorded", frm: str | None = None, to: str = "PENDING"
) -> tuple[Any, ...]:
    return (aid, T0, "bench", kind, frm, to, 1, '{"tier": "reconcilable"}')


def new_ledger(path: str) -> None:
    """Create an empty ledger with settled's own schema (migrations, pragmas)."""
    from settled import Ledger

    Ledger.open(path).close()


def bulk_insert(path: str, rows: list[tuple[Any, ...]], events: list[tuple[Any, ...]]) -> None:
    """Fill a ledger fast for a benchmark's setup (not timed; durability off meanwhile)."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        conn.executemany(INSERT_ACTION, rows)
        conn.executemany(INSERT_EVENT, events)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
