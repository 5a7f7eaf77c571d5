"""Time as settled stores it: aware UTC datetimes, ISO-8601 text with a fixed width.

Stored times are ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` so that text order is time order
and the due index is a plain range scan. Functions that need "now" take it as an
argument; ``Clock`` is the injectable source for the long-running parts.

A step of the system clock must change nothing (a jump forward would spend
verification budgets and make absences look old enough to prove something; a jump
back would stall every scheduled check). ``SteadyClock`` is the answer on one host:
the wall time when this boot's anchor was taken, plus the time elapsed since on a
clock that no step moves (``steady``: ``CLOCK_BOOTTIME``, which also counts time
suspended). Every process of the host reads the same anchor from the ledger, so all
agree; a reboot takes a new anchor from the wall clock.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import overload

_FMT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utcnow() -> datetime:
    return datetime.now(UTC)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def steady() -> float:
    """Seconds on a clock that no wall-clock step moves and that keeps counting while
    the machine is suspended (``CLOCK_BOOTTIME``); ``time.monotonic`` where the
    platform has no such clock. Deadlines that must hold across a pause use it."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


@cache
def boot_id() -> str | None:
    """This boot of the host (Linux), or None where it cannot be known: then only the
    wall clock is available and a step of it is not corrected."""
    if _BOOTTIME is None:
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


@overload
def to_text(dt: datetime) -> str: ...
@overload
def to_text(dt: None) -> None: ...
@overload
def to_text(dt: datetime | None) -> str | None: ...
def to_text(dt: datetime | None) -> str | None:
    """``dt`` as stored text: UTC, ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, always 27 characters
    (``strftime``'s ``%Y`` drops a leading zero before the year 1000).

    A move formats the same instant several times (its time, the verification it
    starts at that time, its event), so the last instant formatted is kept with its
    text: the one formatting a move needs, not seven (the pair is replaced whole, so
    threads that format at once each read a consistent one)."""
    if dt is None:
        return None
    last, text = _LAST[0]
    if dt == last:
        return text
    u = dt if dt.tzinfo is UTC else dt.astimezone(UTC)
    text = (
        f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
        f".{u.microsecond:06d}Z"
    )
    _LAST[0] = (dt, text)
    return text


_LAST: list[tuple[datetime, str]] = [(datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000000Z")]


def from_text(text: str | None) -> datetime | None:
    if text is None:
        return None
    if (  # the stored form exactly: the C parser, ten times faster than strptime
        len(text) == 27
        and text[26] == "Z"
        and text[10] == "T"
        and text[19] == "."
        and text[4] == text[7] == "-"
        and text[13] == text[16] == ":"
    ):
        return datetime.fromisoformat(text)  # "Z" reads as UTC (Python ≥ 3.11)
    return datetime.strptime(text, _FMT).replace(tzinfo=UTC)


def plus(dt: datetime, seconds: float) -> datetime:
    return dt + timedelta(seconds=seconds)


def nap(seconds: float) -> None:
    """Sleep on the steady clock, as ``time.sleep`` does, for every wait settled makes.

    ``time.sleep`` sleeps until a deadline (``clock_nanosleep`` with an absolute
    time), and libfaketime, which the suite uses to step a process's wall clock,
    turns that deadline invalid after a step back: every sleep then fails with
    EINVAL. A timed wait on a lock that is never released sleeps the same time, is
    interrupted by signals the same way (Ctrl-C still raises ``KeyboardInterrupt``),
    and no clock step can break it."""
    if seconds > 0:
        threading.Event().wait(seconds)


def freeze_start_up() -> None:
    """The collector's pauses, once per process: what start-up made (modules, providers
    and their HTTP clients, the ledger) lives as long as the process, so the cyclic
    collector is told never to walk it again (``gc.freeze``). A bulk run calls it as it
    starts, a reconciler when its first pass ends; without it a run of a thousand
    actions pays full collections of tens of thousands of objects that never die
    (docs/performance.md). Only the first call freezes."""
    if not _FROZEN:
        _FROZEN.append(True)
        gc.freeze()


_FROZEN: list[bool] = []


class Clock:
    """The real clock. Tests pass a ``FakeClock`` with the same two methods."""

    def now(self) -> datetime:
        return utcnow()

    def sleep(self, seconds: float) -> None:
        nap(seconds)


class SteadyClock(Clock):
    """Wall time at an anchor plus the steady time elapsed since it (see the module
    docstring). ``drift()`` says how far the system clock has been stepped since."""

    def __init__(
        self,
        wall: datetime,
        at: float,
        *,
        source: Callable[[], float] = steady,
        system: Callable[[], datetime] = utcnow,
    ) -> None:
        self._wall = wall
        self._at = at
        self._source = source  # the steady clock (tests pass a fake host's)
        self._system = system  # the wall clock, read only to tell how far it drifted

    def now(self) -> datetime:
        return self._wall + timedelta(seconds=self._source() - self._at)

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)

    def drift(self) -> float:
        """System clock minus this clock, in seconds (positive: stepped forward)."""
        return (self._system() - self.now()).total_seconds()


class FollowingClock(SteadyClock):
    """Another clock's time (a database's), read on this host: its last reading plus
    the steady time elapsed since (``SteadyClock``), read again every ``refresh``
    seconds. The first reading is taken when it is made; a later one that fails with
    one of ``errors`` keeps the clock counting from the one before (``on_error`` hears
    why)."""

    def __init__(
        self,
        read: Callable[[], tuple[datetime, float]],
        refresh: float,
        errors: tuple[type[Exception], ...],
        on_error: Callable[[Exception], None],
    ) -> None:
        wall, at = read()
        super().__init__(wall, at)
        self._read = read
        self._refresh = refresh
        self._errors = errors
        self._on_error = on_error
        self._checked = at

    def now(self) -> datetime:
        s = steady()
        if s - self._checked >= self._refresh:
            self._checked = s
            try:
                self._wall, self._at = self._read()
            except self._errors as exc:
                self._on_error(exc)
        return super().now()


class FakeClock(Clock):
    """A clock that only moves when told to (``sleep`` advances it)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self._now = self._now + timedelta(seconds=seconds)
