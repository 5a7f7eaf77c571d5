"""What every benchmark shares: repeats, statistics, temporary ledgers, the table.

Every figure is a ratio against a baseline timed in the same run on the same machine:
absolute numbers drift with the machine and its neighbours, ratios much less.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of the table.

    ``settled`` and ``baseline`` are lists, one figure per repeat, measured in pairs.
    ``higher_is_better`` says which way the ratio settled/baseline should go;
    ``target`` is the ratio to approach (None: shown for reference only)."""

    group: str
    what: str
    unit: str
    settled: list[float]
    baseline: list[float]
    baseline_name: str
    higher_is_better: bool = True
    target: float | None = None
    note: str = ""
    ratios: list[float] = field(default_factory=list)
    delta: bool = False  # compare settled - baseline (in the unit) instead of a ratio

    def __post_init__(self) -> None:
        if not self.ratios:
            pairs = zip(self.settled, self.baseline, strict=True)
            if self.delta:
                self.ratios = [s - b for s, b in pairs]
            else:
                self.ratios = [s / b for s, b in pairs if b]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else float("nan")

    def _figure(self, values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    @property
    def settled_figure(self) -> float:
        return self._figure(self.settled)

    @property
    def baseline_figure(self) -> float:
        return self._figure(self.baseline)

    @property
    def met(self) -> bool | None:
        if self.target is None or not self.ratios:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return "reference"
        if self.delta:
            return f"≤ +{self.target:g} {self.unit}"
        return f"{'≥' if self.higher_is_better else '≤'} {self.target:g}×"

    def ratio_text(self, value: float | None = None) -> str:
        v = self.ratio if value is None else value
        if math.isnan(v):
            return "-"
        return f"{v:+.1f} {self.unit}" if self.delta else f"{v:.2f}×"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit in ("ms", "MB"):
        return f"{value:,.1f} {unit}"
    if value >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:,.2f} {unit}"


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@contextmanager
def tempdir(prefix: str = "settled-bench-") -> Iterator[str]:
    """A temporary folder that is removed whatever happens (1M-row ledgers live here)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


def durability_line(path: str) -> str:
    """The pragmas a real settled ledger runs with, read back from the connection."""
    from settled import Ledger

    with Ledger.open(path) as led:
        journal = led.conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = led.conn.execute("PRAGMA synchronous").fetchone()[0]
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={journal}, synchronous={names.get(sync, sync)}"


def machine_line(durability: str) -> str:
    import typer

    return (
        f"{os.cpu_count()} CPUs ({platform.machine()}), {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}; SQLite "
        f"{sqlite3.sqlite_version}; typer {getattr(typer, '__version__', '?')}; ledger "
        f"{durability}"
    )


def rss_mb_self() -> float:
    """Peak resident set of this process in MB.

    Read from /proc (VmHWM), which belongs to this program alone: on Linux,
    getrusage's ru_maxrss survives fork and exec, so a child started by a large
    parent would report the parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / (1024 * 1024)
