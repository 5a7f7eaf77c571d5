"""settled: an honest ledger for side effects caused through provider APIs.

It never reports done unless some layer observed the effect, never sends an action
twice, and shows whatever nobody can know as unresolved, with the reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names are loaded on first use (PEP 562), so that `import settled.cli` and a
# command like `settled show ID --json` load only the modules they need.
_WHERE = {
    "Clock": "clock", "FakeClock": "clock",
    "Config": "config",
    "Dispatcher": "dispatch", "DispatchSettings": "dispatch", "Outcome": "dispatch",
    "Report": "dispatch", "Result": "dispatch", "classify": "dispatch",
    "ConfigError": "errors", "Conflict": "errors", "EffectVisible": "errors",
    "InvalidInput": "errors", "RecheckFailed": "errors",
    "LedgerBusy": "errors", "LedgerError": "errors", "NotFound": "errors",
    "OutcomeNotRecorded": "errors", "SettledError": "errors",
    "TransitionNotAllowed": "errors", "UnknownProvider": "errors", "UsageError": "errors",
    "Ledger": "storage",
    "TRANSITIONS": "model", "Acceptance": "model", "ActionRecord": "model",
    "Declared": "model", "Delivery": "model", "DispatchStrategy": "model", "Event": "model",
    "EventKind": "model", "Status": "model", "Tier": "model", "build_strategy": "model",
    "Session": "session",
    "PassReport": "reconcile", "Reconciler": "reconcile",
    "check": "agents", "tool": "agents",
}  # fmt: skip

if TYPE_CHECKING:
    __version__: str

    from .agents import check, tool
    from .clock import Clock, FakeClock
    from .config import Config
    from .dispatch import Dispatcher, DispatchSettings, Outcome, Report, Result, classify
    from .errors import (
        ConfigError,
        Conflict,
        EffectVisible,
        InvalidInput,
        LedgerBusy,
        LedgerError,
        NotFound,
        OutcomeNotRecorded,
        RecheckFailed,
        SettledError,
        TransitionNotAllowed,
        UnknownProvider,
        UsageError,
    )
    from .model import (
        TRANSITIONS,
        Acceptance,
        ActionRecord,
        Declared,
        Delivery,
        DispatchStrategy,
        Event,
        EventKind,
        Status,
        Tier,
        build_strategy,
    )
    from .reconcile import PassReport, Reconciler
    from .session import Session
    from .storage import Ledger


def __getattr__(name: str) -> Any:
    if name == "__version__":  # one source: the package's metadata (pyproject's version)
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("settled")
        except PackageNotFoundError:  # a source tree that was never installed
            found = "0+unknown"
        globals()[name] = found
        return found
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'settled' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "TRANSITIONS",
    "Acceptance",
    "ActionRecord",
    "Clock",
    "Config",
    "ConfigError",
    "Conflict",
    "Declared",
    "Delivery",
    "DispatchSettings",
    "DispatchStrategy",
    "Dispatcher",
    "EffectVisible",
    "Event",
    "EventKind",
    "FakeClock",
    "InvalidInput",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "NotFound",
    "Outcome",
    "OutcomeNotRecorded",
    "PassReport",
    "RecheckFailed",
    "Reconciler",
    "Report",
    "Result",
    "Session",
    "SettledError",
    "Status",
    "Tier",
    "TransitionNotAllowed",
    "UnknownProvider",
    "UsageError",
    "build_strategy",
    "check",
    "classify",
    "tool",
]
