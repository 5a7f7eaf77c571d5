"""The sweeper: the reconciliation pass (``settled reconcile --due``) on an APScheduler 3
interval job, until asked to stop.

- The job never overlaps itself: one worker thread, ``max_instances=1``, ``coalesce``
  (runs missed while a long pass was going collapse into one).
- Several sweepers (and cron passes) on one ledger are safe: the reconciler leases each
  row before it queries it, so no row is checked twice for the same due time.
- ``request_stop()`` (the CLI calls it on SIGTERM/SIGINT) lets the check in hand
  finish, hands the rest of the batch back to the ledger, and returns from ``serve``.
- Every status move is logged as one JSON line (time, action_id, from, to, kind,
  reason); so are start, stop, errors of a pass and scheduler warnings.

Errors of one pass are logged and the next run tries again: a locked or briefly
unreadable ledger must not end the daemon. This is a process boundary, like the CLI's
``main``, and the one place here that catches broadly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ..clock import Clock, steady, to_text
from ..crashpoints import Probe, no_probe
from ..errors import SettledError
from ..ledger import Ledger
from ..reconcile import DEFAULT_BATCH, DEFAULT_LEASE, Change, Reconciler

Log = Callable[[dict[str, Any]], None]


def json_lines(stream: IO[str] | None = None) -> Log:
    """A logger that writes one JSON object per line (to stderr by default)."""
    lock = threading.Lock()

    def log(entry: dict[str, Any]) -> None:
        out = stream or sys.stderr
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with lock:
            out.write(line + "\n")
            out.flush()

    return log


class _SchedulerLog(logging.Handler):
    """APScheduler's own warnings (a skipped overlapping run…) as JSON lines."""

    def __init__(self, sweeper: Sweeper) -> None:
        super().__init__(logging.WARNING)
        self.sweeper = sweeper

    def emit(self, record: logging.LogRecord) -> None:
        self.sweeper.emit("scheduler", level=record.levelname.lower(),
                          message=" ".join(record.getMessage().split()))


@dataclass
class Sweeper:
    ledger: Ledger
    registry: Any
    interval: float = 5.0
    batch: int = DEFAULT_BATCH
    lease: float = DEFAULT_LEASE
    clock: Clock | None = None  # default: the ledger's
    probe: Probe = no_probe
    concurrency: tuple[int, dict[str, int]] = (1, {})  # threads for queries; limit per provider
    log: Log = field(default_factory=json_lines)
    name: str = field(default_factory=lambda: f"daemon:{os.getpid()}")
    _stop: threading.Event = field(default_factory=threading.Event)
    passes: int = 0

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = self.ledger.clock()

    @property
    def now_text(self) -> str:
        assert self.clock is not None
        return to_text(self.clock.now())

    def emit(self, event: str, **fields: Any) -> None:
        self.log({"time": self.now_text, "event": event, "daemon": self.name,
                  **fields})

    def request_stop(self, why: str = "stop requested") -> None:
        if not self._stop.is_set():
            self.emit("stopping", reason=why)
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _transition(self, ch: Change) -> None:
        self.log({"time": ch.at or self.now_text, "event": "transition",
                  "daemon": self.name, "action_id": ch.action_id, "from": ch.from_status,
                  "to": ch.to_status, "kind": ch.kind, "reason": " ".join(ch.reason.split())})

    def run_pass(self) -> None:
        """One pass (the job). Never raises: a failed pass is logged and retried at
        the next interval."""
        if self._stop.is_set():
            return
        self.passes += 1
        reconciler = Reconciler(
            self.ledger, self.registry, clock=self.clock, actor=self.name, batch=self.batch,
            lease=self.lease, on_change=self._transition, stop_requested=self._stop.is_set,
            probe=self.probe, concurrency=self.concurrency[0], limits=self.concurrency[1],
        )
        try:
            report = reconciler.run_due()
        except SettledError as exc:
            self.emit("pass_failed", level="error", error=type(exc).__name__,
                      message=" ".join(str(exc).split()))
            return
        except Exception as exc:  # the daemon's boundary: log the bug, keep serving
            if os.environ.get("SETTLED_DEBUG"):
                raise
            self.emit("pass_failed", level="error", error=type(exc).__name__,
                      message=" ".join(str(exc).split()))
            return
        if report.examined or report.stopped:
            waiting = len(report.waiting)
            self.emit("pass", examined=report.examined, counts=report.counts(),
                      waiting=waiting, stopped=report.stopped)

    def serve(self, *, once: bool = False) -> int:
        """Run passes every ``interval`` seconds until ``request_stop``; 0 when it
        stopped cleanly."""
        self.emit("started", interval=self.interval, batch=self.batch, once=once,
                  ledger=self.ledger.location)
        if once:
            self.run_pass()
            self.emit("stopped", passes=self.passes)
            return 0
        from datetime import UTC, datetime

        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        aps_log = logging.getLogger("apscheduler")
        handler = _SchedulerLog(self)
        aps_log.addHandler(handler)
        aps_log.propagate = False
        scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        scheduler.add_job(
            self.run_pass, "interval", seconds=self.interval, id="reconcile-due",
            next_run_time=datetime.now(UTC),
        )
        scheduler.start()
        watch = _StepWatch()
        try:
            while not self._stop.wait(0.2):
                jump = watch.jumped()
                if jump:
                    # APScheduler 3 schedules by the wall clock: after a step back it
                    # would sleep until the old next run; after a step forward it would
                    # run late jobs at once. Re-anchor the job now; every decision
                    # about records uses the ledger's steady clock anyway.
                    self.emit("clock_step", level="warning", seconds=round(jump, 3),
                              message="the system clock was stepped; the schedule was reset")
                    scheduler.modify_job("reconcile-due", next_run_time=datetime.now(UTC))
        finally:
            scheduler.shutdown(wait=True)  # the pass in hand sees the stop and returns
            aps_log.removeHandler(handler)
        self.emit("stopped", passes=self.passes)
        return 0


class _StepWatch:
    """Notices a step of the wall clock: wall time that moved by more (or less) than
    the steady clock did since the last look."""

    TOLERANCE = 1.0  # s: more than any scheduling jitter, less than any real step

    def __init__(self) -> None:
        self.wall, self.steady = time.time(), steady()

    def jumped(self) -> float:
        wall, now = time.time(), steady()
        jump = (wall - self.wall) - (now - self.steady)
        self.wall, self.steady = wall, now
        return jump if abs(jump) > self.TOLERANCE else 0.0


__all__ = ["Sweeper", "json_lines"]
