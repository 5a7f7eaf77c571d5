"""settled: an honest ledger for side effects caused through provider APIs.

It never reports done unless some layer observed the effect, never sends an action
twice, and shows whatever nobody can know as unresolved, with the reason.

The public API is what this module exports (``__all__``, listed in docs/library.md):
the entry points, the records and statuses they hold, the reports they return, and
every error of the tree in ``settled.errors``. Everything else is importable from its
own module and may change between releases.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name, by the module that defines it. Names are loaded on first use
# (PEP 562), so that `import settled.cli` and a command like `settled show ID --json`
# load only the modules they need.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "agents": ("check", "tool"),
    "toolbox": ("ToolResult",),
    "dispatch": ("Dispatcher",),
    "sending": ("DispatchSettings", "Outcome", "Report", "Result"),
    "errors": (
        "ConfigError",
        "Conflict",
        "EffectVisible",
        "InvalidInput",
        "LedgerBusy",
        "LedgerError",
        "LedgerFull",
        "LedgerMoved",
        "LedgerOutdated",
        "LedgerReadOnly",
        "MissingExtra",
        "NotFound",
        "OutcomeNotRecorded",
        "RecheckFailed",
        "SettledError",
        "TransitionNotAllowed",
        "UnknownProvider",
    ),
    "model": ("Acceptance", "ActionRecord", "Delivery", "Event", "EventKind", "Status", "Tier"),
    "providers": ("Registry",),
    "reconcile": ("PassReport", "Reconciler"),
    "session": ("Session",),
    "storage": ("Ledger",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

# What a type checker reads instead of the table above (`X as X`: a re-export).
# tests/integration/test_api.py holds these imports and the table to the same names.
if TYPE_CHECKING:
    __version__: str

    from .agents import check as check
    from .agents import tool as tool
    from .dispatch import Dispatcher as Dispatcher
    from .errors import ConfigError as ConfigError
    from .errors import Conflict as Conflict
    from .errors import EffectVisible as EffectVisible
    from .errors import InvalidInput as InvalidInput
    from .errors import LedgerBusy as LedgerBusy
    from .errors import LedgerError as LedgerError
    from .errors import LedgerFull as LedgerFull
    from .errors import LedgerMoved as LedgerMoved
    from .errors import LedgerOutdated as LedgerOutdated
    from .errors import LedgerReadOnly as LedgerReadOnly
    from .errors import MissingExtra as MissingExtra
    from .errors import NotFound as NotFound
    from .errors import OutcomeNotRecorded as OutcomeNotRecorded
    from .errors import RecheckFailed as RecheckFailed
    from .errors import SettledError as SettledError
    from .errors import TransitionNotAllowed as TransitionNotAllowed
    from .errors import UnknownProvider as UnknownProvider
    from .model import Acceptance as Acceptance
    from .model import ActionRecord as ActionRecord
    from .model import Delivery as Delivery
    from .model import Event as Event
    from .model import EventKind as EventKind
    from .model import Status as Status
    from .model import Tier as Tier
    from .providers import Registry as Registry
    from .reconcile import PassReport as PassReport
    from .reconcile import Reconciler as Reconciler
    from .sending import DispatchSettings as DispatchSettings
    from .sending import Outcome as Outcome
    from .sending import Report as Report
    from .sending import Result as Result
    from .session import Session as Session
    from .storage import Ledger as Ledger
    from .toolbox import ToolResult as ToolResult


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


__all__ = list(sorted(_WHERE))  # classes, then functions: uppercase sorts first
