"""The daemon's log: one JSON object per line, for journald, files and jq. The same
lines are what ``settled reconcile --due --log json`` writes for cron."""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

Log = Callable[[dict[str, Any]], None]


def json_lines(stream: IO[str] | None = None) -> Log:
    """A logger that writes one JSON object per line (to stderr by default)."""
    lock = threading.Lock()

    def log(entry: dict[str, Any]) -> None:
        out = stream or sys.stderr
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with lock:
            out.write(line + "\n")
            out.flush()

    return log


def one_line(text: str | None) -> str:
    return " ".join((text or "").split())


_CLASS = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Error|Timeout|Exception|Refused|Closed))\b")
_HTTP = re.compile(r"\bHTTP (\d{3})\b")


def error_class(ch: Any) -> str:
    """What kind of failure a check that saw nothing hit: an exception class named in
    its error (ConnectError, ReadTimeout…), 'HTTP 503', or ProviderUnavailable when the
    provider could not even be built (a ${VAR} missing from the environment)."""
    error = getattr(ch, "error", None) or ch.reason or ""
    if error.startswith("provider ") and " cannot be used: " in error:
        return "ProviderUnavailable"
    m = _CLASS.search(error)
    if m:
        return m.group(1)
    m = _HTTP.search(error)
    if m:
        return f"HTTP {m.group(1)}"
    return "Unknown"


def failed(ch: Any) -> bool:
    """An attempt to check that could not observe anything: the query failed or the
    provider could not be used (not 'nothing yet', which is an answer; not a pause a
    provider asked for, nor a provider that is not configured here: neither is an
    attempt; a pause writes its ``check_error`` all the same, but is ``paused``). It
    may also be the attempt that gave the record up."""
    return getattr(ch, "error", None) is not None and not getattr(ch, "paused", "")


def transition(ch: Any, who: str) -> dict[str, Any]:
    return {
        "time": ch.at,
        "event": "transition",
        "daemon": who,
        "action_id": ch.action_id,
        "from": ch.from_status,
        "to": ch.to_status,
        "kind": ch.kind,
        "provider": ch.provider,
        "operation": ch.operation,
        "reason": one_line(ch.reason),
    }


def check_failed(ch: Any, who: str) -> dict[str, Any]:
    return {
        "time": ch.at,
        "event": "check_failed",
        "level": "warning",
        "daemon": who,
        "action_id": ch.action_id,
        "provider": ch.provider,
        "operation": ch.operation,
        "error": error_class(ch),
        "message": one_line(getattr(ch, "error", None) or ""),
        "reason": one_line(ch.reason),
        "next_check_at": ch.next_check_at,
    }


def unusable(providers: dict[str, str], who: str) -> dict[str, Any]:
    """The line that says providers configured here cannot be built at all."""
    from .clock import to_text, utcnow

    return {
        "time": to_text(utcnow()),
        "event": "providers_unusable",
        "level": "error",
        "daemon": who,
        "error": "ProviderUnavailable",
        "providers": sorted(providers),
        "message": one_line("; ".join(providers[p] for p in sorted(providers))),
    }


def pass_line(report: Any, who: str, **extra: Any) -> dict[str, Any]:
    from .clock import to_text, utcnow

    waiting = len(report.waiting)
    return {
        "time": to_text(utcnow()),
        "event": "pass",
        "daemon": who,
        "examined": report.examined,
        "counts": report.counts(),
        "waiting": waiting,
        "failed_checks": sum(1 for ch in [*report.waiting, *report.changes] if failed(ch)),
        "stopped": report.stopped,
        **extra,
    }


__all__ = [
    "Log",
    "check_failed",
    "error_class",
    "failed",
    "json_lines",
    "pass_line",
    "transition",
    "unusable",
]
