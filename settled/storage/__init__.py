"""Storage: the ledger's interface (``base``) and its backends.

- ``columns``: the three tables (records, events, kept callbacks), each defined once.
- ``statements``: every named statement, and the two writes of history (a guarded
  move with its event, a new record with its events), built once for both dialects.
- ``sql``: every operation written once, over a few primitives each backend supplies.
- ``sqlite``: one file, WAL, ``synchronous=FULL`` — one host, the default.
- ``postgres``: one database for many hosts and daemons (``postgresql://`` URLs).
- ``event_log``: which events the audit (``settled log``) lists, written once for both.
- ``query``: what a listing selects and sorts, and the aggregates of ``stats``, written
  once for both; each backend supplies a small ``Dialect``.

``Ledger.open(location)`` picks the backend from the location (``open_location``,
here: the package is the one part of storage that knows the backends, and the
interface, ``base``, knows none). All SQL lives in this package; code above it speaks
in operations (``record``, ``move``, ``lease_due``…), never in statements.
"""

from __future__ import annotations

from ..crashpoints import Probe
from .event_log import LogFilter
from .ledger import (
    DUE_STATUSES,
    DueBatch,
    Figures,
    Ledger,
    Move,
    PostgresSettings,
    SchemaMode,
    Selection,
    Stats,
)
from .location import POSTGRES


def open_location(
    location: str,
    busy_timeout: float | None,
    create: bool,
    mode: SchemaMode,
    probe: Probe,
    postgres: PostgresSettings | None = None,
) -> Ledger:
    """The ledger at ``location``: a ``postgresql://`` URL, else a file (``Ledger.open``).

    A backend is imported when a ledger of its kind is first opened: PostgreSQL's driver
    is an optional extra (``settled[postgres]``), and code that only names the values
    of the interface (a ``Selection``, ``DUE_STATUSES``) loads neither backend."""
    if location.startswith(POSTGRES):
        from .postgres import PostgresLedger

        return PostgresLedger.connect(
            location,
            create=create,
            probe=probe,
            busy_timeout=busy_timeout,
            mode=mode,
            settings=postgres,
        )
    from .sqlite import SqliteLedger

    return SqliteLedger.open_file(
        location, busy_timeout=busy_timeout, create=create, probe=probe, mode=mode
    )


Ledger.opener = open_location  # the interface knows no backend: its opener is set here

__all__ = [
    "DUE_STATUSES",
    "DueBatch",
    "Figures",
    "Ledger",
    "LogFilter",
    "Move",
    "PostgresSettings",
    "Selection",
    "Stats",
]
