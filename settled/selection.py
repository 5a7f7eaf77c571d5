"""The selector grammar every bulk surface shares (the CLI's ``queue``, ``resolve``,
``retry``, ``reconcile`` and ``stats``, the service's API and the console's filter):
the status and delivery names, durations (``90s``, ``10m``, ``2h``, ``1d``), the
``--match`` text, the sort field, and one selected action (``Target``). Each parser
returns what the ledger's ``Selection`` takes, or raises ``InvalidInput`` with one line
naming the option and what it accepts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import cause
from .display import term
from .errors import InvalidInput
from .model import Delivery, Status

# The names a selector accepts, in the model's order: derived, never retyped.
STATUSES = tuple(s.value for s in Status)
DELIVERIES = tuple(d.value for d in Delivery)
MAX_MATCH = 1000  # characters of --match: more than any reason holds

MAX_DURATION = 100 * 366 * 86400.0  # s: a century


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise InvalidInput(f"bad duration {text!r}: use e.g. 90s, 10m, 2h or 1d") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise InvalidInput(f"bad duration {text!r}: must be a finite number >= 0")
    if value * mult > MAX_DURATION:  # beyond what a date can be shifted by
        raise InvalidInput(f"bad duration {text!r}: at most {MAX_DURATION // 86400:g}d")
    return value * mult


def parse_statuses(status: str) -> list[str]:

    if status.strip().lower() == "all":
        return list(STATUSES)
    statuses = [s.strip().upper() for s in status.split(",") if s.strip()]
    bad = [s for s in statuses if s not in STATUSES]
    if bad or not statuses:
        raise InvalidInput(
            f"--status {term(status, 100)}: unknown status; use one of {', '.join(STATUSES)} or all"
        )
    return list(dict.fromkeys(statuses))


def parse_deliveries(value: str) -> list[str]:

    wanted = [v.strip().upper() for v in value.split(",") if v.strip()]
    bad = [v for v in wanted if v not in DELIVERIES]
    if bad or not wanted:
        raise InvalidInput(
            f"--delivery {term(value, 100)}: unknown delivery; use one of {', '.join(DELIVERIES)}"
        )
    return list(dict.fromkeys(wanted))


def parse_sort(value: str) -> str:
    from .storage.query import SORT_FIELDS  # the ledger's interface loads with a sort

    field = value.strip().lower().replace("-", "_")
    if field not in SORT_FIELDS:
        raise InvalidInput(f"--sort {term(value, 100)}: use one of {', '.join(SORT_FIELDS)}")
    return field


def parse_match(value: str) -> str:

    if not value.strip():
        raise InvalidInput("--match needs some text to look for")
    if len(value) > MAX_MATCH:
        raise InvalidInput(f"--match is longer than {MAX_MATCH} characters")
    return value


def parse_search(value: str) -> str:
    """``value``, once its words are fit to search for (``query.search_terms``)."""
    from .storage.query import search_terms  # the ledger's interface loads with a search

    search_terms(value)
    return value


def parse_causes(value: str) -> list[str]:
    return cause.parse(value)


@dataclass(frozen=True)
class Target:
    """One named or selected action: its record (None when not found) and why the
    command leaves it alone ("" when it acts on it)."""

    action_id: str
    record: Any
    skip: str = ""
