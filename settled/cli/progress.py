"""Progress for long work (a reconcile pass, a bulk resolve): a rich progress bar on
stderr, only when stderr is a terminal; lines of results keep going to stdout."""

from __future__ import annotations

import sys
from typing import Any

from .render import console, is_tty


class Progress:
    """``advance()`` once per item; ``line(renderable)`` prints a result on stdout
    without tearing the bar (the bar is lifted while the line is written)."""

    def __init__(self, label: str, total: int | None, *, enabled: bool = True) -> None:
        self._out: Any = None  # stdout's console, made by the first line (rich loads then)
        self._bar: Any = None
        self._task: Any = None
        if enabled and is_tty(sys.stderr):
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task(label, total=total)
        self._shared = self._bar is not None and is_tty(sys.stdout)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    @property
    def out(self) -> Any:
        if self._out is None:
            self._out = console()
        return self._out

    def line(self, renderable: Any) -> None:
        if self._shared:  # one terminal for both streams: lift the bar, print, put it back
            self._bar.stop()
            self.out.print(renderable)
            self._bar.start()
        else:
            self.out.print(renderable)
