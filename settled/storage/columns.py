"""The actions table, defined once: one column per field of ``model.ActionRecord``,
in the dataclass's order, each with the codec that stores its value and what the
schema says of it.

Everything else is generated from this table: ``COLUMNS`` (the column list every
statement selects), ``WRITABLE`` (what a ``Move`` may set), ``to_row`` (a record as
its row), ``from_row`` (a row as its record) and ``create_table`` (the table's
``CREATE TABLE`` in a dialect's ``Types``, which a new ledger is made with), for both
backends.

Adding a record column is two things: the field on ``ActionRecord`` (a new ledger's
table follows by itself) and, on each backend, one schema step that adds the column
to an existing ledger (``sqlite_schema``, ``postgres_schema``). The suite holds the
two together: a ledger made new and one migrated step by step from an empty one must
have the same schema, column for column, so a step that is missing or says
otherwise fails it.

Codecs, by the field's type:

- text, numbers and times (stored text, ``clock.to_text``): as they are; PostgreSQL
  reads its ``timestamptz`` columns back as the same text (``postgres._UtcText``);
- enums (``Tier``, ``Status``, ``Delivery``, ``Acceptance``): their value;
- booleans: 0/1 (SQLite's integers; PostgreSQL's ``boolean`` takes ``BOOLS`` as
  ``bool``);
- ``params``: canonical JSON text (sorted keys, no NaN: the text the hash is of);
- ``snapshot``: JSON text or NULL; ``declared``: ``Declared.to_json`` as JSON text.

What the schema says, from the field: a column may be NULL when its type admits None
or its default is None (``str | None``, ``snapshot: Any = None``), else it is NOT
NULL; a NOT NULL field's default is the column's DEFAULT (``checks: int = 0``). What
the field cannot say is written here by name: the primary key, a DEFAULT the field
does not have (``attempt``), the names compared byte for byte, the enums the schema
holds to their values.

A field with a default reads as that default when its column is NULL (a record
written before the column existed). ``to_row`` and ``from_row`` are generated as
plain functions (as ``dataclasses`` generates ``__init__``): they run for every row
read or written, and a loop over codecs per row would cost the hot path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from typing import Any, get_type_hints

from ..model import FIXED, WRITABLE, ActionRecord, Declared


def params_text(params: Any) -> str:
    return json.dumps(params, sort_keys=True, ensure_ascii=False, allow_nan=False)


def json_text(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _declared_text(value: Declared | None) -> str | None:
    return json_text(value.to_json()) if value else None


def _declared(text: str | None) -> Declared | None:
    return Declared.from_json(json.loads(text)) if text else None


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


@dataclass(frozen=True)
class Codec:
    """How a field's value is stored (``encode``) and read back (``decode``); None:
    as it is."""

    kind: str  # text, integer, real, boolean, time, enum, json
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None


TEXT = Codec("text")
INTEGER = Codec("integer")
TIME = Codec("time")
BOOLEAN = Codec("boolean", int, bool)
PARAMS = Codec("json", params_text, json.loads)
JSON = Codec("json", json_text, _json)
DECLARED = Codec("json", _declared_text, _declared)

# Stored text fields that are times (named ``*_at``, and these).
_TIMES = {"lands_by"}
# Fields whose JSON is not the general codec's.
_BY_NAME = {"params": PARAMS, "declared": DECLARED}

# What the schema says that the fields cannot:
_KEY = "action_id"
# a DEFAULT where the field has none (the schema has always had it; every record is
# built with its attempt, so the field needs none);
_DEFAULTS: dict[str, Any] = {"attempt": 1}
# names compared and sorted byte for byte, on every backend (PostgreSQL: COLLATE "C");
_NAMES = {"action_id", "provider", "operation", "params_hash"}
# enums the schema holds to their values, where a dialect's schema has the CHECK.
_CHECKED = {"status"}


@dataclass(frozen=True)
class Column:
    name: str
    codec: Codec
    default: Any = MISSING  # the field's default, read for a NULL column
    null: bool = True  # the column may be NULL
    key: bool = False  # the primary key
    sql_default: Any = None  # the column's DEFAULT (None: none)
    by_bytes: bool = False  # a name: compared and sorted byte for byte
    values: tuple[str, ...] = ()  # the values the schema holds an enum to

    @property
    def writable(self) -> bool:
        return self.name not in FIXED


def _base(hint: Any) -> Any:
    """The type a field holds when it is not None."""
    args = [a for a in getattr(hint, "__args__", (hint,)) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def _codec(name: str, hint: Any) -> Codec:
    if name in _BY_NAME:
        return _BY_NAME[name]
    base = _base(hint)
    if base is bool:
        return BOOLEAN
    if isinstance(base, type) and issubclass(base, StrEnum):
        return Codec("enum", str, base)
    if base is int:
        return INTEGER
    if base is str:
        return TIME if name.endswith("_at") or name in _TIMES else TEXT
    if base is Any:
        return JSON
    raise TypeError(f"ActionRecord.{name}: no codec for {hint!r}")  # pragma: no cover


def _column(name: str, hint: Any, default: Any) -> Column:
    values: tuple[str, ...] = ()
    if name in _CHECKED:
        values = tuple(member.value for member in _base(hint))
    return Column(
        name,
        _codec(name, hint),
        default,
        null=type(None) in getattr(hint, "__args__", ()) or default is None,
        key=name == _KEY,
        sql_default=_DEFAULTS.get(name, None if default is MISSING else default),
        by_bytes=name in _NAMES,
        values=values,
    )


def _table() -> tuple[Column, ...]:
    hints = get_type_hints(ActionRecord)
    return tuple(_column(f.name, hints[f.name], f.default) for f in fields(ActionRecord))


TABLE = _table()
COLUMNS = tuple(c.name for c in TABLE)
BOOLS = tuple(c.name for c in TABLE if c.codec is BOOLEAN)
TIMES = tuple(c.name for c in TABLE if c.codec is TIME)


def _generate() -> tuple[Callable[[ActionRecord], dict[str, Any]], Callable[..., ActionRecord]]:
    """``to_row`` and ``from_row`` as the source one would write by hand."""
    env: dict[str, Any] = {"ActionRecord": ActionRecord}
    out, back = [], []
    for i, c in enumerate(TABLE):
        value = f"rec.{c.name}"
        if c.codec.encode is not None:
            env[f"enc{i}"] = c.codec.encode
            value = f"enc{i}({value})"
        out.append(f"{c.name!r}: {value}")
        read = f"row[{c.name!r}]" if c.default is MISSING else f"row.get({c.name!r})"
        if c.codec.decode is not None:
            env[f"dec{i}"] = c.codec.decode
            read = f"dec{i}({read})"
        if c.default is not MISSING and c.default is not None:
            env[f"default{i}"] = c.default
            read = f"(v if (v := {read}) is not None else default{i})"
        back.append(f"{c.name}={read}")
    source = (
        "def to_row(rec):\n    return {" + ", ".join(out) + "}\n"
        "def from_row(row):\n    return ActionRecord(" + ", ".join(back) + ")\n"
    )
    exec(compile(source, "<settled.storage.columns>", "exec"), env)  # noqa: S102 - our own text
    return env["to_row"], env["from_row"]


@dataclass(frozen=True)
class Types:
    """How one dialect's schema declares a column: its type by codec kind (``text``
    for the kinds not named), what makes a name compare byte for byte, and whether
    an enum column carries the CHECK of its values."""

    kinds: Mapping[str, str]
    text: str
    by_bytes: str = ""
    checks: bool = False


def _literal(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no SQL literal for the default {value!r}")  # pragma: no cover
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def create_table(types: Types) -> str:
    """The actions table's ``CREATE TABLE`` in a dialect: a column per field, in order;
    the key is ``PRIMARY KEY`` (NOT NULL by being the key on PostgreSQL; SQLite's
    schema has never said it of the key, so neither does this)."""
    lines = []
    for c in TABLE:
        line = f"{c.name} {types.kinds.get(c.codec.kind, types.text)}"
        if c.by_bytes:
            line += types.by_bytes
        if c.key:
            line += " PRIMARY KEY"
        elif not c.null:
            line += " NOT NULL"
        if c.sql_default is not None:
            line += f" DEFAULT {_literal(c.sql_default)}"
        if c.values and types.checks:
            line += f" CHECK ({c.name} IN ({', '.join(_literal(v) for v in c.values)}))"
        lines.append(line)
    return "CREATE TABLE actions (\n    " + ",\n    ".join(lines) + "\n)"


# to_row(rec): a record as its row, by ``COLUMNS`` (JSON text for params, snapshot,
# declared). from_row(row): a row (a mapping of ``COLUMNS``) as its record.
to_row: Callable[[ActionRecord], dict[str, Any]]
from_row: Callable[[Mapping[str, Any]], ActionRecord]
to_row, from_row = _generate()


__all__ = [
    "BOOLS",
    "COLUMNS",
    "FIXED",
    "TABLE",
    "TIMES",
    "WRITABLE",
    "Codec",
    "Column",
    "Types",
    "create_table",
    "from_row",
    "json_text",
    "params_text",
    "to_row",
]
