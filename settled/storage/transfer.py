"""Copying a whole ledger to another backend (``settled migrate-ledger FROM TO``):
SQLite to PostgreSQL when a team outgrows one host, or back. A copy is of a still
ledger (rule 17):

1. The source is held still for the whole copy (``Ledger.still``: SQLite's write lock,
   PostgreSQL's tables locked ``EXCLUSIVE``): no writer changes it between the first
   row read and the mark; writers wait, then are refused once it moved.
2. While a dispatch lease is live (an ``IN_FLIGHT`` record whose request may still be
   answered) the copy is refused (``LeasesLive``): the answer would be written to the
   old ledger. ``wait_for_leases`` waits for them, bounded, then refuses.
3. The source is read from its rows (``truth.digest``): a damaged row is refused by
   name, and so is an event whose record is missing; nothing is written then.
4. Every table that holds history (records, events with their ids, kept callbacks)
   lands in the empty target in ONE transaction, which before its commit reads the
   target's own rows and compares them with the source's: counts and SHA-256 per
   table, two independent reads. The events of the ledger itself (a prune's audit)
   land in it too, numbered anew, read back and compared. A difference rolls the
   target back: it stays empty.
5. The source is marked as moved (``ledger_moved``: the target's address without any
   password, and the time) in the transaction that held it still. From then on the
   database refuses every write of history to it, naming the new ledger.

This module speaks only through the ``Ledger`` interface; the backends own the SQL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..clock import nap, to_text
from ..errors import Conflict, LedgerError, LedgerMoved
from . import location, truth
from .ledger import History, Ledger

PAGE = 500
WAIT_FOR_LEASES = 600.0  # s: the most --wait-for-leases waits, whatever the leases say
POLL = 0.25  # s between counts of the live leases while waiting for them


class LeasesLive(Conflict):
    """The source has live dispatch leases: copying now would lose their outcomes."""


@dataclass
class Tally:
    """What one ledger holds, as the report shows it: rows and SHA-256 per table."""

    records: int = 0
    events: int = 0
    callbacks: int = 0
    records_sha256: str = ""
    events_sha256: str = ""
    callbacks_sha256: str = ""

    @classmethod
    def of(cls, d: truth.Digest) -> Tally:
        a, e, c = (d.tables[t] for t in ("actions", "events", "callbacks"))
        return cls(a.rows, e.rows, c.rows, a.sha256, e.sha256, c.sha256)

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "events": self.events,
            "callbacks": self.callbacks,
            "records_sha256": self.records_sha256,
            "events_sha256": self.events_sha256,
            "callbacks_sha256": self.callbacks_sha256,
        }

    def same(self, other: Tally) -> bool:
        return self.to_json() == other.to_json()


def pages(ledger: Ledger, page: int = PAGE) -> Iterator[History]:
    """Every record of ``ledger`` with its events, in id order, a page at a time."""
    after: str | None = None
    while True:
        chunk = ledger.export(after=after, limit=page)
        yield from chunk
        if len(chunk) < page:
            return
        after = chunk[-1][0].action_id


def tally(ledger: Ledger) -> Tally:
    """What ``ledger`` holds, read from its rows (``truth.digest``)."""
    return Tally.of(truth.digest(ledger))


def address(ledger: Ledger) -> str:
    """Where ``ledger`` is, fit to be stored in another ledger (``location.address``)."""
    return location.address(ledger.location)


@dataclass
class CopyReport:
    source: str
    target: str
    copied: Tally  # what was read from the source's rows, while it was held still
    target_after: Tally  # what the target's rows hold, read in its own transaction
    moved_to: str
    moved_at: str

    @property
    def source_after(self) -> Tally:
        return self.copied  # the source could not change: it was held still throughout

    @property
    def verified(self) -> bool:
        return self.copied.same(self.target_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "verified": self.verified,
            "copied": self.copied.to_json(),
            "source": self.source_after.to_json(),
            "target": self.target_after.to_json(),
            "moved_to": self.moved_to,
            "moved_at": self.moved_at,
        }


def copy_ledger(
    source: Ledger,
    target: Ledger,
    *,
    wait_for_leases: float = 0.0,
    on_held: Callable[[], None] | None = None,
    on_record: Callable[[int], None] | None = None,
) -> CopyReport:
    """Copy the still ``source`` into the empty ``target``, verify it by reading both
    ledgers' rows, and mark ``source`` as moved. ``wait_for_leases``: how long to wait
    for live dispatch leases to end (0: refuse at once). ``on_held`` is called once
    the source is held still (tests use it to start a writer that must wait);
    ``on_record`` with the number of records copied so far (progress).

    Raises ``LedgerError`` (nothing written anywhere) when the target is not empty,
    the source moved before, holds a damaged row or an event without its record, or
    the copy differs; ``LeasesLive`` while live leases remain."""
    if target.count() or target.export(limit=1) or next(target.rows("callbacks"), None):
        raise LedgerError(
            f"{target.location} is not empty; migrate-ledger copies only into an empty "
            "ledger, so that no history is mixed or lost"
        )
    refuse_moved(source)
    _wait_for_leases(source, wait_for_leases)
    to = address(target)
    clock = source.clock(anchor=False)
    with source.still() as view:
        if on_held is not None:
            on_held()
        now = to_text(clock.now())
        live = view.live_leases(now)
        if live:
            raise _leases_live(source, live, waited=wait_for_leases)
        found = truth.digest(view)  # every row read and checked: a damaged one is named
        lost = truth.orphans(view)
        if lost:
            event, action = lost[0]
            raise LedgerError(
                f"ledger {source.location} holds {len(lost)} event(s) whose record is "
                f"missing (event {event} of action {action!r}); nothing was copied: "
                "run `settled verify` on it"
            )
        copied = Tally.of(found)
        landed: list[Tally] = []

        def check(rows: truth.RowSource) -> None:
            there = truth.digest(rows)
            landed.append(Tally.of(there))
            differs = found.differences(there)
            if differs:
                raise LedgerError(
                    f"the copy in {target.location} differs from {source.location} "
                    f"({'; '.join(differs)}); nothing was written to either"
                )

        def feed() -> Iterator[History]:
            for n, item in enumerate(truth.histories(view), start=1):
                yield item
                if on_record is not None:
                    on_record(n)

        audit = source.ledger_events()  # the ledger's own (prune's batches), in order
        target.restore(feed(), callbacks=view.rows("callbacks"), check=check, ledger_events=audit)
        view.mark_moved(to, now)
    return CopyReport(source.location, target.location, copied, landed[0], to, now)


def refuse_moved(source: Ledger) -> None:
    """A ledger that was moved is not copied again: its copy is the ledger now."""
    moved = source.moved()
    if moved is not None:
        raise LedgerMoved(
            f"ledger {source.location} was already moved to {moved[0]} at {moved[1]}; "
            "copy that ledger instead"
        )


def _live(source: Ledger) -> int:
    with source.still() as view:
        return view.live_leases(to_text(source.clock(anchor=False).now()))


def _wait_for_leases(source: Ledger, most: float) -> None:
    """Wait up to ``most`` seconds (at most ``WAIT_FOR_LEASES``) for live leases to end:
    a count under the lock, then none held while waiting, so dispatchers can finish."""
    if most <= 0:
        return
    deadline = time.monotonic() + min(most, WAIT_FOR_LEASES)
    while _live(source) and time.monotonic() < deadline:
        nap(POLL)


def _leases_live(source: Ledger, live: int, *, waited: float) -> LeasesLive:
    leases = f"{live} live dispatch lease{'s' if live != 1 else ''}"
    if waited > 0:
        return LeasesLive(
            f"ledger {source.location} still has {leases} after waiting {waited:g} s; "
            "nothing was copied: stop its dispatchers and run migrate-ledger again"
        )
    return LeasesLive(
        f"ledger {source.location} has {leases} (IN_FLIGHT, answers still due); nothing "
        "was copied: stop its dispatchers and daemons, or pass --wait-for-leases"
    )


__all__ = [
    "CopyReport",
    "LeasesLive",
    "Tally",
    "address",
    "copy_ledger",
    "pages",
    "refuse_moved",
    "tally",
]
