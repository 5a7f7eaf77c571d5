"""Every error settled raises on purpose, in one rooted tree.

    SettledError
    ├── InvalidInput                 bad input: --params, ids, durations
    ├── ConfigError                  settled.toml is wrong; names file, key, fix
    ├── MissingExtra                 an optional part is not installed; names the pip install
    ├── LedgerError                  not a ledger, unreadable, corrupt, unavailable
    │   ├── LedgerBusy               the write lock stayed taken too long
    │   ├── LedgerFull               the disk (or the database's quota) is full
    │   ├── LedgerReadOnly           the ledger cannot be written (read-only file or mount)
    │   ├── LedgerOutdated           an older schema; `settled migrate` brings it up to date
    │   ├── LedgerMoved              migrate-ledger moved it: writes refused, names the new one
    │   └── OutcomeNotRecorded       a request WAS sent, but its outcome could not be written
    ├── UnknownProvider              provider or operation not registered
    ├── NotFound                     no action with that id
    └── Conflict                     same id, other params; or a move not allowed now
        └── TransitionNotAllowed     a status move outside the transition table
            ├── EffectVisible        a "not applied" verdict or a retry, refused: the check
            │                        made first saw the effect, and the record settled by it
            └── RecheckFailed        the same, refused: that check could not be made or
                                     could not tell (rule 14; --no-recheck overrides)

The CLI maps each to an exit code (the exit codes in the README) and a one-line message
(``settled.cli``); the storage backends map their drivers' errors into this tree at
their boundary. Nothing in the core catches broadly: an exception that is not a
SettledError is a bug and surfaces as one.

``InvalidInput`` exits 1, with settled's one-line message; a usage error (exit 2) is
Click's own, for a command line that does not parse.
"""

from __future__ import annotations

from typing import Any


class SettledError(Exception):
    """Root of settled's own errors."""


class InvalidInput(SettledError):
    """Input that can never work: fix the command line and run it again."""


class ConfigError(SettledError):
    """A configuration settled refuses. Its message is the first problem, one line;
    ``problems`` holds every one found (``settled providers check`` prints them all)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


class MissingExtra(SettledError):
    pass


class LedgerError(SettledError):
    pass


class LedgerBusy(LedgerError):
    pass


class LedgerMoved(LedgerError):
    """The ledger was moved by ``migrate-ledger``: nothing may be written to it."""


class LedgerFull(LedgerError):
    pass


class LedgerReadOnly(LedgerError):
    pass


class LedgerOutdated(LedgerError):
    """The ledger's schema is older than this settled's, and it was opened without
    migrating (migrations are explicit: ``settled migrate``). ``found`` and ``needed``
    are the schema versions."""

    def __init__(self, location: str, found: int, needed: int) -> None:
        super().__init__(
            f"{location} has ledger schema {found}, this settled needs {needed}: "
            "run `settled migrate`"
        )
        self.found = found
        self.needed = needed


class OutcomeNotRecorded(LedgerError):
    """The request left this machine (``sent``; or, when False, it may not have, but
    that could not be recorded either); writing what came back failed. The record
    stays ``IN_FLIGHT`` (``record``: as claimed) until its lease lapses, and
    reconciliation settles it then. Not an error of the request: whoever reports it
    reports the record's status, never "nothing was sent"."""

    def __init__(
        self, message: str, action_id: str, *, record: Any = None, sent: bool = True
    ) -> None:
        super().__init__(message)
        self.action_id = action_id
        self.record = record  # settled.model.ActionRecord, IN_FLIGHT
        self.sent = sent


class UnknownProvider(SettledError):
    pass


class NotFound(SettledError):
    pass


class Conflict(SettledError):
    pass


class TransitionNotAllowed(Conflict):
    pass


class EffectVisible(TransitionNotAllowed):
    """A person's "not applied" verdict, or a retry, refused because the check made
    first observed the effect (rule 14). ``record`` is the record as that evidence
    settled it."""

    def __init__(self, message: str, record: object) -> None:
        super().__init__(message)
        self.record = record


class RecheckFailed(TransitionNotAllowed):
    """A person's "not applied" verdict, or a retry, refused because the check made
    first could not be made (provider unreachable, not usable here, throttled) or
    could not tell; nothing was written (rule 14)."""
