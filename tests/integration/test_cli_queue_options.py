"""queue's filters and orders as real processes on both backends: --since, --match
(text, never a pattern), --delivery, --sort and --reverse, -o name, --no-headers, the
--limit note in another order, their one-line errors, and --watch redrawing in a real
terminal until Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
from invariants import dump
from ledger_rows import add
from support import run_cli
from tmux import Terminal, tmux_available

from settled import Ledger
from settled.clock import to_text, utcnow
from settled.model import EventKind, Status
from settled.storage import Move


def ids(*args: str) -> list[str]:
    out = run_cli("queue", *args, "-o", "name")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def set_fields(led: Ledger, aid: str, **values: Any) -> None:
    rec = led.get(aid)
    assert led.move(Move(aid, rec.status, rec.status, to_text(utcnow()), "t", None, values=values))


@pytest.fixture
def queue(db_path: Any) -> Any:
    """Six unresolved records an hour to a minute old, with different reasons and
    deliveries, and one whose provider's last words are in an event."""
    with Ledger.open(db_path) as led:
        for aid, age, provider, reason in [
            (
                "old-503",
                3600,
                "mail",
                "outcome unknown (HTTP 503): busy; reconciliation will query",
            ),
            ("old-pct", 3000, "mail", "carrier said 100% of_the time"),
            ("mid-lag", 1200, "sim", "verification budget spent after 3 check(s); last: not_yet"),
            ("mid-lag2", 900, "sim", "verification budget spent after 5 check(s); last: not_yet"),
            ("new-Reset", 120, "sim", "outcome unknown: ConnectionReset after send"),
            ("new-quiet", 60, "hooks", "blind operation: nothing can observe the effect"),
        ]:
            add(led, aid, provider=provider, operation="send", age=age, reason=reason)
        set_fields(led, "old-503", delivery="DELIVERED")
        set_fields(led, "mid-lag", delivery="DELIVERED", checks=3)
        set_fields(led, "mid-lag2", checks=5)
        rec = led.get("new-quiet")
        led.move(
            Move(
                "new-quiet",
                rec.status,
                rec.status,
                to_text(utcnow()),
                "t",
                EventKind.NOTE,
                detail={"detail": "X-Upstream: Gateway TIMEOUT", "reason": "late"},
            )
        )
        add(led, "settled", provider="sim", operation="send", status=Status.IN_FLIGHT, age=30)
    return db_path


def test_since_and_older_than_window_the_creation_time(queue: Any) -> None:
    assert ids("--since", "30m") == ["mid-lag", "mid-lag2", "new-Reset", "new-quiet"]
    assert ids("--since", "30m", "--older-than", "5m") == ["mid-lag", "mid-lag2"]
    assert ids("--since", "18m") == ["mid-lag2", "new-Reset", "new-quiet"]
    assert ids("--since", "0s") == []


def test_match_is_text_in_any_case_never_a_pattern(queue: Any) -> None:
    assert ids("--match", "http 503") == ["old-503"]
    assert ids("--match", "BUDGET SPENT") == ["mid-lag", "mid-lag2"]
    assert ids("--match", "gateway timeout") == ["new-quiet"]  # the provider's last words
    assert ids("--match", "100%") == ["old-pct"]
    assert ids("--match", "of_the") == ["old-pct"]
    assert ids("--match", "%") == ["old-pct"]
    assert ids("--match", "_") == ["old-pct", "mid-lag", "mid-lag2"]  # of_the, not_yet
    assert ids("--match", "o%t") == [] and ids("--match", "c_rrier") == []
    assert ids("--match", "' OR 1=1 --") == []


def test_delivery_sort_and_reverse(queue: Any) -> None:
    assert ids("--delivery", "delivered") == ["old-503", "mid-lag"]
    assert ids("--delivery", "UNKNOWN,delivered", "--status", "all") == [
        "old-503",
        "old-pct",
        "mid-lag",
        "mid-lag2",
        "new-Reset",
        "new-quiet",
    ]
    assert ids("--delivery", "PENDING", "--status", "all") == ["settled"]  # claimed by hand
    assert ids("--delivery", "PENDING") == []  # and not unresolved
    assert ids("--sort", "age", "--limit", "2") == ["new-quiet", "new-Reset"]  # the newest
    assert ids("--reverse", "--limit", "2") == ["new-quiet", "new-Reset"]
    assert ids("--sort", "checks", "--reverse", "--limit", "2") == ["mid-lag2", "mid-lag"]
    assert ids("--sort", "provider") == [
        "new-quiet",
        "old-503",
        "old-pct",
        "mid-lag",
        "mid-lag2",
        "new-Reset",
    ]
    assert ids("--sort", "action_id") == sorted(ids())  # code point order: "new-R" < "new-q"
    assert ids("--sort", "status", "--status", "all")[0] == "settled"  # IN_FLIGHT first
    rows = json.loads(run_cli("queue", "--sort", "created_at", "--reverse", "--json").stdout)
    assert [r["action_id"] for r in rows] == list(reversed(ids()))


def test_tsv_without_headers_and_the_limit_note(queue: Any) -> None:
    with_header = run_cli("queue", "-o", "tsv").stdout.splitlines()
    bare = run_cli("queue", "-o", "tsv", "--no-headers").stdout.splitlines()
    assert with_header[0].startswith("action\t") and bare == with_header[1:]
    assert (
        run_cli("queue", "-o", "name", "--no-headers").stdout
        == run_cli("queue", "-o", "name").stdout
    )
    note = run_cli("queue", "--sort", "age", "--limit", "2", "-o", "name")
    assert "showing the first 2 of 6 (by age); raise --limit" in note.stderr
    assert "showing the oldest 2 of 6" in run_cli("queue", "--limit", "2").stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--delivery", "LOST"), "--delivery LOST: unknown delivery; use one of PENDING"),
        (("--sort", "params"), "--sort params: use one of created_at"),
        (("--match", "  "), "--match needs some text"),
        (("--match", "x" * 1001), "--match is longer than 1000"),
        (("--since", "yesterday"), "bad duration"),
        (("--no-headers", "--json"), "--no-headers applies to -o tsv"),
        (("--watch",), "--watch redraws a table on a terminal"),
        (("--watch", "--fail-if-any", "-o", "table"), "--fail-if-any is for one look"),
        (("-o", "yaml"), "use one of table, wide, tsv, json, name"),
    ],
)
def test_bad_options_are_one_line_errors_and_change_nothing(
    queue: Any, args: tuple[str, ...], needle: str
) -> None:
    before = dump(queue)
    out = run_cli("queue", *args)
    assert out.returncode == 1, out.stderr
    assert needle in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert dump(queue) == before


@pytest.mark.skipif(not tmux_available(), reason="tmux is not installed")
@pytest.mark.parametrize("stop", ["C-c", "SIGTERM"])
def test_watch_redraws_until_stopped(queue: Any, stop: str) -> None:
    env = {"SETTLED_DB": os.environ["SETTLED_DB"], "SETTLED_CONFIG": os.environ["SETTLED_CONFIG"]}
    with Terminal(["queue", "--watch", "--interval", "0.2", "--status", "all"], env=env) as term:
        first = term.wait_for("new-quiet")  # the first draw, to its last row
        assert "every 0.2s: settled queue" in first and "brand-new" not in first
        with Ledger.open(queue) as led:  # a change made meanwhile shows in a later redraw
            add(led, "brand-new", provider="sim", operation="send")
        term.wait_for("brand-new")
        if stop == "C-c":
            term.send("C-c")
        else:
            os.kill(term.pid(), signal.SIGTERM)
        end = term.wait_for("__settled_done__")
        assert "__settled_done__0" in end, end  # stopping a watch is how it ends: exit 0
        assert "Traceback" not in end
