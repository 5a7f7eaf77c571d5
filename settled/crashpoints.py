"""Crash points: named places in the send and verify paths where a test can make the
process die, to prove what a crash there leaves behind.

The core takes a *probe* (``Dispatcher(probe=...)``, ``Reconciler(probe=...)``,
``Ledger.open(..., probe=...)``) and calls it with the name of each point it passes;
the default does nothing. Only a process entry point arms one, on a test's request:
``python -m settled.testing --crash-at POINT …`` runs the CLI with ``kill_at(POINT)``
installed. Library code never reads the environment for it, so a stray variable
cannot kill a real send.

Points: ``before_claim``, ``before_commit:claimed``, ``after_claim``, ``before_write``
(connected, about to write the request: the last moment its lease is checked),
``after_send`` (request written, reply not read), ``after_reply``, ``before_commit:<event kind>``
(e.g. ``before_commit:outcome``), ``before_check``. The bulk path (``settled.bulk``)
adds ``after_group_claim`` (a group's claims committed, none of its requests sent),
``between_requests`` (a request of the group answered, the next not yet started) and
``after_group_outcome`` (a group's outcomes committed, none reported yet). The daemon
passes ``daemon_scheduled`` (its schedule made and running, its loop not yet started).
A prune (``settled.retention``) passes ``prune:in_batch`` (a batch's first record
written to the archive, its seal not), ``prune:sealed`` (a batch sealed and durable,
its records not yet deleted), each also as ``…:N`` for batch N, and
``before_commit:pruned``; a redaction passes ``before_commit:redacted``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Probe = Callable[[str], None]

POINTS = (
    "before_claim",
    "before_commit:claimed",
    "after_claim",
    "before_write",
    "after_send",
    "after_reply",
    "before_commit:outcome",
    "before_check",
    "before_commit:reconciled",
    "before_commit:lease_expired",
    "before_commit:unresolved",
    "after_group_claim",
    "between_requests",
    "after_group_outcome",
    "daemon_scheduled",
    "prune:in_batch",
    "prune:sealed",
    "before_commit:pruned",
    "before_commit:redacted",
)


def no_probe(point: str) -> None:
    """The default: crash points cost one call and do nothing."""


def kill_at(point: str) -> Probe:
    """A probe that SIGKILLs this process at ``point`` (no cleanup, no flush)."""

    def probe(name: str) -> None:
        if name == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return probe


def pause_at(point: str) -> Probe:
    """A probe that stops this process at ``point`` (SIGSTOP, as Ctrl-Z or a paused
    VM would) until someone sends it SIGCONT; it passes each point once."""
    passed: set[str] = set()

    def probe(name: str) -> None:
        if name == point and name not in passed:
            passed.add(name)
            os.kill(os.getpid(), signal.SIGSTOP)

    return probe


# The probe of the send in progress, for points deep in the wire code (``after_send``
# sits in httpcore's trace hook): the dispatcher makes its probe active around each
# try, so no provider signature has to carry it.
_ACTIVE: ContextVar[Probe | None] = ContextVar("settled_crash_probe", default=None)


@contextmanager
def active(probe: Probe) -> Iterator[None]:
    token = _ACTIVE.set(None if probe is no_probe else probe)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def armed() -> bool:
    """Whether a probe is active here (wire code installs its hooks only then)."""
    return _ACTIVE.get() is not None


def hit(point: str) -> None:
    """Pass ``point`` under the active probe, if any."""
    probe = _ACTIVE.get()
    if probe is not None:
        probe(point)


__all__ = ["POINTS", "Probe", "active", "armed", "hit", "kill_at", "no_probe", "pause_at"]
