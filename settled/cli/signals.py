"""SIGTERM for the command line.

A CI runner cancelling a job, ``kill``, a Kubernetes Job's deadline and systemd all
send SIGTERM, and Python's default is to die at once and print nothing (exit 143).
``main`` takes SIGTERM first thing and holds it (``hold``) until the command says what
it means for it:

- most commands: what it always meant, the end of the process (``default``);
- the daemon: a clean stop with its ``stopping`` and ``stopped`` lines, however early
  in its start-up it came (``take``);
- ``dispatch --wait``, ``confirm --wait`` and ``queue --watch``: what Ctrl-C means
  (``as_interrupt``): ``Terminated``, a ``KeyboardInterrupt``, is raised where the
  signal lands, so the record is printed and the exit code is its status. It is
  raised once, and only while the command runs (``returned``): a SIGTERM after that,
  or a second one while the first is handled, is noted and ``main`` exits 143, so
  none reaches code that does not catch it.

Standard library only: ``import settled.cli`` stays light.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

Handler = Callable[[int, Any], None]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as SIGINT raises ``KeyboardInterrupt`` (``as_interrupt``)."""


_held: list[int] = []


def _hold(signum: int, _frame: Any) -> None:
    _held.append(signum)


def _raise(_signum: int, _frame: Any) -> None:
    # Once: a second SIGTERM while the first is being handled (the record read and
    # printed) is noted, never raised into that handling; ``main`` then exits 143.
    _install(_hold)
    raise Terminated


def _install(handler: Handler | int) -> bool:
    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (settled embedded in another program)
        return False
    return True


def hold() -> Any:
    """From now on a SIGTERM is noted, not acted on, until the command decides.
    Returns the handler it replaced, for ``restore``."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        previous = None
    _held.clear()
    _install(_hold)
    return previous


def restore(previous: Any) -> None:
    """Put back what ``hold`` replaced (``main`` may run inside another program)."""
    if previous is not None:
        _install(previous)


def held() -> bool:
    """Whether a SIGTERM came while held and nobody has taken it."""
    return bool(_held)


def default() -> None:
    """SIGTERM ends the process again, as Python's default does; one that came while
    it was held ends it now."""
    if _install(signal.SIG_DFL) and _held:
        _held.clear()
        os.kill(os.getpid(), signal.SIGTERM)


def as_interrupt() -> None:
    """SIGTERM raises ``Terminated`` from now on (at once, when one was held)."""
    if _install(_raise) and _held:
        _held.clear()
        raise Terminated


def returned() -> None:
    """The command has returned: a SIGTERM that ``as_interrupt`` would raise is noted
    from now on instead (``main`` exits 143), so none is raised where nothing catches it."""
    try:
        armed = signal.getsignal(signal.SIGTERM) is _raise
    except ValueError:
        return
    if armed:
        _install(_hold)


def take(handler: Handler) -> bool:
    """Hand SIGTERM to ``handler``; True when one came while held (the caller acts on it)."""
    came = bool(_held)
    _held.clear()
    _install(handler)
    return came


__all__ = ["Terminated", "as_interrupt", "default", "held", "hold", "restore", "returned", "take"]
