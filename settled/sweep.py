"""The sweeper: the reconciliation pass (``settled reconcile --due``) on an APScheduler 3
interval job, until asked to stop.

- The job never overlaps itself: one worker thread, ``max_instances=1``, ``coalesce``
  (runs missed while a long pass was going collapse into one). A pass that outlasts
  the interval is logged once as ``pass_overrun``, never as APScheduler's own line.
- Several sweepers (and cron passes) on one ledger are safe: the reconciler leases each
  row before it queries it, so no row is checked twice for the same due time.
- ``request_stop()`` (the CLI calls it on SIGTERM/SIGINT) lets the check in hand
  finish, hands the rest of the batch back to the ledger, and returns from ``serve``.
  A stop requested before ``serve`` (during the daemon's start-up) runs no pass:
  ``serve`` logs ``started``, ``stopping`` and ``stopped`` and returns.
- The log is one JSON line per event (``settled.log``): each status move after
  its commit, a ``check_failed`` warning per attempt that could not observe anything
  (provider, operation, error class; such attempts count, rule 15), a summary per
  pass, a heartbeat at a steady interval, and a ``provider_outage`` warning when a
  provider's checks have all failed for its ``outage_after`` (``settled.outage``),
  with a ``provider_recovered`` one when it answers again.
- Before each pass it reads the ledger's schema version again (one cheap read): when
  it moved since the start (a newer settled ran ``settled migrate``), the daemon logs
  one ``ledger_changed`` line, runs no pass on a schema it does not know, and stops
  with exit 1 (rule 18).
- ``metrics`` (``settled.metrics``) and ``notifier`` (systemd's
  ``Type=notify`` and watchdog, ``settled.notify``) are optional.

Errors of one pass are logged and the next run tries again: a locked or briefly
unreadable ledger must not end the daemon. This is a process boundary, like the CLI's
``main``, and the one place here that catches broadly. ``settled daemon`` runs it, and
``settled serve --reconcile`` runs the same sweeper beside its routes.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .clock import Clock, nap, steady, to_text
from .crashpoints import Probe, no_probe
from .errors import LedgerMoved, SettledError
from .log import Log, check_failed, failed, json_lines, one_line, pass_line, transition
from .model import TERMINAL
from .notify import Notifier
from .outage import Outages
from .reconcile import DEFAULT_BATCH, DEFAULT_LEASE, Change, Reconciler
from .storage import Ledger
from .storage.ledger import moved_message

DEFAULT_HEARTBEAT = 60.0  # s between heartbeat lines


class _SchedulerLog(logging.Handler):
    """APScheduler's own warnings, translated: a skipped run (the previous pass still
    going) is one ``pass_overrun`` line per long pass; anything else is a
    ``scheduler`` line with the message on one line."""

    def __init__(self, sweeper: Sweeper) -> None:
        super().__init__(logging.WARNING)
        self.sweeper = sweeper

    def emit(self, record: logging.LogRecord) -> None:
        msg = one_line(record.getMessage())
        if "maximum number of running instances" in msg:
            self.sweeper.overran()
            return
        self.sweeper.emit("scheduler", level=record.levelname.lower(), message=msg)


# s: the shortest slice lease a daemon takes, whatever its interval. Its heartbeat
# renews it every fifth of it: a holder's heartbeat may fall 4 s behind on a loaded
# host before another daemon could take the slice (and repeat a check, never a send).
MIN_HOLD = 5.0


def hold_for(interval: float, lease: float) -> float:
    """The lease of a daemon's slice on a shared (PostgreSQL) ledger: one interval
    (at least ``MIN_HOLD``, at most ``[reconcile] lease``), renewed while the daemon
    holds it, so that a killed daemon's slice is due again within one interval."""
    return min(lease, max(MIN_HOLD, interval))


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
    heartbeat: float = DEFAULT_HEARTBEAT
    metrics: Any = None  # settled.metrics.Metrics
    metrics_address: str | None = None  # where it serves, for the started line
    notifier: Notifier = field(default_factory=lambda: Notifier({}))
    outages: Outages = field(default_factory=Outages)  # each provider's failing checks
    # A plain flag, not a threading.Event: request_stop runs in signal handlers, and
    # Event.set takes the event's lock, which the serving thread holds for a moment in
    # every Event.wait: a signal landing in that moment waited on it forever.
    _stop: bool = False
    _stop_reason: str = "stop requested"
    _said_stopping: bool = False
    passes: int = 0
    failed_passes: int = 0
    last_pass_ok: bool | None = None
    last_pass_at: str | None = None
    _in_pass: bool = False
    _progress_at: float = field(default_factory=time.monotonic)
    _overrun_logged: bool = False
    _depth: dict[str, int] = field(default_factory=dict)
    _failing_since: dict[str, float] = field(default_factory=dict)  # as of the last pass
    schema: int | None = None  # the ledger's schema version at the start
    exit_code: int = 0  # 1 once the schema moved under the daemon (``ledger_changed``)
    moved: str | None = None  # why it stopped: its ledger was moved (migrate-ledger)

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = self.ledger.clock()
        if self.schema is None:
            self.schema = self.ledger.schema  # as this process opened it

    @property
    def now_text(self) -> str:
        assert self.clock is not None
        return to_text(self.clock.now())

    def emit(self, event: str, **fields: Any) -> None:
        self.log({"time": self.now_text, "event": event, "daemon": self.name, **fields})

    def request_stop(self, why: str = "stop requested") -> None:
        """Ask the daemon to stop after the check in hand. Safe in a signal handler:
        it takes no lock and only records the request (logging from a handler could
        wait forever on the log's lock, held by the very line the signal interrupted;
        setting an Event, on the lock of the Event the serving thread is waiting on);
        ``serve``, which looks every 0.2 s at most, says so and stops."""
        if not self._stop:
            self._stop_reason = why
        self._stop = True

    def _stopping(self) -> None:
        """Say that a stop was asked for, once, from the serving thread."""
        if not self._said_stopping:
            self._said_stopping = True
            self.emit("stopping", reason=self._stop_reason)
            self.notifier.stopping()

    @property
    def stopping(self) -> bool:
        return self._stop

    # -- hooks of the reconciler (called after each commit)
    def _transition(self, ch: Change) -> None:
        self._progress_at = time.monotonic()
        if ch.at is None:
            ch.at = self.now_text
        if failed(ch):  # the attempt that gave the record up could not check either
            self.log(check_failed(ch, self.name))
        self.log(transition(ch, self.name))
        self.outages.saw(ch)
        if self.metrics is not None:
            self.metrics.transition(ch)

    def _checked(self, ch: Change) -> None:
        self._progress_at = time.monotonic()
        bad = failed(ch)
        if bad:
            self.log(check_failed(ch, self.name))
        self.outages.saw(ch)
        if self.metrics is not None:
            self.metrics.check(ch, bad)

    def overran(self) -> None:
        if not self._overrun_logged:
            self._overrun_logged = True
            self.emit(
                "pass_overrun",
                level="info",
                message=f"a pass is taking longer than the interval ({self.interval:g} s); "
                "the next starts when it ends",
            )

    def run_pass(self) -> None:
        """One pass (the job). Never raises: a failed pass is logged and retried at
        the next interval."""
        if self._stop:
            return
        started = time.monotonic()
        try:
            schema = self.ledger.schema_version()
        except SettledError as exc:
            self.passes += 1
            self._pass_failed(exc, started)
            return
        if schema != self.schema:
            self._schema_moved(schema)
            return
        self.passes += 1
        try:
            where = self.ledger.moved()
        except SettledError:
            where = None  # the pass below meets the same error and logs it
        if where is not None:
            self._ledger_moved(moved_message(self.ledger.location, *where))
            return
        self._in_pass = True
        self._progress_at = started
        reconciler = Reconciler(
            self.ledger,
            self.registry,
            clock=self.clock,
            actor=self.name,
            batch=self.batch,
            lease=self.lease,
            on_change=self._transition,
            on_check=self._checked,
            stop_requested=lambda: self._stop,
            probe=self.probe,
            concurrency=self.concurrency[0],
            limits=self.concurrency[1],
            hold=hold_for(self.interval, self.lease),
        )
        try:
            report = reconciler.run_due()
            self.ledger.fold_counts()  # ended sessions' counts into one row each
            depth = self.ledger.status_counts()
            failing = self.ledger.check_failures()
        except LedgerMoved as exc:
            self._ledger_moved(str(exc))
            return
        except SettledError as exc:
            self._pass_failed(exc, started)
            return
        except Exception as exc:  # the daemon's boundary: log the bug, keep serving
            if os.environ.get("SETTLED_DEBUG"):
                raise
            self._pass_failed(exc, started)
            return
        finally:
            self._in_pass = False
            self._overrun_logged = False
        self._pass_succeeded(depth, failing, started)
        if report.examined or report.stopped:
            self.log(pass_line(report, self.name))

    def _pass_succeeded(
        self, depth: dict[tuple[str, str], int], failing: dict[str, int], started: float
    ) -> None:
        """What a pass that ran leaves: the health, the gauges, the outage warnings."""
        self.last_pass_ok, self.last_pass_at = True, self.now_text
        self._depth = {}
        for (status, _provider), n in depth.items():
            self._depth[status] = self._depth.get(status, 0) + n
        said = self.outages.pass_ended(failing)
        figures = self.outages.figures()  # on this thread: the heartbeat reads a copy
        self._failing_since = {p: round(f[0], 3) for p, f in sorted(figures.items())}
        if self.metrics is not None:
            self.metrics.queue(depth, failing)
            self.metrics.outages(figures)
            self.metrics.pass_ended(True, time.monotonic() - started, time.time())
        # Said after /healthz and the gauges hold it: whoever reads the warning and
        # then asks the service finds the same outage (or its end) there.
        for line in said:
            self.emit(line.pop("event"), **line)

    def _schema_moved(self, schema: int) -> None:
        """The ledger's schema is not the one this daemon started on: say so once and
        stop, running nothing on a schema this settled may not know (rule 18)."""
        if self.exit_code:
            return
        self.exit_code = 1
        why = (
            "a newer settled migrated it"
            if self.schema is not None and schema > self.schema
            else "the ledger was replaced by an older one"
        )
        self.emit(
            "ledger_changed",
            level="error",
            schema_was=self.schema,
            schema_now=schema,
            message=f"stopping: the ledger's schema moved from {self.schema} to {schema} "
            f"({why}); start this version's daemon",
        )
        self.notifier.status(f"stopped: the ledger's schema moved to {schema}")
        self.request_stop("ledger_changed")

    def _ledger_moved(self, line: str) -> None:
        """The ledger was moved (rule 17): nothing more can be written to it, so the
        daemon says so once and stops; ``serve`` then exits 1."""
        self.failed_passes += 1
        self.last_pass_ok, self.last_pass_at = False, self.now_text
        self.moved = line
        self.emit("ledger_moved", level="error", error="LedgerMoved", message=line)
        self.request_stop("the ledger was moved")

    def _pass_failed(self, exc: BaseException, started: float) -> None:
        self.failed_passes += 1
        self.last_pass_ok, self.last_pass_at = False, self.now_text
        message = one_line(str(exc))
        self.emit("pass_failed", level="error", error=type(exc).__name__, message=message)
        if self.metrics is not None:
            self.metrics.pass_ended(
                False, time.monotonic() - started, time.time(), f"{type(exc).__name__}: {message}"
            )
        self.notifier.status(f"last pass failed: {type(exc).__name__}")

    def beat(self) -> None:
        """One heartbeat line: the daemon is alive, and how its passes are going."""
        self.emit(
            "heartbeat",
            passes=self.passes,
            failed_passes=self.failed_passes,
            last_pass_ok=self.last_pass_ok,
            last_pass_at=self.last_pass_at,
            in_pass=self._in_pass,
            open={k: v for k, v in sorted(self._depth.items()) if k not in TERMINAL},
            failing_since=self._failing_since,
        )

    def alive(self) -> bool:
        """For the watchdog: between passes, or a pass that made progress within
        the watchdog's interval (one check can take up to its operation's timeout)."""
        if not self._in_pass or self.notifier.watchdog is None:
            return True
        return time.monotonic() - self._progress_at < 2 * self.notifier.watchdog

    def serve(self, *, once: bool = False) -> int:
        """Run passes every ``interval`` seconds until ``request_stop``; 0 when it
        stopped cleanly, 1 when it stopped because the ledger's schema moved. With
        ``once``, one pass: 0 when it ran, 1 when it failed (its ``pass_failed`` line
        says why), as ``settled reconcile --due`` would exit."""
        self.emit(
            "started",
            interval=self.interval,
            batch=self.batch,
            once=once,
            ledger=self.ledger.location,
            heartbeat=self.heartbeat,
            watchdog=self.notifier.watchdog,
            notify=self.notifier.enabled,
            metrics=self.metrics_address,
        )
        if once or self._stop:  # one pass; or none: stopped during start-up
            self.run_pass()
            if self._stop:
                self._stopping()
            self.emit("stopped", passes=self.passes, failed_passes=self.failed_passes)
            return 1 if self.last_pass_ok is False or self.exit_code else 0
        from datetime import UTC, datetime

        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        aps_log = logging.getLogger("apscheduler")
        handler = _SchedulerLog(self)
        aps_log.addHandler(handler)
        aps_log.propagate = False
        # Watch the wall clock from before the scheduler first reads it: a step between
        # the job's first schedule and the watch's first look would go unseen, and after
        # a step back the scheduler would sleep until the old next run (an hour, say).
        watch = _StepWatch()
        scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        scheduler.add_job(
            self.run_pass,
            "interval",
            seconds=self.interval,
            id="reconcile-due",
            next_run_time=datetime.now(UTC),
        )
        scheduler.start()
        self.probe("daemon_scheduled")
        self.notifier.ready(f"reconciling every {self.interval:g} s")
        now = time.monotonic()
        next_beat = now + self.heartbeat
        next_ping = now
        try:
            step = 0.2 if self.notifier.watchdog is None else min(0.2, self.notifier.watchdog / 2)
            while not self._stop:
                nap(step)
                if self._stop:
                    break
                jump = watch.jumped()
                if jump:
                    # APScheduler 3 schedules by the wall clock: after a step back it
                    # would sleep until the old next run; after a step forward it would
                    # run late jobs at once. Re-anchor the job now; every decision
                    # about records uses the ledger's steady clock anyway.
                    self.emit(
                        "clock_step",
                        level="warning",
                        seconds=round(jump, 3),
                        message="the system clock was stepped; the schedule was reset",
                    )
                    scheduler.modify_job("reconcile-due", next_run_time=datetime.now(UTC))
                now = time.monotonic()
                if now >= next_beat:
                    self.beat()
                    while next_beat <= now:  # steady: a late beat does not shift the next ones
                        next_beat += self.heartbeat
                if self.notifier.watchdog is not None and now >= next_ping and self.alive():
                    self.notifier.ping()
                    next_ping = now + self.notifier.watchdog
            self._stopping()
        finally:
            scheduler.shutdown(wait=True)  # the pass in hand sees the stop and returns
            aps_log.removeHandler(handler)
        self.emit("stopped", passes=self.passes)
        return self.exit_code or (1 if self.moved else 0)


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
