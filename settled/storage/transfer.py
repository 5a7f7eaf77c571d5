"""Copying a whole ledger to another backend (``settled migrate-ledger FROM TO``):
SQLite to PostgreSQL when a team outgrows one host, or back.

Everything is copied as it is: every record with every column, every event with its id,
time, actor and evidence. The target must be empty, and the copy lands in it in ONE
transaction (``Ledger.restore``): whole, or not at all. Then both ledgers are read
again and compared: the number of records and events, and a SHA-256 over each (the
events in id order per action, with their evidence as JSON). A writer that changed
the source meanwhile shows up as a difference, and the copy is reported as unusable.

This module speaks only through the ``Ledger`` interface; the backends own the SQL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import LedgerError
from .base import History, Ledger, to_row

PAGE = 500


@dataclass
class Tally:
    """What one ledger holds: counts and checksums, read page by page."""

    records: int = 0
    events: int = 0
    _records: Any = field(default_factory=hashlib.sha256, repr=False)
    _events: Any = field(default_factory=hashlib.sha256, repr=False)

    def add(self, item: History) -> None:
        rec, log = item
        self.records += 1
        row = to_row(rec)
        self._records.update(_line(row))
        for e in log:
            self.events += 1
            self._events.update(
                _line([e.id, e.action_id, e.at, e.actor, e.kind, e.from_status, e.to_status,
                       e.attempt, e.detail])
            )  # fmt: skip

    @property
    def records_sha256(self) -> str:
        return str(self._records.hexdigest())

    @property
    def events_sha256(self) -> str:
        return str(self._events.hexdigest())

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "events": self.events,
            "records_sha256": self.records_sha256,
            "events_sha256": self.events_sha256,
        }

    def same(self, other: Tally) -> bool:
        return self.to_json() == other.to_json()


def _line(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode() + b"\n"


def pages(ledger: Ledger, page: int = PAGE) -> Iterator[History]:
    """Every record of ``ledger`` with its events, in id order, a page at a time."""
    after: str | None = None
    while True:
        chunk = ledger.export(after=after, limit=page)
        yield from chunk
        if len(chunk) < page:
            return
        after = chunk[-1][0].action_id


def tally(ledger: Ledger, on_record: Callable[[int], None] | None = None) -> Tally:
    t = Tally()
    for item in pages(ledger):
        t.add(item)
        if on_record is not None:
            on_record(t.records)
    return t


@dataclass
class CopyReport:
    source: str
    target: str
    copied: Tally
    source_after: Tally
    target_after: Tally

    @property
    def verified(self) -> bool:
        return self.copied.same(self.source_after) and self.copied.same(self.target_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "verified": self.verified,
            "copied": self.copied.to_json(),
            "source": self.source_after.to_json(),
            "target": self.target_after.to_json(),
        }


def copy_ledger(
    source: Ledger, target: Ledger, on_record: Callable[[int], None] | None = None
) -> CopyReport:
    """Copy ``source`` into the empty ``target`` and verify both afterwards.

    Raises ``LedgerError`` when the target is not empty (nothing is written then)."""
    if target.count() or target.export(limit=1):
        raise LedgerError(
            f"{target.location} is not empty; migrate-ledger copies only into an empty "
            "ledger, so that no history is mixed or lost"
        )
    copied = Tally()

    def feed() -> Iterator[History]:
        for item in pages(source):
            copied.add(item)
            if on_record is not None:
                on_record(copied.records)
            yield item

    target.restore(feed())
    return CopyReport(source.location, target.location, copied, tally(source), tally(target))


__all__ = ["CopyReport", "Tally", "copy_ledger", "pages", "tally"]
