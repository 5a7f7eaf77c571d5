"""What every command shares: the global options, opening the ledger and the
registry once, and rendering records as JSON or for people."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Config
    from ..dispatch import Dispatcher
    from ..ledger import Ledger
    from ..providers import Registry
    from ..reconcile import Reconciler


def one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass
class State:
    db: str | None = None
    config_path: str | None = None
    _config: Config | None = None
    _ledger: Ledger | None = None
    _registry: Registry | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self) -> Config:
        if self._config is None:
            from .. import config

            self._config = config.load(self.config_path or config.default_config_path())
        return self._config

    def ledger(self) -> Ledger:
        if self._ledger is None:
            from ..config import default_db_path
            from ..ledger import Ledger

            cfg = self.config()
            path = self.db or cfg.ledger_path or default_db_path()
            if not self.db and not cfg.ledger_path:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            self._ledger = Ledger.open(path, busy_timeout=cfg.busy_timeout)
        return self._ledger

    def registry(self) -> Registry:
        if self._registry is None:
            from ..providers import Registry

            cfg = self.config()
            self._registry = Registry(cfg.providers, source=cfg.source)
        return self._registry

    def dispatcher(self, actor: str) -> Dispatcher:
        """The dispatcher every sending command uses, configured from settled.toml."""
        from ..dispatch import Dispatcher, DispatchSettings

        cfg = self.config()
        settings = DispatchSettings(lease_grace=cfg.lease_grace, backoff=cfg.backoff)
        return Dispatcher(self.ledger(), self.registry(), settings=settings, actor=actor)

    def reconciler(self, **kw: Any) -> Reconciler:
        """The reconciler every verifying command uses, configured from settled.toml."""
        from ..reconcile import Reconciler

        cfg = self.config()
        return Reconciler(
            self.ledger(), self.registry(), batch=cfg.reconcile_batch, lease=cfg.reconcile_lease,
            **kw,
        )

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        self._config = None


STATE = State()


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():  # logs and pipes: don't fold rows at 80 columns
        width = int(os.environ.get("COLUMNS", "0") or 0) or 200
    return Console(stderr=stderr, highlight=False, width=width)


STATUS_STYLE = {
    "CONFIRMED": "green",
    "FAILED": "red",
    "DENIED_UNRESOLVED": "yellow",
    "AWAITING_VERIFICATION": "cyan",
    "IN_FLIGHT": "blue",
    "PENDING": "white",
}


MAX_DURATION = 100 * 366 * 86400.0  # s: a century


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' → seconds."""
    from ..errors import UsageError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"bad duration {text!r}: use e.g. 90s, 10m, 2h or 1d") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise UsageError(f"bad duration {text!r}: must be a finite number >= 0")
    if value * mult > MAX_DURATION:  # beyond what a date can be shifted by
        raise UsageError(f"bad duration {text!r}: at most {MAX_DURATION // 86400:g}d")
    return value * mult


def age(created_at: str, now: Any) -> str:
    from ..clock import from_text

    secs = max(0, int((now - from_text(created_at)).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def next_step(rec: Any) -> str:
    """What settles this record next, in words: an automatic check, or a person."""
    if rec.status in ("CONFIRMED", "FAILED"):
        return "settled"
    if rec.status == "PENDING":
        return "waiting for confirm/dispatch"
    if rec.status == "IN_FLIGHT":
        return f"dispatch in progress (lease until {hhmm(rec.lease_expires_at)})"
    if rec.requires_manual_verification:
        if rec.status == "AWAITING_VERIFICATION" and rec.eligible_at:
            return f"needs a person from {hhmm(rec.eligible_at)} (settled resolve)"
        return "needs a person (settled resolve)"
    if rec.next_check_at:
        if rec.lease_owner:
            return f"being checked (lease until {hhmm(rec.next_check_at)})"
        return f"auto-check at {hhmm(rec.next_check_at)}"
    return "needs a person (settled resolve)"


def hhmm(text: str | None) -> str:
    if not text:
        return "-"
    return text[11:19]
