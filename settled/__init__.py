"""settled: an honest ledger for side effects caused through provider APIs.

It never reports done unless some layer observed the effect, never sends an action
twice, and shows whatever nobody can know as unresolved, with the reason.
"""

from .clock import Clock, FakeClock
from .config import Config
from .dispatch import Dispatcher, DispatchSettings, Outcome, Report, Result, classify
from .errors import (
    ConfigError,
    Conflict,
    LedgerBusy,
    LedgerError,
    NotFound,
    SettledError,
    TransitionNotAllowed,
    UnknownProvider,
    UsageError,
)
from .ledger import Ledger
from .model import (
    TRANSITIONS,
    Acceptance,
    ActionRecord,
    Delivery,
    DispatchStrategy,
    Event,
    Status,
    Tier,
    build_strategy,
)
from .reconcile import PassReport, Reconciler

__version__ = "0.1.0"

__all__ = [
    "TRANSITIONS",
    "Acceptance",
    "ActionRecord",
    "Clock",
    "Config",
    "ConfigError",
    "Conflict",
    "Delivery",
    "DispatchSettings",
    "DispatchStrategy",
    "Dispatcher",
    "Event",
    "FakeClock",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "NotFound",
    "Outcome",
    "PassReport",
    "Reconciler",
    "Report",
    "Result",
    "SettledError",
    "Status",
    "Tier",
    "TransitionNotAllowed",
    "UnknownProvider",
    "UsageError",
    "build_strategy",
    "classify",
]
