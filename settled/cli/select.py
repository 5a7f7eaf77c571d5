"""Choosing the records a command acts on, for every command that acts on many: ids as
arguments, ids on stdin (``-``), or selectors; then, for a command that changes state,
a preview of what it would do to each and the question before it does anything.

    ids = read_ids(action_ids)                      # "-" → the lines of stdin
    sel = Selectors(provider, operation, status, older_than)
    targets = plan(ledger, ids, sel, now, why_not)  # each record, and why it is left alone
    preview(targets, title, becomes, now)           # a table on a terminal, TSV on a pipe
    if todo and not yes and not confirm(len(todo), ...): ...

The rules, the same for ``resolve`` and ``reconcile`` (and any command that adopts it):

- Ids on stdin come one a line; a line cut from ``queue -o tsv`` (or the whole line) is
  read up to its first TAB, and the header line of that TSV (its first field is
  ``action``, or ``action_id``) is skipped, never read as an id. Blank lines are ignored, repeats dropped.
- Named ids (as arguments or on stdin) are the only candidates: selectors given with
  them only narrow them (a named record they do not select is skipped, and says so).
  Ids read from an empty stdin select nothing, never "everything".
- Without ids, the selectors select: ``--status`` (default: the command's; a comma
  list, or ``all``), ``--provider``, ``--operation``, ``--older-than`` and ``--since``
  (creation time), ``--match``, ``--search``, ``--cause`` and ``--delivery``: the
  selectors of ``settled queue``, each parsed by ``settled.selection`` into the same
  ``Selection`` fields. A selector only narrows: ``--search`` keeps the command's
  default statuses (``queue`` widens to all for it; a command that changes state does
  not). An unknown provider or operation name is an error listing the real ones; any
  other bad value is one line, exit 1, before anything is done.
- A command that changes state by selectors, or by ids from stdin, asks on a
  terminal; without one it refuses unless ``--yes`` (nobody would be asked).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..selection import Target

STDIN = "-"
ID_HEAD = "action"  # the id column's name in `settled queue -o tsv`
MAX_STDIN = 16 * 1024 * 1024  # bytes of ids read from stdin


@dataclass(frozen=True)
class Ids:
    """The ids a command was given, in order, without repeats."""

    ids: list[str]
    from_stdin: bool  # ``-`` was among the arguments (even if stdin held no id)

    @property
    def given(self) -> bool:
        return bool(self.ids) or self.from_stdin


@dataclass(frozen=True)
class Selectors:
    """The selectors as given (text, None when absent); ``check`` parses them."""

    provider: str | None = None
    operation: str | None = None
    status: str | None = None
    older_than: str | None = None
    since: str | None = None
    match: str | None = None
    search: str | None = None
    cause: str | None = None
    delivery: str | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in vars(self).values())

    def check(self) -> Selectors:
        """These selectors, once each value parses (``InvalidInput``, one line naming
        the option, before the ledger is opened); the names of providers and
        operations are checked against the ledger by ``selection``."""
        self.parsed()
        return self

    def parsed(self) -> dict[str, Any]:
        """Each given value as ``settled.selection`` parses it for ``queue``."""
        from ..selection import (
            parse_causes,
            parse_deliveries,
            parse_duration,
            parse_match,
            parse_search,
            parse_statuses,
        )

        def opt(value: str | None, parse: Callable[[str], Any]) -> Any:
            return None if value is None else parse(value)

        return {
            "statuses": opt(self.status, parse_statuses),
            "older_than": opt(self.older_than, parse_duration),
            "since": opt(self.since, parse_duration),
            "match": opt(self.match, parse_match),
            "search": opt(self.search, parse_search),
            "causes": opt(self.cause, parse_causes),
            "delivery": opt(self.delivery, parse_deliveries),
        }


def ids_from_lines(lines: Sequence[str]) -> list[str]:
    """The ids in lines of text (see the module's rules), unchecked."""
    out: list[str] = []
    first = True
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        field = line.split("\t", 1)[0].strip()
        if first and field in (ID_HEAD, "action_id"):
            first = False
            continue  # the header of `settled queue -o tsv`
        first = False
        if field:
            out.append(field)
    return out


def read_ids(args: Sequence[str] | None, stdin: Any = None) -> Ids:
    """The ids given, with ``-`` replaced by the ids on stdin; each checked as an
    action id (one bad line is an error, exit 1, before anything is done)."""
    from .inputs import check_id

    out: list[str] = []
    from_stdin = False
    for a in args or ():
        if a != STDIN:
            out.append(a)
        elif not from_stdin:
            from_stdin = True
            stream = stdin if stdin is not None else sys.stdin
            out += ids_from_lines(stream.read(MAX_STDIN).splitlines())
    for a in out:
        check_id(a)
    return Ids(list(dict.fromkeys(out)), from_stdin)


def selection(ledger: Any, selectors: Selectors, now: datetime, default: Sequence[str]) -> Any:
    """The ``Selection`` the selectors make (``default`` statuses without --status),
    after checking the names they use."""
    from ..clock import plus, to_text
    from ..storage.ledger import Selection
    from .common import check_filters

    v = selectors.parsed()
    check_filters(ledger, selectors.provider, selectors.operation)

    def ago(seconds: float | None) -> str | None:
        return None if seconds is None else to_text(plus(now, -seconds))

    return Selection(
        statuses=v["statuses"] or list(default),
        provider=selectors.provider,
        operation=selectors.operation,
        created_before=ago(v["older_than"]),
        created_after=ago(v["since"]),
        delivery=v["delivery"],
        match=v["match"],
        search=v["search"],
        causes=v["causes"],
    )


def plan(
    ledger: Any,
    ids: Ids,
    selectors: Selectors,
    now: datetime,
    why_not: Callable[[Any], str],
    *,
    default: Sequence[str],
    limit: int | None = None,
) -> list[Target]:
    """Each named or selected action, with ``why_not(record)`` ("" when the command
    acts on it). Named ids come in the order given; a selection comes oldest first,
    at most ``limit`` of it."""
    from dataclasses import replace

    sel = selection(ledger, selectors, now, default)
    if not ids.given:
        rows = ledger.records(replace(sel, limit=limit))
        return [Target(r.action_id, r, why_not(r)) for r in rows]
    wanted: set[str] | None = None
    if selectors.given:  # in slices: a statement binds a bounded number of values
        wanted = set()
        for i in range(0, len(ids.ids), 500):
            wanted |= {r.action_id for r in ledger.records(replace(sel, ids=ids.ids[i : i + 500]))}
    out: list[Target] = []
    for a in ids.ids:
        rec = ledger.find(a)
        if rec is None:
            out.append(Target(a, None, "not found"))
        elif wanted is not None and a not in wanted:
            out.append(Target(a, rec, "not selected by the filters"))
        else:
            out.append(Target(a, rec, why_not(rec)))
    return out


def preview(
    targets: Sequence[Target],
    *,
    title: str,
    becomes: Callable[[Target], str],
    now: datetime,
    err: bool = False,
) -> bool:
    """What the command would do to each target: a table on a terminal, TSV on a pipe
    (on stderr with ``err``, when stdout carries JSON). True when a value it shows
    holds a character it writes out escaped (rule 13): the title says so, and so must
    the question that follows (``confirm(note=...)``)."""
    from ..display import HIDDEN_NOTE, ago, hidden, one_line
    from .render import Col, console, is_tty, listing, text

    stream = sys.stderr if err else sys.stdout

    def cell(t: Target, what: Callable[[Any], str]) -> str:
        return what(t.record) if t.record is not None else "-"

    cols = [
        Col(ID_HEAD, lambda t: t.action_id),
        Col("status", lambda t: cell(t, lambda r: str(r.status)), give_way=3),
        Col("age", lambda t: cell(t, lambda r: ago(r.created_at, now)), give_way=1, right=True),
        Col("operation", lambda t: cell(t, lambda r: f"{r.provider}/{r.operation}"), give_way=2),
        Col("becomes", lambda t: becomes(t) if not t.skip else "(skipped)"),
        Col("why", lambda t: t.skip or one_line(cell(t, lambda r: r.reason or "")), flex=True),
    ]
    fmt = "table" if is_tty(stream) else "tsv"
    note = any(hidden(c.cell(t)) for t in targets for c in cols)
    if note:
        title += f" {HIDDEN_NOTE}"
        if fmt == "tsv":  # lines without a title: the note goes with the messages
            console(stderr=True).print(text(f"settled: the preview {HIDDEN_NOTE[1:-1]}"))
    listing(cols, targets, fmt, title=title, err=err)
    return note


def confirm(n: int, *, question: str, doing: str, asked: bool, note: bool = False) -> bool:
    """True once a person at the terminal said yes. With ids on stdin (``asked``
    false) or no terminal, nobody can be asked: refused (exit 1), never assumed.
    ``note``: the preview wrote out hidden characters, and the question says so."""
    import click

    from ..display import HIDDEN_NOTE
    from ..errors import InvalidInput
    from .render import is_tty

    if not asked or not is_tty(sys.stdin):
        raise InvalidInput(
            f"refusing to {doing} {n} action(s) without --yes: there is no terminal "
            "to ask (review with --dry-run, then add --yes)"
        )
    if note:  # the person answers about what the preview showed: say what it escaped
        question += f" {HIDDEN_NOTE}"
    return bool(click.confirm(question, default=False, err=True))


__all__ = [
    "ID_HEAD",
    "STDIN",
    "Ids",
    "Selectors",
    "Target",
    "confirm",
    "ids_from_lines",
    "plan",
    "preview",
    "read_ids",
    "selection",
]


NOT_FOUND = "not found"


def skipped_code(why: str) -> int:
    """The exit code of a target skipped before anything was done: 6 not found, else 7."""
    from .common import EXIT_CONFLICT, EXIT_NOT_FOUND

    return EXIT_NOT_FOUND if why == NOT_FOUND else EXIT_CONFLICT


def report_skipped(done: list[Target]) -> None:
    from .render import say

    for t in done:
        if t.skip:
            say(f"  {t.action_id}: {t.skip}")
