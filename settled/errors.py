"""Every error settled raises on purpose, in one rooted tree.

    SettledError                     exit 1 unless a subclass says otherwise
    ├── UsageError                   bad input: --params, ids, durations        (1)
    ├── ConfigError                  settled.toml is wrong; names file, key, fix (1)
    ├── LedgerError                  not a ledger, unreadable, corrupt           (1)
    │   └── LedgerBusy               the write lock stayed taken too long        (1)
    ├── UnknownProvider              provider or operation not registered        (1)
    ├── NotFound                     no action with that id                       (6)
    └── Conflict                     same id, other params; or a move not allowed (7)
        └── TransitionNotAllowed     a status move outside the transition table  (7)

The CLI maps each to its exit code and a one-line message (``settled.cli``).
Nothing in the core catches broadly: an exception that is not a SettledError is a
bug and surfaces as one (with a one-line message at the CLI boundary unless
``SETTLED_DEBUG`` is set).
"""

from __future__ import annotations


class SettledError(Exception):
    """Root of settled's own errors. ``exit_code`` is the CLI's code for it."""

    exit_code = 1


class UsageError(SettledError):
    exit_code = 1


class ConfigError(SettledError):
    exit_code = 1


class LedgerError(SettledError):
    exit_code = 1


class LedgerBusy(LedgerError):
    exit_code = 1


class UnknownProvider(SettledError):
    exit_code = 1


class NotFound(SettledError):
    exit_code = 6


class Conflict(SettledError):
    exit_code = 7


class TransitionNotAllowed(Conflict):
    exit_code = 7
