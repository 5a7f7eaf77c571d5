"""Outages are loud: how long each provider has failed every check a pass made of it.

A provider that answers 429 or 503 to its checks (a pause: no attempt, none counted,
rule 15) or cannot be reached (an attempt that failed) leaves its records waiting,
and a pause never spends their budget: without this, a provider stuck on 503 would
keep them out of the queue for ever and page nobody. ``Outages`` follows the checks
the sweeper reports, in order:

- a failing check (paused, or an error) of a provider that was answering starts its
  trouble at that moment; an answer (anything observed) ends it;
- at the end of a pass, a provider whose open records no longer fail a check (each
  one answered, or was settled by other means) is answering again too;
- trouble that lasted ``outage_after`` seconds (``[providers.NAME] outage_after``,
  default ``settled.config.DEFAULT_OUTAGE_AFTER``) is an outage: one
  ``provider_outage`` warning when it begins and one ``provider_recovered`` warning
  when it ends.

The time is this process's: a daemon that restarts during an outage starts counting
again at its first failing check (so the page comes at most ``outage_after`` later).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .clock import to_text, utcnow
from .config import DEFAULT_OUTAGE_AFTER
from .log import error_class, failed


@dataclass
class Trouble:
    """One provider's failing checks, since the first in a row."""

    provider: str
    since: float  # steady clock (``time.monotonic``)
    since_text: str  # the same moment, on the wall clock, for people
    why: str  # what the last failing check met: "HTTP 503", "ConnectError"
    loud: bool = False  # past its outage_after: the warning was written

    def seconds(self, now: float) -> float:
        return max(0.0, now - self.since)


class Outages:
    """``after``: each provider's ``outage_after``; ``default`` for the others."""

    def __init__(
        self,
        after: Mapping[str, float] | None = None,
        default: float = DEFAULT_OUTAGE_AFTER,
        *,
        steady: Callable[[], float] = time.monotonic,
        wall: Callable[[], Any] | None = None,
    ) -> None:
        self.after = dict(after or {})
        self.default = default
        self.steady = steady
        self.wall = wall or utcnow
        self.troubles: dict[str, Trouble] = {}
        self._over: list[Trouble] = []  # outages that ended, not yet logged

    def threshold(self, provider: str) -> float:
        return self.after.get(provider, self.default)

    def saw(self, ch: Any) -> None:
        """One record's check as the reconciler reported it (``reconcile.Change``)."""
        provider = ch.provider
        if not provider:
            return
        paused = getattr(ch, "paused", "")
        if paused or failed(ch):
            why = paused or error_class(ch)
            trouble = self.troubles.get(provider)
            if trouble is None:
                self.troubles[provider] = Trouble(
                    provider, self.steady(), to_text(self.wall()), why
                )
            else:
                trouble.why = why
        elif ch.seen is not None:
            self.ended(provider)

    def ended(self, provider: str) -> None:
        """The provider answered: its trouble ends (a loud one is said to be over at
        the end of the pass)."""
        trouble = self.troubles.pop(provider, None)
        if trouble is not None and trouble.loud:
            self._over.append(trouble)

    def pass_ended(self, failing: Mapping[str, int]) -> list[dict[str, Any]]:
        """After a pass: ``failing`` is the ledger's open records whose last check could
        not be made, by provider. The log lines to write: ``provider_outage`` for each
        trouble that has just lasted its ``outage_after``, ``provider_recovered`` for
        each outage that ended."""
        for provider in [p for p in self.troubles if not failing.get(p)]:
            self.ended(provider)  # nothing of it fails a check any more
        now = self.steady()
        lines: list[dict[str, Any]] = []
        for t in self._drain():
            lines.append(
                {
                    "event": "provider_recovered",
                    "level": "warning",
                    "provider": t.provider,
                    "since": t.since_text,
                    "seconds": round(t.seconds(now), 3),
                    "message": f"{t.provider} answers its checks again after "
                    f"{t.seconds(now):.0f} s of {t.why}",
                }
            )
        for t in sorted(self.troubles.values(), key=lambda t: t.provider):
            if not t.loud and t.seconds(now) >= self.threshold(t.provider):
                t.loud = True
                n = failing.get(t.provider, 0)
                lines.append(
                    {
                        "event": "provider_outage",
                        "level": "warning",
                        "provider": t.provider,
                        "error": t.why,
                        "since": t.since_text,
                        "seconds": round(t.seconds(now), 3),
                        "outage_after": self.threshold(t.provider),
                        "records": n,
                        "message": f"{t.provider} has failed every check for "
                        f"{t.seconds(now):.0f} s ({t.why} since {t.since_text}); {n} open "
                        f"record{'' if n == 1 else 's'} cannot be checked",
                    }
                )
        return lines

    def _drain(self) -> list[Trouble]:
        over, self._over = self._over, []
        return over

    def figures(self) -> dict[str, tuple[float, bool, str, str]]:
        """Provider → (seconds failing, an outage, why, since), as of now."""
        now = self.steady()
        return {p: (t.seconds(now), t.loud, t.why, t.since_text) for p, t in self.troubles.items()}


__all__ = ["Outages", "Trouble"]
