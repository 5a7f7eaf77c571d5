"""The query string as every API route reads it: each parameter checked, a bad one a 422
that names it and what it takes (a typo must not look like the default to a monitor),
and the OpenAPI entries of the parameters several routes share.
"""

from __future__ import annotations

from typing import Any

from ... import cause
from ...errors import InvalidInput, SettledError
from ...model import action_id_problem
from ...selection import STATUSES, parse_duration
from ...storage.query import search_terms
from ..problems import Problem

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 1000


def read_flag(raw: str | None, name: str) -> bool:
    if raw is None or raw in ("0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise Problem(422, f"{name}: true or false (1 or 0)")


def check_id(value: Any, what: str) -> str:
    why = action_id_problem(value, what)
    if why:
        raise Problem(422, why)
    assert isinstance(value, str)
    return value


def read_statuses(raw: str | None) -> tuple[list[str], bool]:
    """``status`` as the queue takes it: a comma list, or ``all``; by default
    DENIED_UNRESOLVED and every contradicted record (second value True)."""

    if raw is None:
        return ["DENIED_UNRESOLVED"], True
    if raw.strip().lower() == "all":
        return list(STATUSES), False
    statuses = [s.strip().upper() for s in raw.split(",") if s.strip()]
    bad = [s for s in statuses if s not in STATUSES]
    if bad or not statuses:
        raise Problem(
            422, f"status: use one or more of {', '.join(STATUSES)} (comma-separated), or all"
        )
    return list(dict.fromkeys(statuses)), False


def read_duration(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return parse_duration(raw)
    except SettledError as exc:
        raise Problem(422, f"older_than: {str(exc).removeprefix('bad duration ')}") from None


def read_causes(raw: str | None) -> list[str] | None:
    if raw is None:
        return None
    try:
        return cause.parse(raw)
    except InvalidInput as exc:
        raise Problem(422, f"cause: {exc}") from None


def read_search(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        search_terms(raw)
    except InvalidInput as exc:
        raise Problem(422, f"q: {exc}") from None
    return raw


def query_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


def read_limit(raw: str | None, default: int = DEFAULT_LIMIT) -> int:
    # an empty ``limit=`` is a malformed number, not "use the default"
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise Problem(422, f"limit: a whole number from 1 to {MAX_LIMIT}")
    return int(raw)


SELECTORS = [
    {
        "name": "provider",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "Only this provider (422 when neither the config nor the ledger knows it).",
    },
    {
        "name": "operation",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "Only this operation.",
    },
]
