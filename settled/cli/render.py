"""What reaches a person's terminal, built in one place (rule 13 in docs/rules.md).

- ``term(text)`` is the one sanitizer: stored and external text (ids, reasons,
  provider bodies, ``--by``) is shown with control, escape, bidi and other invisible
  format characters written out as ``\\x1b``, ``\\u202e``…, never interpreted.
- ``text(...)`` builds a ``rich.text.Text`` from sanitized strings: rich never
  parses data as markup, and every console here has markup, emoji and highlighting
  off as a second guard.
- ``Columns`` lays out listings: a table on a terminal that fits its width (ids are
  never cut; ``why`` wraps at word boundaries; other columns give way in a stated
  order), and plain tab-separated lines with a header on a pipe (``-o tsv``).

JSON output never passes through here: it stays exact.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..display import ago, hidden, iso, span, term


def tsv_cell(value: object) -> str:
    """One TSV field: sanitized (tabs and newlines written out), never cut."""
    return term(value, limit=None)


def text(*parts: object, style: str | None = None) -> Any:
    """A rich Text from plain parts; a part may be a ``(string, style)`` pair."""
    from rich.text import Text

    out = Text(style=style or "")
    for p in parts:
        if isinstance(p, tuple):
            out.append(term(p[0]), style=p[1] or None)
        else:
            out.append(term(p))
    return out


def is_tty(stream: Any = None) -> bool:
    s = stream or sys.stdout
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


def console(stderr: bool = False, *, width: int | None = None) -> Any:
    """A console that never interprets data: no markup, emoji or highlighting. Colour
    follows NO_COLOR and whether the stream is a terminal. Off a terminal, lines are
    not folded (``soft_wrap``)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = is_tty(stream)
    if width is None and not tty:
        width = PIPE_WIDTH
    return _console_class()(
        file=stream,
        markup=False,
        emoji=False,
        highlight=False,
        width=width,
        soft_wrap=not tty,
        no_color=bool(os.environ.get("NO_COLOR")) or None,
    )


def say(line: str) -> None:
    """One line for a person on stderr (what a command did or left alone)."""
    console(stderr=True).print(text(line))


PIPE_WIDTH = 100_000  # off a terminal nothing is folded: one logical line is one line
_CONSOLE: list[type] = []


def _console_class() -> Any:
    """rich's Console, except that a closed stream is an error for the command to
    handle (rich's own answer is ``SystemExit(1)``, which would hide a sent request's
    exit code; see ``common.finish``)."""
    if not _CONSOLE:
        import errno

        from rich.console import Console

        class PipeAwareConsole(Console):
            def on_broken_pipe(self) -> None:
                self.quiet = True  # nothing more is written to it
                raise BrokenPipeError(errno.EPIPE, "the reader of this stream went away")

        _CONSOLE.append(PipeAwareConsole)
    return _CONSOLE[0]


def print_trimmed(con: Any, renderable: Any) -> None:
    """Print ``renderable`` without the spaces a grid pads its short cells with: they
    break ``grep ...$`` and wrap into blank lines when a pipe ends in a narrow terminal."""
    with con.capture() as cap:
        con.print(renderable)
    con.file.write("\n".join(line.rstrip(" ") for line in cap.get().split("\n")))
    con.file.flush()


STATUS_STYLE = {
    "CONFIRMED": "green",
    "FAILED": "red",
    "DENIED_UNRESOLVED": "yellow",
    "AWAITING_VERIFICATION": "cyan",
    "IN_FLIGHT": "blue",
    "PENDING": "",
}


def status_text(status: object) -> Any:
    return text((str(status), STATUS_STYLE.get(str(status), "")))


# ------------------------------------------------------------------ times


# ------------------------------------------------------------------ listings

FORMATS = ("table", "wide", "tsv", "json", "name")


@dataclass(frozen=True)
class Col:
    """One column of a listing.

    ``cell(row)`` gives the human cell, ``plain(row)`` the TSV field (default: the
    human cell). ``give_way``: 0 never gives way; otherwise columns leave a table that
    is too wide for the terminal in increasing order. ``flex``: takes the width that
    is left, wrapping at word boundaries (at most ``lines`` lines, then ellipsized at
    a word). ``wide``: only in ``-o wide`` (always in TSV)."""

    head: str
    cell: Callable[[Any], str]
    plain: Callable[[Any], str] | None = None
    give_way: int = 0
    flex: bool = False
    min_width: int = 20
    lines: int = 3
    wide: bool = False
    right: bool = False
    style: Callable[[Any], str] | None = None


GAP = 2  # spaces between columns


def emit_tsv(
    cols: Sequence[Col], rows: Sequence[Any], out: Any = None, *, headers: bool = True
) -> None:
    stream = out or sys.stdout
    lines = ["\t".join(c.head for c in cols)] if headers else []
    for r in rows:
        lines.append("\t".join(tsv_cell((c.plain or c.cell)(r)) for c in cols))
    if lines:
        stream.write("\n".join(lines) + "\n")
    stream.flush()


def fit(cols: Sequence[Col], rows: Sequence[Any], width: int) -> tuple[list[Col], list[int]] | None:
    """Which columns fit in ``width`` and how wide each is; None when even the
    columns that never give way do not fit."""
    from rich.cells import cell_len

    cells = {c.head: [term(c.cell(r)) for r in rows] for c in cols}
    natural = {c.head: max([cell_len(c.head), *(cell_len(v) for v in cells[c.head])]) for c in cols}

    def need(cs: Sequence[Col]) -> int:
        return sum(
            min(natural[c.head], c.min_width) if c.flex else natural[c.head] for c in cs
        ) + GAP * (len(cs) - 1)

    shown = list(cols)
    for c in sorted((c for c in cols if c.give_way), key=lambda c: c.give_way):
        if need(shown) <= width:
            break
        shown.remove(c)
    if need(shown) > width:
        return None
    widths = []
    fixed = sum(natural[c.head] for c in shown if not c.flex) + GAP * (len(shown) - 1)
    for c in shown:
        widths.append(max(min(natural[c.head], width - fixed), 1) if c.flex else natural[c.head])
    return shown, widths


def shorten(value: str, width: int, lines: int) -> str:
    """Cut ``value`` at a word boundary so that it wraps into at most ``lines`` lines
    of ``width`` (approximately: wrapping loses a little at each line end)."""
    budget = max(width * lines - lines * 4, width)
    if len(value) <= budget:
        return value
    cut = value.rfind(" ", 0, budget - 1)
    if cut <= 0:
        cut = budget - 1
    return value[:cut].rstrip() + "…"


def table(
    cols: Sequence[Col],
    rows: Sequence[Any],
    *,
    title: str | None = None,
    wide: bool = False,
    out: Any = None,
) -> None:
    """Print ``rows`` as a table for a terminal (``-o table`` / ``-o wide``)."""
    from rich.cells import cell_len
    from rich.table import Table

    con = out or console()
    cols = [c for c in cols if wide or not c.wide]
    width = con.width
    if wide:  # every column: the terminal folds what is longer than it
        laid = fit(cols, rows, 10**6)
        assert laid is not None
        shown, widths = laid
        total = sum(widths) + GAP * (len(shown) - 1)
        con = console(width=max(total, width)) if out is None else con
    else:
        laid = fit(cols, rows, width)
        if laid is None:
            flex = [c for c in cols if c.flex]
            under = fit([c for c in cols if not c.flex], rows, width)
            if flex and under is not None:
                _rows_with_why_under(*under, flex[0], rows, con, title)
            else:
                _blocks(cols, rows, con, title)
            return
        shown, widths = laid
    t = Table(
        box=None,
        padding=(0, GAP, 0, 0),
        pad_edge=False,
        show_edge=False,
        header_style="bold",
        title=text(title) if title else None,
        title_justify="left",
        expand=False,
    )
    for c, w in zip(shown, widths, strict=True):
        if c.flex:
            t.add_column(text(c.head), width=w, overflow="ellipsis", no_wrap=False)
        else:
            t.add_column(
                text(c.head),
                width=w,
                no_wrap=True,
                overflow="ignore",
                justify="right" if c.right else "left",
            )
    for r in rows:
        cells = []
        for c, w in zip(shown, widths, strict=True):
            value = term(c.cell(r))
            if c.flex:
                value = shorten(value, w, c.lines)
            elif c.right:  # rich does not justify a fixed-width column that ignores overflow
                value = " " * max(0, w - cell_len(value)) + value
            cells.append(text((value, c.style(r) if c.style else "")))
        t.add_row(*cells)
    con.print(t)


def _rows_with_why_under(
    shown: list[Col], widths: list[int], flex: Col, rows: Sequence[Any], con: Any, title: str | None
) -> None:
    """The layout for a terminal too narrow for the flex column beside the others:
    one line per row, and the flex text (why) wrapped beneath it, indented."""
    from rich.cells import cell_len
    from rich.padding import Padding

    def line(cells: list[tuple[str, str]]) -> Any:
        out = text()
        for i, ((value, style), c, w) in enumerate(zip(cells, shown, widths, strict=True)):
            pad = " " * max(0, w - cell_len(value))
            out.append(pad + value if c.right else value, style=style or None)
            if not c.right and i < len(shown) - 1:
                out.append(pad)
            if i < len(shown) - 1:
                out.append(" " * GAP)
        return out

    if title:
        con.print(text(title))
    con.print(line([(c.head, "bold") for c in shown]), no_wrap=True, overflow="ignore", crop=False)
    for r in rows:
        cells = [(term(c.cell(r)), c.style(r) if c.style else "") for c in shown]
        con.print(line(cells), no_wrap=True, overflow="ignore", crop=False)
        why = term(flex.cell(r))
        if why:
            width = max(con.width - 4, 20)
            con.print(
                Padding(
                    text(f"{flex.head}: ", shorten(why, width, flex.lines)),
                    (0, 0, 0, 4),
                    expand=False,
                )
            )


def _blocks(cols: Sequence[Col], rows: Sequence[Any], con: Any, title: str | None) -> None:
    """The layout for a terminal narrower than an id: one block per row, the first
    column (the id) on its own line, whole; the others as 'name  value' under it."""
    from rich.padding import Padding
    from rich.table import Table

    if title:
        con.print(text(title))
    first, rest = cols[0], cols[1:]
    for r in rows:
        con.print(text((first.cell(r), "bold")), no_wrap=True, overflow="ignore", crop=False)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for c in rest:
            value = term(c.cell(r))
            if c.flex:
                value = shorten(value, max(con.width - 14, 20), c.lines)
            grid.add_row(text(c.head), text((value, c.style(r) if c.style else "")))
        con.print(Padding(grid, (0, 0, 0, 2), expand=False))


def listing(
    cols: Sequence[Col],
    rows: Sequence[Any],
    fmt: str,
    *,
    title: str | None = None,
    empty: str = "",
    err: bool = False,
    headers: bool = True,
) -> None:
    """A listing in ``fmt`` (table, wide, tsv or name: the first column only, no
    header); JSON is the caller's. ``err``: on stderr (when stdout carries JSON)."""
    if fmt in ("tsv", "name"):
        shown = cols[:1] if fmt == "name" else cols
        emit_tsv(shown, rows, sys.stderr if err else None, headers=headers and fmt == "tsv")
        return
    con = console(stderr=err)
    if not rows:
        con.print(text(empty or f"{title}: empty"))
        return
    table(cols, rows, title=title, wide=fmt == "wide", out=con if fmt != "wide" or err else None)


def default_format(fmt: str | None, as_json: bool, formats: tuple[str, ...] = FORMATS) -> str:
    """``--json`` is ``-o json``; without ``-o``: a table on a terminal, TSV on a pipe.
    ``formats``: the command's own, when they are not the listings' (``settled log``)."""
    from ..errors import InvalidInput

    if as_json:
        if fmt not in (None, "json"):
            raise InvalidInput(f"--json and -o {fmt} disagree; give one of them")
        return "json"
    if fmt is None:
        return "table" if is_tty() else "tsv"
    f = fmt.strip().lower()
    if f not in formats:
        raise InvalidInput(f"-o {fmt!r}: use one of {', '.join(formats)}")
    return f


__all__ = [
    "FORMATS",
    "STATUS_STYLE",
    "Col",
    "ago",
    "console",
    "default_format",
    "emit_tsv",
    "fit",
    "hidden",
    "is_tty",
    "iso",
    "listing",
    "span",
    "status_text",
    "table",
    "term",
    "text",
]
