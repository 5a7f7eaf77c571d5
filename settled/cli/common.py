"""What every command shares: the global options, opening the ledger and the
registry once, and rendering records as JSON or for people."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from ..model import Status
from ..session import Session

# The exit code that reports a record in each status (DESIGN.md §2).
EXIT_BY_STATUS = {
    Status.CONFIRMED: 0,
    Status.PENDING: 3,
    Status.IN_FLIGHT: 3,
    Status.AWAITING_VERIFICATION: 3,
    Status.DENIED_UNRESOLVED: 4,
    Status.FAILED: 5,
}
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_UNRESOLVED = 4
EXIT_NOT_FOUND = 6
EXIT_CONFLICT = 7


def exit_for(exc: Exception) -> int:
    """The exit code of one of settled's own errors (DESIGN.md §2)."""
    from ..errors import Conflict, NotFound, OutcomeNotRecorded

    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, OutcomeNotRecorded):  # sent; the record stays IN_FLIGHT
        return EXIT_BY_STATUS[Status.IN_FLIGHT]
    return EXIT_ERROR


def report_exit(report: Any) -> int:
    """The exit code of a dispatch/confirm/retry report (DESIGN.md rule 8)."""
    from ..dispatch import Outcome

    if report.outcome is Outcome.NOT_FOUND or report.record is None:
        return EXIT_NOT_FOUND
    if report.outcome is Outcome.BLOCKED:
        return EXIT_UNRESOLVED
    return EXIT_BY_STATUS[report.record.status]


def default_actor() -> str:
    """Who a person at this terminal is, for ``resolve --by``'s default."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def one_line(text: str) -> str:
    return " ".join(text.split())


class State(Session):
    """The session every command of one CLI process shares; ``--db`` and ``--config``
    are set by the global options before a command runs."""

    def __init__(self) -> None:
        super().__init__()
        self.extra: dict[str, Any] = {}


STATE = State()


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():  # logs and pipes: don't fold rows at 80 columns
        width = int(os.environ.get("COLUMNS", "0") or 0) or 200
    return Console(stderr=stderr, highlight=False, width=width)


STATUS_STYLE = {
    "CONFIRMED": "green",
    "FAILED": "red",
    "DENIED_UNRESOLVED": "yellow",
    "AWAITING_VERIFICATION": "cyan",
    "IN_FLIGHT": "blue",
    "PENDING": "white",
}


MAX_DURATION = 100 * 366 * 86400.0  # s: a century


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' → seconds."""
    from ..errors import UsageError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"bad duration {text!r}: use e.g. 90s, 10m, 2h or 1d") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise UsageError(f"bad duration {text!r}: must be a finite number >= 0")
    if value * mult > MAX_DURATION:  # beyond what a date can be shifted by
        raise UsageError(f"bad duration {text!r}: at most {MAX_DURATION // 86400:g}d")
    return value * mult


def age(created_at: str, now: Any) -> str:
    from ..clock import from_text

    secs = max(0, int((now - from_text(created_at)).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def next_step(rec: Any) -> str:
    """What settles this record next, in words: an automatic check, or a person."""
    if rec.status in ("CONFIRMED", "FAILED"):
        return "settled"
    if rec.status == "PENDING":
        return "waiting for confirm/dispatch"
    if rec.status == "IN_FLIGHT":
        return f"dispatch in progress (lease until {hhmm(rec.lease_expires_at)})"
    if rec.requires_manual_verification:
        if rec.status == "AWAITING_VERIFICATION" and rec.eligible_at:
            return f"needs a person from {hhmm(rec.eligible_at)} (settled resolve)"
        return "needs a person (settled resolve)"
    if rec.next_check_at:
        if rec.lease_owner:
            return f"being checked (lease until {hhmm(rec.next_check_at)})"
        return f"auto-check at {hhmm(rec.next_check_at)}"
    return "needs a person (settled resolve)"


def hhmm(text: str | None) -> str:
    if not text:
        return "-"
    return text[11:19]
