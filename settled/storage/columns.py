"""The ledger's three tables, each defined once: one column per field of the value it
holds (``model.ActionRecord``, ``model.Event``, a kept ``model.Callback``), in the
table's order, each with the codec that stores its value and what the schema says of it.

Everything else is generated from these tables, for both backends: the column lists
every statement names (``COLUMNS``, ``EVENT_COLUMNS``, ``CALLBACK_COLUMNS``), what a
``Move`` may set (``WRITABLE``), the rows a value is written as and read back from
(``to_row``/``from_row``, ``event_values``/``event_of``, ``callback_row``/
``pending_of``), a moved record without reading its row back (``after_move``), and each
table's ``CREATE TABLE`` in a dialect's ``Types``, which a new ledger is made with
(``create_table``; and ``KEPT``, the callback columns a trigger keeps as received).

Adding a record column is two things: the field on ``ActionRecord`` (a new ledger's
table, every statement, the JSON and the reads follow by themselves) and, on each
backend, one schema step that adds the column to an existing ledger
(``sqlite_schema``, ``postgres_schema``). The suite holds the two together: a ledger
made new and one migrated step by step from an empty one must have the same schema,
column for column (tests/integration/test_schema.py), and tests/integration/test_columns.py adds a field to a
copy of the table and finds it in every statement.

Codecs, by the field's type:

- text, numbers and times (stored text, ``clock.to_text``): as they are; PostgreSQL
  reads its ``timestamptz`` columns back as the same text (``postgres._UtcText``);
- enums (``Tier``, ``Status``, ``Delivery``, ``Acceptance``, ``Reported``): their value;
- booleans: 0/1 (SQLite's integers; PostgreSQL's ``boolean`` takes ``BOOLS`` as
  ``bool``);
- ``params``: canonical JSON text (sorted keys, no NaN); ``snapshot``: JSON text or
  NULL; ``declared``: ``Declared.to_json`` as JSON text; an event's ``detail``: JSON.

What the schema says, from the field: a column may be NULL when its type admits None
or its default is None (``str | None``, ``snapshot: Any = None``), else it is NOT
NULL; a NOT NULL field's default is the column's DEFAULT (``checks: int = 0``). What
the field cannot say is written here by name: the keys, a DEFAULT the field does not
have (``attempt``), the names compared byte for byte, the enums the schema holds to
their values, the key the database numbers (``events.id``) and what it references.

A field with a default reads as that default when its column is NULL (a record
written before the column existed). The record's row mappings are generated as plain
functions (as ``dataclasses`` generates ``__init__``): they run for every row read or
written, and a loop over codecs per row would cost the hot path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from functools import lru_cache
from typing import Any, get_type_hints

from ..model import (
    FIXED,
    WRITABLE,
    ActionRecord,
    Callback,
    Declared,
    Event,
    Move,
    PendingCallback,
    Reported,
    Status,
    canonical_json,
)

# JSON encoders made once: ``json.dumps`` with any keyword argument builds a new
# encoder on every call, and a record is encoded several times on its way.
_SORTED = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)
_DETAIL = json.JSONEncoder(default=str)  # an event's detail, as it has always been written


def params_text(params: Any) -> str:
    return canonical_json(params)  # the params as checked before they were recorded


def json_text(value: Any) -> str | None:
    return None if value is None else _SORTED.encode(value)


def detail_text(detail: Mapping[str, Any]) -> str:
    return _DETAIL.encode(detail)


@lru_cache(maxsize=256)  # frozen and hashable; an operation's records share one
def _declared_text(value: Declared | None) -> str | None:
    return json_text(value.to_json()) if value else None


@lru_cache(maxsize=256)  # frozen, so shared safely; a ledger's records share few of them
def _declared(text: str | None) -> Declared | None:
    return Declared.from_json(json.loads(text)) if text else None


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def _member_of(kind: type[StrEnum]) -> Callable[[Any], Any]:
    """An enum's member by its value, as ``kind(value)`` reads it (ValueError for a
    value that is none of them), without the enum machinery's call on every row."""
    members = kind._value2member_map_

    def member(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid {kind.__name__}") from None

    return member


@dataclass(frozen=True)
class Codec:
    """How a field's value is stored (``encode``) and read back (``decode``); None:
    as it is."""

    kind: str  # text, integer, real, boolean, time, enum, json
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None
    enum: type[StrEnum] | None = None  # an enum's class (its values are the column's)


TEXT = Codec("text")
INTEGER = Codec("integer")
TIME = Codec("time")
BOOLEAN = Codec("boolean", bool, bool)  # SQLite stores a bool as 0/1
PARAMS = Codec("json", params_text, json.loads)
JSON = Codec("json", json_text, _json)
DECLARED = Codec("json", _declared_text, _declared)
DETAIL = Codec("json", detail_text, json.loads)


@dataclass(frozen=True)
class Column:
    name: str
    codec: Codec
    default: Any = MISSING  # the field's default, read for a NULL column
    null: bool = True  # the column may be NULL
    key: bool = False  # the primary key on its own
    sql_default: Any = None  # the column's DEFAULT (None: none)
    by_bytes: bool = False  # a name: compared and sorted byte for byte
    values: tuple[str, ...] = ()  # the values the schema holds it to
    references: str = ""  # the table whose key it is
    numbered: bool = False  # a key the database numbers (events.id)

    @property
    def writable(self) -> bool:
        return self.name not in FIXED


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # its primary key, in order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def __iter__(self) -> Iterator[Column]:
        return iter(self.columns)


def _base(hint: Any) -> Any:
    """The type a field holds when it is not None."""
    args = [a for a in getattr(hint, "__args__", (hint,)) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


# Stored text fields that are times: named ``*_at``, and these.
_TIMES = {"at", "lands_by"}
# Fields whose JSON is not the general codec's.
_BY_NAME = {"params": PARAMS, "declared": DECLARED, "detail": DETAIL}


def _codec(name: str, hint: Any) -> Codec:
    if name in _BY_NAME:
        return _BY_NAME[name]
    base = _base(hint)
    if base is bool:
        return BOOLEAN
    if isinstance(base, type) and issubclass(base, StrEnum):
        return Codec("enum", str, _member_of(base), base)
    if base is int:
        return INTEGER
    if base is str:
        return TIME if name.endswith("_at") or name in _TIMES else TEXT
    if base is Any:
        return JSON
    raise TypeError(f"{name}: no codec for {hint!r}")  # pragma: no cover


@dataclass(frozen=True)
class Says:
    """What a table's schema says of its columns that their fields cannot."""

    key: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)  # a DEFAULT the field lacks
    by_bytes: frozenset[str] = frozenset()
    checked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    references: Mapping[str, str] = field(default_factory=dict)
    numbered: str = ""


def _table(name: str, hints: Mapping[str, Any], defaults: Mapping[str, Any], says: Says) -> Table:
    cols = []
    for n, hint in hints.items():
        default = defaults.get(n, MISSING)
        cols.append(
            Column(
                n,
                _codec(n, hint),
                default,
                null=type(None) in getattr(hint, "__args__", ()) or default is None,
                key=says.key == (n,),
                sql_default=says.defaults.get(n, None if default is MISSING else default),
                by_bytes=n in says.by_bytes,
                values=says.checked.get(n, ()),
                references=says.references.get(n, ""),
                numbered=n == says.numbered,
            )
        )
    return Table(name, tuple(cols), says.key)


def _fields_of(*types: type) -> tuple[dict[str, Any], dict[str, Any]]:
    hints: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for t in types:
        found = get_type_hints(t)
        for f in fields(t):
            hints.setdefault(f.name, found[f.name])
            if f.default is not MISSING:
                defaults.setdefault(f.name, f.default)
    return hints, defaults


_NAMES = frozenset({"action_id", "provider", "operation", "params_hash"})  # byte order
_STATES = ("pending", "matched", "expired")  # a kept callback's, in the order it lives them


def _actions() -> Table:
    hints, defaults = _fields_of(ActionRecord)
    says = Says(
        ("action_id",),
        # the schema has always had it; every record is built with its attempt
        defaults={"attempt": 1},
        by_bytes=_NAMES,
        # the enums the schema holds to their values, where a dialect's schema has CHECKs
        checked={"status": tuple(s.value for s in Status)},
    )
    return _table("actions", hints, defaults, says)


def _events() -> Table:
    hints, defaults = _fields_of(Event)
    says = Says(
        ("id",),
        by_bytes=frozenset({"action_id"}),
        references={"action_id": "actions(action_id)"},
        numbered="id",
    )
    return _table("events", hints, defaults, says)


def _callbacks() -> Table:
    """A kept callback: what it said (``Callback``), the record it is bound to
    (``PendingCallback``) and where it stands; in the order the table has its columns."""
    hints, defaults = _fields_of(Callback, PendingCallback)
    del hints["callback"]
    hints.update(state=str, matched_at=str | None, next_check_at=str | None)
    order = (
        *("provider", "event_id", "scheme", "names", "key", "status", "reported", "digest"),
        *("item", "received_at", "expires_at", "state", "action_id", "attempt", "matched_at"),
        *("next_check_at", "tries"),
    )
    assert set(order) == set(hints), sorted(set(order) ^ set(hints))
    says = Says(
        ("provider", "event_id"),
        by_bytes=frozenset({"provider", "event_id", "key", "action_id"}),
        checked={"state": _STATES},
    )
    return _table("callbacks", {n: hints[n] for n in order}, defaults, says)


TABLE = _actions()
EVENTS = _events()
CALLBACKS = _callbacks()
TABLES = {t.name: t for t in (TABLE, EVENTS, CALLBACKS)}

COLUMNS = TABLE.names
BOOLS = tuple(c.name for c in TABLE.columns if c.codec is BOOLEAN)
TIMES = tuple(c.name for c in TABLE.columns if c.codec is TIME)
EVENT_COLUMNS = EVENTS.names
CALLBACK_COLUMNS = CALLBACKS.names
# What a callback said, which the database keeps as it was received (``item`` and
# ``expires_at`` are written with it too, but the trigger has never guarded them).
KEPT: tuple[str, ...] = ("provider", "event_id", "scheme", "names", "key", "status")
KEPT += ("reported", "digest", "received_at")
_SAID = tuple(f.name for f in fields(Callback))
# The columns of a kept callback that a match reads (``pending_of``).
PENDING_COLUMNS = tuple(
    n for n in CALLBACK_COLUMNS if n not in ("state", "matched_at", "next_check_at")
)


# -- the record's row ------------------------------------------------------------------------


def _generate(table: Table) -> dict[str, Callable[..., Any]]:
    """``to_row``, ``from_row`` and ``from_values`` (a row as a sequence, in the table's
    order) as the source one would write by hand."""
    env: dict[str, Any] = {"ActionRecord": ActionRecord}
    out: list[str] = []
    back: list[str] = []  # from a mapping: a column an older row lacks reads as None
    at: list[str] = []  # from a sequence, in the table's order
    for i, c in enumerate(table.columns):
        value = f"rec.{c.name}"
        if c.codec.encode is not None:
            env[f"enc{i}"] = c.codec.encode
            value = f"enc{i}({value})"
        out.append(f"{c.name!r}: {value}")
        by_name = f"row[{c.name!r}]" if c.default is MISSING else f"row.get({c.name!r})"
        for raw, into in ((by_name, back), (f"r[{i}]", at)):
            read = raw
            if c.codec.decode is not None:
                env[f"dec{i}"] = c.codec.decode
                read = f"dec{i}({read})"
            if c.default is not MISSING and c.default is not None:
                env[f"default{i}"] = c.default
                read = f"(v if (v := {read}) is not None else default{i})"
            into.append(f"{c.name}={read}")
    source = (
        "def to_row(rec):\n    return {" + ", ".join(out) + "}\n"
        "def from_row(row):\n    return ActionRecord(" + ", ".join(back) + ")\n"
        "def from_values(r):\n    return ActionRecord(" + ", ".join(at) + ")\n"
    )
    exec(compile(source, "<settled.storage.columns>", "exec"), env)  # noqa: S102 - our own text
    return env


_MAPPINGS = _generate(TABLE)
# to_row(rec): a record as its row, by ``COLUMNS`` (JSON text for params, snapshot,
# declared). from_row(row): a row (a mapping of ``COLUMNS``) as its record;
# from_values(values): the same from the row's values in ``COLUMNS`` order.
to_row: Callable[[ActionRecord], dict[str, Any]] = _MAPPINGS["to_row"]
from_row: Callable[[Mapping[str, Any]], ActionRecord] = _MAPPINGS["from_row"]
from_values: Callable[[Sequence[Any]], ActionRecord] = _MAPPINGS["from_values"]

# How a value a move writes (stored form: enums as text, JSON as text) reads back.
_DECODE = {c.name: c.codec.decode for c in TABLE.columns if c.codec.decode and c.writable}


def after_move(
    rec: ActionRecord, move: Move, values: Mapping[str, Any] | None = None
) -> ActionRecord:
    """``rec`` as ``move`` (whose guard held) left it: its values (as the move wrote
    them, or as the database stored them: ``values``), its status and ``updated_at``,
    read back as a row would be, without reading the row."""
    changed = dict(move.values if values is None else values)
    for name, value in changed.items():
        decode = _DECODE.get(name)
        if decode is not None and value is not None:
            changed[name] = decode(value)
    if move.kind is not None and not move.kind.changes_nothing:
        changed["status"] = move.to
    changed["updated_at"] = move.at
    new = object.__new__(ActionRecord)  # a copy with these fields (replace() is 10× dearer)
    new.__dict__.update(rec.__dict__, **changed)
    return new


# -- events and kept callbacks -----------------------------------------------------------


def event_of(r: Sequence[Any]) -> Event:
    """An events row (``EVENT_COLUMNS``) as its event."""
    return Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]))


def recorded_detail(rec: ActionRecord) -> dict[str, Any]:
    """The ``recorded`` event's evidence: the strategy fixed before anything leaves."""
    return {
        "tier": str(rec.tier),
        "reconciliation_key": rec.reconciliation_key,
        "eligible_at": rec.eligible_at,
        "requires_manual_verification": rec.requires_manual_verification,
    }


def callback_row(cb: Callback, next_check_at: str) -> dict[str, Any]:
    """A new callback's row, pending until matched (``CALLBACK_COLUMNS``' order)."""
    row: dict[str, Any] = {}
    for c in CALLBACKS.columns:
        value = getattr(cb, c.name, None)
        row[c.name] = c.codec.encode(value) if c.codec.encode and value is not None else value
    row.update(state="pending", next_check_at=next_check_at, tries=0)
    return row


def pending_of(r: Sequence[Any]) -> PendingCallback:
    """A callbacks row (``PENDING_COLUMNS``) as the kept callback it is."""
    row = dict(zip(PENDING_COLUMNS, r, strict=True))
    said = {n: row[n] for n in _SAID}
    said["reported"] = Reported(said["reported"])
    return PendingCallback(
        Callback(**said), row["action_id"], row["attempt"], int(row["tries"] or 0)
    )


# -- a table in a dialect --------------------------------------------------------------------


@dataclass(frozen=True)
class Types:
    """How one dialect's schema declares a column: its type by codec kind (``text``
    for the kinds not named), what makes a name compare byte for byte, whether an enum
    column carries the CHECK of its values, and a key the database numbers."""

    kinds: Mapping[str, str]
    text: str
    by_bytes: str = ""
    checks: bool = False
    numbered: str = "INTEGER PRIMARY KEY"


def _literal(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no SQL literal for the default {value!r}")  # pragma: no cover
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def create_table(types: Types, table: Table = TABLE) -> str:
    """A table's ``CREATE TABLE`` in a dialect: a column per field, in order; a key
    of one column is ``PRIMARY KEY`` (NOT NULL by being the key on PostgreSQL;
    SQLite's schema has never said it of the key, so neither does this). The actions
    table's status CHECK is a dialect's (``Types.checks``); every other table's
    values are checked on both, as their steps made them."""
    lines = []
    for c in table.columns:
        if c.numbered:
            lines.append(f"{c.name} {types.numbered}")
            continue
        line = f"{c.name} {types.kinds.get(c.codec.kind, types.text)}"
        if c.by_bytes:
            line += types.by_bytes
        if c.key:
            line += " PRIMARY KEY"
        elif not c.null:
            line += " NOT NULL"
        if c.references:
            line += f" REFERENCES {c.references}"
        if c.sql_default is not None:
            line += f" DEFAULT {_literal(c.sql_default)}"
        if c.values and (types.checks or table is not TABLE):
            line += f" CHECK ({c.name} IN ({', '.join(_literal(v) for v in c.values)}))"
        lines.append(line)
    if len(table.key) > 1:
        lines.append(f"PRIMARY KEY ({', '.join(table.key)})")
    return f"CREATE TABLE {table.name} (\n    " + ",\n    ".join(lines) + "\n)"


__all__ = [
    "BOOLS",
    "CALLBACKS",
    "CALLBACK_COLUMNS",
    "COLUMNS",
    "EVENTS",
    "EVENT_COLUMNS",
    "FIXED",
    "KEPT",
    "PENDING_COLUMNS",
    "TABLE",
    "TABLES",
    "TIMES",
    "WRITABLE",
    "Codec",
    "Column",
    "Table",
    "Types",
    "after_move",
    "callback_row",
    "create_table",
    "detail_text",
    "event_of",
    "from_row",
    "from_values",
    "json_text",
    "params_text",
    "pending_of",
    "recorded_detail",
    "to_row",
]
