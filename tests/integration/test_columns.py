"""The tables defined once (``storage.columns``): the column lists, what a move may
set, and the row mappings are generated from the values they hold (``ActionRecord``,
``Event``, a kept ``Callback``), and each backend's schema holds exactly those columns,
in that order, with the type each field's codec stores."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from typing import Any

import pytest
import rawdb

from settled import Ledger, policy
from settled.clock import to_text, utcnow
from settled.model import RECORD_FIELDS, ActionRecord, Declared, EventKind, Status, Tier
from settled.policy import new_record
from settled.storage import Move, columns
from settled.storage import ledger as interface

# What each codec's values are stored as, by backend.
SQLITE_TYPES = {"integer": "INTEGER", "boolean": "INTEGER"}  # everything else TEXT
PG_TYPES = {"integer": "integer", "boolean": "boolean", "time": "timestamp with time zone"}


def _ddl(location: Any, table: str) -> list[tuple[str, str]]:
    if rawdb.is_pg(location):
        return [
            (str(n), str(t))
            for n, t in rawdb.execute(
                location,
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = ?"
                " ORDER BY ordinal_position",
                (table,),
            )
        ]
    return [
        (str(n), str(t))
        for n, t in rawdb.execute(
            location, "SELECT name, type FROM pragma_table_info(?) ORDER BY cid", (table,)
        )
    ]


@pytest.mark.parametrize("table", sorted(columns.TABLES))
def test_the_schema_holds_each_tables_columns_on_both_backends(
    ledger: Ledger, db_path: Any, table: str
) -> None:
    """Records, events and kept callbacks: each table's columns are its definition's,
    in order, stored as each codec says (the events' key as the numbered integer)."""
    ddl = _ddl(db_path, table)
    defined = columns.TABLES[table]
    assert [name for name, _ in ddl] == list(defined.names)
    pg = rawdb.is_pg(db_path)
    for (name, stored), col in zip(ddl, defined, strict=True):
        kind = col.codec.kind
        expected = PG_TYPES.get(kind, "text") if pg else SQLITE_TYPES.get(kind, "TEXT")
        if col.numbered:
            expected = "bigint" if pg else "INTEGER"
        assert stored == expected, f"{table}.{name} ({kind}) is {stored}"


def test_the_table_is_the_records_fields() -> None:
    assert columns.COLUMNS == tuple(f.name for f in fields(ActionRecord))
    assert interface.COLUMNS == columns.COLUMNS and interface.WRITABLE == columns.WRITABLE
    assert interface.WRITABLE == set(columns.COLUMNS) - columns.FIXED
    # the public JSON is the fields less the two the ledger keeps for itself
    assert set(columns.COLUMNS) - set(RECORD_FIELDS) == {"verify_started_at", "snapshot"}
    assert list(RECORD_FIELDS) == [c for c in columns.COLUMNS if c in RECORD_FIELDS]
    kinds = {c.name: c.codec.kind for c in columns.TABLE}
    assert kinds["status"] == kinds["tier"] == "enum"
    assert kinds["requires_manual_verification"] == "boolean"
    assert kinds["params"] == kinds["snapshot"] == kinds["declared"] == "json"
    assert kinds["lands_by"] == kinds["created_at"] == "time"
    assert columns.BOOLS == ("requires_manual_verification",)


def _full_record() -> ActionRecord:
    """A record whose every field holds a value other than its default."""
    now = utcnow()
    rec = new_record(
        action_id="a-1",
        provider="sim",
        operation="send",
        params={"to": "x", "n": [1, 2.5, None], "é": True},
        declared=Declared(Tier.RECONCILABLE, key_param="to"),
        now=now,
    )
    at = to_text(now)
    filled = {
        f.name: getattr(rec, f.name) if getattr(rec, f.name) is not None else at
        for f in fields(ActionRecord)
        if f.name.endswith("_at") or f.name == "lands_by"
    }
    return replace(
        rec,
        **filled,
        dispatch_id="d",
        provider_object_id="o",
        confirmed_by="provider",
        lease_owner="me",
        checks=3,
        counted_checks=2,
        reason="r",
        contradiction="c",
        check_error="e",
        snapshot={"k": [1]},
        status=Status.CONFIRMED,
        requires_manual_verification=True,
    )


def test_a_row_maps_back_to_the_same_record() -> None:
    rec = _full_record()
    row = columns.to_row(rec)
    assert list(row) == list(columns.COLUMNS)
    assert row["requires_manual_verification"] == 1 and row["status"] == "CONFIRMED"
    assert row["params"] == '{"n": [1, 2.5, null], "to": "x", "é": true}'  # the hashed text
    assert columns.from_row(row) == rec
    bare = replace(rec, snapshot=None, declared=None, requires_manual_verification=False)
    assert columns.from_row(columns.to_row(bare)) == bare
    with pytest.raises(ValueError, match="Out of range float values"):
        columns.to_row(replace(rec, params={"x": float("nan")}))


def test_a_null_column_reads_as_the_fields_default() -> None:
    row = columns.to_row(_full_record())
    row.update(checks=None, counted_checks=None, snapshot=None, declared=None)
    del row["lands_by"]  # a column an older row never had
    rec = columns.from_row(row)
    assert (rec.checks, rec.counted_checks, rec.snapshot, rec.declared, rec.lands_by) == (
        0,
        0,
        None,
        None,
        None,
    )


def test_a_stored_record_reads_back_whole_on_both_backends(ledger: Ledger) -> None:
    rec = _full_record()
    pending = replace(rec, status=Status.PENDING, confirmed_at=None, confirmed_by=None)
    ledger.record(pending, actor="t")
    values = {k: v for k, v in columns.to_row(rec).items() if k in columns.WRITABLE}
    values["status"] = str(Status.IN_FLIGHT)
    moved = ledger.move(
        Move(
            "a-1",
            Status.PENDING,
            Status.IN_FLIGHT,
            rec.updated_at,
            "t",
            EventKind.CLAIMED,
            values={k: v for k, v in values.items() if k != "status"},
        )
    )
    assert moved is not None
    assert ledger.get("a-1") == moved == replace(rec, status=Status.IN_FLIGHT)


def test_a_reopened_attempt_starts_every_column_over_but_its_lease_and_contradiction() -> None:
    """``policy.reopen`` sets every column a move may set (a field added to the record
    too): the new attempt's own values, else the field's default; the status is the
    move's, and the lease and the contradiction stay as they were."""
    failed = replace(_full_record(), status=Status.FAILED)
    assert failed.declared is not None
    move = policy.reopen(failed, failed.declared, utcnow(), actor="t")
    kept = {"status", "lease_owner", "lease_expires_at", "contradiction"}
    assert set(move.values) == columns.WRITABLE - kept
    own = {
        "attempt",
        "idempotency_key",
        "reconciliation_key",
        "eligible_at",
        "delivery",
        "acceptance",
    }
    defaults = {f.name: None if f.default is MISSING else f.default for f in fields(ActionRecord)}
    started_over = {k: v for k, v in move.values.items() if k not in own}
    assert started_over == {k: defaults[k] for k in started_over}
    assert move.values["attempt"] == failed.attempt + 1
    assert (move.values["delivery"], move.values["acceptance"]) == ("PENDING", "UNKNOWN")


def test_a_move_cannot_set_a_fixed_column() -> None:
    for name in sorted(columns.FIXED):
        with pytest.raises(ValueError, match="not writable"):
            Move("a", Status.PENDING, Status.PENDING, "t", "t", None, values={name: "x"})
