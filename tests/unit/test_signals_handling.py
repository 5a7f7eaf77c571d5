"""``settled.cli.signals`` in this process: what a SIGTERM does at each stage of a
command. The real-process proofs (a CI cancel during ``--wait``, the daemon's start-up)
are in ``test_signals.py``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from settled.cli import signals

pytestmark = pytest.mark.ledger_free


@pytest.fixture(autouse=True)
def _held() -> Iterator[None]:
    previous = signals.hold()
    try:
        yield
    finally:
        signals.restore(previous)
        signals.take(signal.getsignal(signal.SIGTERM))  # nothing left noted for later tests


def sigterm() -> None:
    """A SIGTERM to this process; its handler runs before ``os.kill`` returns."""
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_while_held_is_noted_and_raised_once_armed() -> None:
    sigterm()
    assert signals.held()
    with pytest.raises(signals.Terminated):
        signals.as_interrupt()
    assert not signals.held()


def test_an_armed_sigterm_is_raised_once_and_the_next_is_noted() -> None:
    """The first ends the wait; a second, while the record is read and printed, must
    not raise into that handling (``main`` exits 143 for it)."""
    signals.as_interrupt()
    with pytest.raises(signals.Terminated):
        sigterm()
    sigterm()  # raises nothing
    assert signals.held()


def test_after_the_command_returned_a_sigterm_is_noted_not_raised() -> None:
    signals.as_interrupt()
    signals.returned()
    sigterm()  # raises nothing: main's try has ended
    assert signals.held()


def test_returned_leaves_a_command_that_chose_another_meaning_alone() -> None:
    seen: list[int] = []
    signals.take(lambda signum, _frame: seen.append(signum))
    signals.returned()
    sigterm()
    assert seen == [signal.SIGTERM] and not signals.held()
