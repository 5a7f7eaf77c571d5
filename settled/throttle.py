"""How hard one provider may be pushed: at most ``limit`` requests in flight at once
(``max_in_flight`` in its config section), and none before the moment it asked for
(a ``Retry-After`` on 429 or 503, or a back-off when it gave none).

A ``Gate`` is shared by the threads of one bulk dispatch or one reconciliation pass
that talk to the same provider. It never sends, retries or decides anything: the
dispatcher and the reconciler ask it before each request, and ``settled.policy``
says how long a reply asks us to wait.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .clock import nap, steady


class Gate:
    """One provider's limit on requests in flight, and the moment it may be asked again."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit) if limit else None
        self._lock = threading.Lock()
        self._not_before = 0.0  # ``clock.steady()`` instant
        self.why = ""  # what asked for the last hold: "HTTP 503", "HTTP 429"

    def slot(self) -> Gate:
        """Hold one of the provider's in-flight slots for one request: ``with gate.slot():``."""
        return self

    def __enter__(self) -> None:
        if self._slots is not None:
            self._slots.acquire()

    def __exit__(self, *exc: object) -> None:
        if self._slots is not None:
            self._slots.release()

    def hold(self, seconds: float, why: str = "") -> None:
        """Ask nothing of this provider for ``seconds`` from now (never shortens a hold);
        ``why`` names the answer that asked for it."""
        with self._lock:
            self._not_before = max(self._not_before, steady() + seconds)
            if why:
                self.why = why

    def closed_for(self) -> float:
        """Seconds until the provider may be asked again (0 when it may now)."""
        until = self._not_before  # one read of a float: no lock needed to look
        return max(0.0, until - steady()) if until else 0.0

    def wait(self, budget: float) -> float:
        """Wait until the provider may be asked again, if that is within ``budget``
        seconds: returns what is left of the budget, or 0 at once (without waiting)
        when the hold outlasts it."""
        wait = self.closed_for()
        if wait <= 0:
            return budget
        if wait >= budget:
            return 0.0
        nap(wait)
        return budget - wait


class Gates:
    """A gate per provider name: ``limits`` from the config, ``default`` for the rest."""

    def __init__(self, limits: Mapping[str, int] | None = None, default: int | None = None) -> None:
        self._limits = dict(limits or {})
        self._default = default
        self._gates: dict[str, Gate] = {}
        self._lock = threading.Lock()

    def limit(self, provider: str) -> int | None:
        return self._limits.get(provider, self._default)

    def __getitem__(self, provider: str) -> Gate:
        gate = self._gates.get(provider)
        if gate is not None:
            return gate
        with self._lock:
            gate = self._gates.get(provider)
            if gate is None:
                gate = self._gates[provider] = Gate(self.limit(provider))
            return gate


__all__ = ["Gate", "Gates"]
