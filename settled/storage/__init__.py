"""Storage: the ledger's interface (``base``) and its backends.

- ``sql``: every operation written once, over a few primitives each backend supplies.
- ``sqlite``: one file, WAL, ``synchronous=FULL`` — one host, the default.
- ``postgres``: one database for many hosts and daemons (``postgresql://`` URLs).
- ``query``: what a listing selects and sorts, and the aggregates of ``stats``, written
  once for both; each backend supplies a small ``Dialect``.

``Ledger.open(location)`` picks the backend from the location. All SQL lives in
this package; code above it speaks in operations (``record``, ``move``,
``lease_due``…), never in statements.
"""

from __future__ import annotations

from .base import DUE_STATUSES, DueBatch, Figures, Ledger, Move, Selection, Stats

__all__ = ["DUE_STATUSES", "DueBatch", "Figures", "Ledger", "Move", "Selection", "Stats"]
