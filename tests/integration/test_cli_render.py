"""Rule 13 in every human view: stored and external text is data. Hostile text
(markup, escapes, bidi, NUL, very long) goes through every renderer; nothing is
interpreted, nothing invisible reaches the terminal, and nothing crashes."""

from __future__ import annotations

import io
import json
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_rows import add

from settled import Ledger, display
from settled.cli import render
from settled.clock import utcnow
from settled.reconcile import Change
from settled.selection import Target

pytestmark = pytest.mark.ledger_incidental

MARKUP = [
    "[/]",
    "[bold]",
    "[/bold]",
    "[ops]",
    "[reverse]boom",
    "[link=http://x]y[/link]",
    ":smile:",
    "[[",
    "]]",
    "\\[x]",
    "[",
    "]",
]
ESCAPES = [
    "\x1b[2J",
    "\x1b[1A\x1b[2K",
    "\x1b]8;;http://evil\x07",
    "\x07",
    "\x00",
    "\r",
    "\b",
    "\x7f",
    "\x9b",
    "\u202e",
    "\u2066",
    "\u200f",
    "\u200b",
    "\ufeff",
    "\U000e0041",
    "\t",
    "\n",
    "\u2028",
]

hostile = st.lists(
    st.one_of(
        st.sampled_from(MARKUP),
        st.sampled_from(ESCAPES),
        st.text(max_size=20),
        st.text(alphabet="abc ", min_size=200, max_size=2000),
    ),
    min_size=1,
    max_size=8,
).map("".join)


def unsafe(ch: str) -> bool:
    """A character that must never reach a terminal from data (a tab only as the TSV
    separator: the TSV test counts fields)."""
    return ch not in "\n\t" and not ch.isprintable() and unicodedata.category(ch) != "Zs"


def assert_safe(out: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in out if unsafe(c)})
    assert not bad, bad


class Rec:
    """Just enough of an ActionRecord for the renderers."""

    def __init__(self, s: str) -> None:
        self.action_id = s[:200] or "x"
        self.provider, self.operation = s[:30] or "p", s[-30:] or "o"
        self.tier, self.status, self.attempt = "blind", "DENIED_UNRESOLVED", 1
        self.reason, self.requires_manual_verification = s, True
        self.created_at = self.updated_at = self.dispatched_at = "2026-01-01T00:00:00.000000Z"
        self.next_check_at = self.lease_expires_at = self.eligible_at = None
        self.confirmed_at, self.confirmed_by, self.lease_owner = None, s, None
        self.params = {s: s, "nested": [s]}
        self.idempotency_key, self.reconciliation_key, self.provider_object_id = s, s, s
        self.delivery = self.acceptance = "UNKNOWN"
        self.verify_deadline_at, self.checks, self.terminal = None, 0, False


class Ev:
    def __init__(self, s: str) -> None:
        self.id, self.at, self.actor, self.kind = 1, "2026-01-01T00:00:00.000000Z", s, "resolved"
        self.from_status, self.to_status = "DENIED_UNRESOLVED", "CONFIRMED"
        self.detail = {"reason": s, "evidence": s, "object_id": s, "by": s}


@pytest.fixture(autouse=True)
def _fresh_session() -> Iterator[None]:
    """Renderers read the config through the CLI's session: leave none behind."""
    from settled.cli.common import STATE

    yield
    STATE.close()


def capture(fn: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    fn()
    return out.getvalue() + err.getvalue()


def every_renderer(s: str, width: int) -> list[Any]:
    from rich.console import Console

    from settled.cli import (
        providers_cmd,
        reconcile_cmd,
        resolve_cmd,
        select,
        sent,
        show_cmd,
        table_columns,
    )
    from settled.dispatch import Outcome, Report, Result

    rec, ev = Rec(s), Ev(s)
    now = utcnow()
    con = Console(file=io.StringIO(), width=width, markup=False, emoji=False, highlight=False)
    change = Change(
        s or "x",
        "AWAITING_VERIFICATION",
        "DENIED_UNRESOLVED",
        "unresolved",
        s,
        provider=s,
        operation=s,
    )
    report = Report(Outcome.DISPATCHED, rec, Result.UNRESOLVED, s)  # type: ignore[arg-type]
    return [
        lambda: show_cmd.render_show(rec, [ev], now),
        lambda: (
            render.table(
                table_columns.queue_columns(now, ["DENIED_UNRESOLVED", "FAILED"]),
                [rec],
                title=s,
                out=con,
            )
            or print(con.file.getvalue())
        ),
        lambda: (
            render.listing(table_columns.tsv_columns(), [rec], "tsv")
            or print(
                "ok"
                if all(line.count("\t") == 9 for line in sys.stdout.getvalue().splitlines())
                else "\x00 TSV fields off"
            )
        ),
        lambda: sent.render_report(report),
        lambda: resolve_cmd.render_record(rec, s),
        lambda: render.console().print(reconcile_cmd.change_line(change)),
        lambda: select.preview(
            [Target(s or "x", rec), Target(s or "y", None, s)],
            title=s,
            becomes=lambda t: s,
            now=now,
        ),
        lambda: render.console().print(render.text(sent.waiting_for(rec, now, 5.0))),
        lambda: render.console().print(render.text(display.event_detail(ev))),
        lambda: (
            render.table(providers_cmd.PROVIDER_COLS, [provider_row(s)], title=s, out=con)
            or print(con.file.getvalue())
        ),
        lambda: providers_cmd.render_audit(audit_of(s)),
    ]


def provider_row(s: str) -> dict[str, Any]:
    return {
        "provider": s,
        "operation": s,
        "tier": "blind",
        "consistency_window": 1.0,
        "attempts": 1,
        "timeout": 1.0,
        "dedupes_keys": False,
        "verifies": s,
    }


def audit_of(s: str) -> Any:
    """An audit of a ledger whose provider and operation names and reasons are ``s``."""
    from settled.audit import audit

    with Ledger.open(":memory:") as led:
        add(led, "a-1", provider=s or "p", operation=s or "o", reason=s)
        return audit(led, {})


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(s=hostile, width=st.sampled_from([40, 80, 200]))
def test_hostile_text_through_every_human_renderer(
    s: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for fn in every_renderer(s, width):
        out = capture(fn, monkeypatch)
        assert_safe(out)


@pytest.mark.parametrize(
    "s", ["[/]", "[ops] carrier confirmed", "[reverse]boom", ":smile:", "[bold red]x[/bold red]"]
)
def test_markup_is_shown_as_written(s: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Rec(s)
    out = capture(lambda: render.console().print(render.text(rec.reason)), monkeypatch)
    assert out.strip() == s


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("\u202eevil", "\\u202eevil"),
        ("nul\x00", "nul\\x00"),
        ("tab\tnl\n", "tab\\tnl\\n"),
        ("\U000e0041", "\\U000e0041"),
        ("plain café", "plain café"),
    ],
)
def test_term_writes_out_what_a_terminal_would_obey(raw: str, shown: str) -> None:
    assert display.term(raw) == shown


def test_term_cuts_very_long_text_and_says_so() -> None:
    out = display.term("word " * 10_000)
    assert len(out) < 2100 and out.endswith("more characters; see --json)")


# -- through the real command line, on a pipe ----------------------------------------


@pytest.fixture
def hostile_ledger(db_path: Path) -> dict[str, str]:
    ids = {
        "close": "x[/]",
        "reverse": "[reverse]boom",
        "bidi": "evil\u202eright-to-left",
        "long": "hooks-send-" + "a" * 96,
        "cursor": "cursor\x1b[2J\x1b[Hmove",
        "ops": "ops-1",
    }
    with Ledger.open(db_path) as led:
        for key, aid in ids.items():
            add(
                led,
                aid,
                reason="[ops] carrier confirmed"
                if key == "ops"
                else "500 body: \x1b[1A\x1b[2KCONFIRMED \x00 [/]",
                params={"to": "[bold]x[/]", "password": "hunter2"},
            )
    return ids


def test_queue_show_and_json_on_a_pipe(hostile_ledger: dict[str, str]) -> None:
    from support import run_cli

    out = run_cli("queue")
    assert out.returncode == 0, out.stderr
    assert_safe(out.stdout)
    lines = out.stdout.splitlines()
    assert lines[0].split("\t")[0] == "action" and len(lines) == 1 + len(hostile_ledger)
    assert not set("─│┃━┏┓└┘╭╮╰╯") & set(out.stdout)
    firsts = [line.split("\t")[0] for line in lines[1:]]
    assert "x[/]" in firsts and "[reverse]boom" in firsts and "hooks-send-" + "a" * 96 in firsts
    assert "evil\\u202eright-to-left" in firsts and "cursor\\x1b[2J\\x1b[Hmove" in firsts
    assert "[ops] carrier confirmed" in out.stdout
    for aid in ("x[/]", "[reverse]boom"):
        show = run_cli("show", aid)
        assert show.returncode == 0, show.stderr
        assert_safe(show.stdout)
        assert show.stdout.startswith(aid) and "hunter2" not in show.stdout
        assert "\\x1b[1A\\x1b[2KCONFIRMED \\x00 [/]" in show.stdout
    data = json.loads(run_cli("queue", "--json").stdout)
    assert {r["action_id"] for r in data} == set(hostile_ledger.values())  # JSON stays exact
    assert any(r["reason"] == "500 body: \x1b[1A\x1b[2KCONFIRMED \x00 [/]" for r in data)


def test_a_contradicted_record_is_flagged_in_show_and_queue(db_path: Path) -> None:
    from support import run_cli

    from settled.model import EventKind, Status
    from settled.storage import Move

    with Ledger.open(db_path) as led:
        add(led, "late-1", status=Status.FAILED, reason="reconciliation proved the effect absent")
        led.move(
            Move(
                "late-1",
                Status.FAILED,
                Status.FAILED,
                "2026-01-01T00:00:00.000000Z",
                "t",
                EventKind.NOTE,
                values={"contradiction": "a late reply says it applied"},
            )
        )
    show = run_cli("show", "late-1")
    assert "CONTRADICTED" in show.stdout and "a late reply says it applied" in show.stdout
    assert "retry is blocked" in show.stdout
    row = run_cli("queue", "--status", "FAILED").stdout.splitlines()[1].split("\t")
    assert row[-1].startswith("CONTRADICTED: a late reply says it applied")
    assert "contradicted" in row[-2]
