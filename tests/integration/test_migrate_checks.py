"""The schema step that rule 15 needs (``counted_checks``, ``check_error``) on a ledger
written before it, on both backends: the records keep every field, the checks already
made (the schedule's) count, and nothing else changes."""

from __future__ import annotations

from typing import Any

import rawdb
from records import new_record

from settled import Ledger
from settled.model import Status, Tier
from settled.storage import postgres_schema, sqlite_schema


def the_step(location: Any) -> tuple[int, str]:
    """The step's number and name on this backend (found by name: the latest step)."""
    steps = (postgres_schema if rawdb.is_pg(location) else sqlite_schema).MIGRATIONS
    number, name = next(
        (n, name) for n, (name, _) in enumerate(steps, 1) if name.endswith("_checks")
    )
    assert [name for name, _ in steps[number:]] == list(
        LATER[steps is postgres_schema.MIGRATIONS]
    ), "undo every step after the checks step here too"
    return number, name


# The steps after the checks step, and what undoes each (newest first).
LATER = {
    False: (
        "007_status_has_event",
        "008_moved",
        "009_erasure",
        "010_counts",
        "011_verified",
        "012_cause",
        "013_search",
        "014_events_audit",
        "015_queue_order",
    ),
    True: (
        "004_status_has_event",
        "005_moved",
        "006_erasure",
        "007_counts",
        "008_verified",
        "009_cause",
        "010_search",
        "011_events_audit",
        "012_queue_order",
    ),
}
_GUARDS = (
    ("actions", "DELETE", "actions are never deleted"),
    ("events", "UPDATE", "events are append-only"),
    ("events", "DELETE", "events are append-only"),
)
ERASURE_UNDO_SQLITE = [
    "DROP TABLE erasing",
    "DROP TABLE ledger_events",
    *(f"DROP TRIGGER {t}_no_{v.lower()}" for t, v, _ in _GUARDS),
    *(
        f"CREATE TRIGGER {t}_no_{v.lower()} BEFORE {v} ON {t}"
        f" BEGIN SELECT RAISE(ABORT, 'settled: {why}'); END"
        for t, v, why in _GUARDS
    ),
]
UNDO_ORDER = ["DROP INDEX actions_triage", "DROP INDEX actions_created"]
UNDO_SQLITE = [
    *UNDO_ORDER,
    *(f"DROP INDEX events_{i}" for i in ("at", "actor", "kind")),
    "DROP TRIGGER actions_search_delete",
    "DROP TRIGGER actions_search_update",
    "DROP TRIGGER actions_search_insert",
    "DROP TABLE actions_search",
    "DROP VIEW actions_search_text",
    "ALTER TABLE actions DROP COLUMN cause",
    "DROP TABLE verify_checkpoint",
    "DROP TABLE action_counts",
    *ERASURE_UNDO_SQLITE,
    *(
        f"DROP TRIGGER {t}_not_moved_{v}"
        for t, v in (
            ("actions", "insert"),
            ("actions", "update"),
            ("events", "insert"),
            ("callbacks", "insert"),
            ("callbacks", "update"),
        )
    ),
    "DROP TABLE ledger_moved",
    "DROP TRIGGER actions_status_has_event",
]
ERASURE_UNDO_PG = [
    "DROP TABLE erasing",
    "DROP TABLE ledger_events",
    *(f"DROP TRIGGER {t}_no_{v.lower()} ON {t}" for t, v, _ in _GUARDS),
    "DROP FUNCTION settled_guard_history()",
    "DROP FUNCTION settled_erasing_ends()",
    "DROP FUNCTION settled_erasing_allowed()",
    *(
        f"CREATE TRIGGER {t}_no_{v.lower()} BEFORE {v} ON {t}"
        f" FOR EACH ROW EXECUTE FUNCTION settled_refuse('{why}')"
        for t, v, why in _GUARDS
    ),
]
UNDO_PG = [
    *UNDO_ORDER,
    *(f"DROP INDEX events_{i}" for i in ("at", "actor", "kind")),
    "DROP INDEX actions_search",
    "DROP FUNCTION settled_search_text(text, text, text)",
    "ALTER TABLE actions DROP COLUMN cause",
    "DROP TABLE verify_checkpoint",
    "DROP TABLE action_counts",
    *ERASURE_UNDO_PG,
    *(f"DROP TRIGGER {t}_not_moved ON {t}" for t in ("actions", "events", "callbacks")),
    "DROP FUNCTION settled_not_moved()",
    "DROP FUNCTION settled_moved()",
    "DROP TABLE ledger_moved",
    "DROP TRIGGER actions_status_has_event ON actions",
    "DROP FUNCTION settled_status_has_event()",
]


def before_the_step(location: Any) -> None:
    """Make the ledger look as one written before the step did."""
    number, name = the_step(location)
    pg = rawdb.is_pg(location)
    for statement in UNDO_PG if pg else UNDO_SQLITE:
        rawdb.execute(location, statement)
    for later in LATER[pg]:
        rawdb.execute(location, "DELETE FROM _migrations WHERE name = ?", (later,))
    rawdb.execute(location, "DROP INDEX actions_check_error")
    for column in ("counted_checks", "check_error"):
        rawdb.execute(location, f"ALTER TABLE actions DROP COLUMN {column}")
    rawdb.execute(location, "DELETE FROM _migrations WHERE name = ?", (name,))
    if rawdb.is_pg(location):
        rawdb.execute(location, "UPDATE settled_ledger SET version = ?", (number - 1,))
    else:
        rawdb.execute(location, f"PRAGMA user_version = {number - 1}")


def test_a_ledger_from_before_the_step_is_migrated_and_its_checks_count(location: Any) -> None:
    with Ledger.open(location) as led:
        led.record(new_record("old", tier=Tier.RECONCILABLE), actor="t")
        led.record(new_record("new", tier=Tier.RECONCILABLE), actor="t")
    rawdb.execute(location, "UPDATE actions SET checks = 4 WHERE action_id = 'old'")
    before_the_step(location)
    with Ledger.open(location) as led:
        old, new = led.get("old"), led.get("new")
        assert (old.checks, old.counted_checks, old.check_error) == (4, 4, None)
        assert (new.checks, new.counted_checks) == (0, 0) and old.status is Status.PENDING
        assert [e.kind for e in led.events("old")] == ["recorded"]
        assert led.integrity_check() == "ok"
        assert led.check_failures() == {}
    names = [r[0] for r in rawdb.execute(location, "SELECT name FROM _migrations ORDER BY name")]
    steps = postgres_schema if rawdb.is_pg(location) else sqlite_schema
    assert names == [name for name, _ in steps.MIGRATIONS]
    with Ledger.open(location) as led:  # reopening applies nothing twice
        assert led.get("old").counted_checks == 4
