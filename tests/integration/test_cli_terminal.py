"""How listings look in a real terminal (tmux) at 80 and 200 columns: ids whole,
no word broken, columns giving way in the stated order, data never taken for
markup or escapes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ledger_rows import add
from support import sim_conf, write_config
from tmux import exit_code, run_in_terminal, screen_lines, tmux_available

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer

pytestmark = [
    pytest.mark.skipif(not tmux_available(), reason="tmux is not installed"),
    pytest.mark.ledger_incidental,
    pytest.mark.slow,
]

WORDS = (
    "verification budget spent after six checks last answer reconcilable unknown "
    "connection refused by the provider while the carrier said nothing yet"
).split()


def reason(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(6 + i * 3))


IDS = [f"hooks-send-{i:03d}-" + "x" * (i * 3) for i in range(10)]
PROVIDERS = ["mail", "billing-eu-west-1-production"]


@pytest.fixture
def filled(db_path: Path) -> list[str]:
    with Ledger.open(db_path) as led:
        for i, aid in enumerate(IDS):
            add(
                led,
                aid,
                provider=PROVIDERS[i % 2],
                operation="send",
                reason=reason(i),
                tier="reconcilable",
                age=90 * i,
                status=Status.DENIED_UNRESOLVED if i % 3 else Status.AWAITING_VERIFICATION,
            )
    return IDS


def allowed_tokens() -> set[str]:
    heads = "action status age operation tier att next cause why why: queue: created check".split()
    values = [
        "DENIED_UNRESOLVED",
        "AWAITING_VERIFICATION",
        "DENIED_UNRESOLVED,",
        "AWAITING_VERIFICATION,",
        "reconcilable",
        "needs",
        "a",
        "person",
        "auto-check",
        "due",
        "in",
        "being",
        "checked",
        "settled",
        "reconcile",  # the short hint of a queryable record whose checks are over
        "-",
        *IDS,
    ]
    values += [f"{p}/send" for p in PROVIDERS]
    return set(WORDS) | set(heads) | set(values) | {"1"}


def check_tokens(lines: list[str]) -> None:
    ok = allowed_tokens()
    for line in lines:
        for tok in line.split():
            if tok in ok or re.fullmatch(r"\(\d+\)|\d+[smhd]|in|\d+", tok):
                continue
            if tok.endswith("…") and (tok[:-1] in ok or tok == "…"):
                continue
            if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", tok):
                continue
            raise AssertionError(f"broken or unknown word {tok!r} in line {line!r}")


@pytest.mark.parametrize("width", [80, 200])
def test_queue_fits_the_terminal_with_ids_whole(filled: list[str], width: int) -> None:
    screen = run_in_terminal(
        ["queue", "--status", "DENIED_UNRESOLVED,AWAITING_VERIFICATION"], width=width
    )
    assert exit_code(screen) == 0, screen
    lines = screen_lines(screen)
    assert all(len(line) <= width for line in lines)
    for aid in filled:
        assert any(re.search(rf"(^|\s){re.escape(aid)}(\s|$)", line) for line in lines), (
            aid,
            screen,
        )
    check_tokens(lines)
    head = next(line for line in lines if line.startswith("action"))
    assert "status" in head
    if width == 200:
        assert all(
            col in head.split() for col in ("age", "operation", "tier", "att", "next", "why")
        ), screen
    else:  # the stated order: att, tier, operation, age, next give way; why goes beneath
        assert "att" not in head.split() and "why" not in head.split()
        assert sum(line.startswith("    why: ") for line in lines) == len(filled)


@pytest.mark.parametrize("width", [80, 200])
def test_show_and_providers_never_break_words(
    filled: list[str], width: int, tmp_path: Path, sim: SimServer
) -> None:
    write_config(tmp_path / "settled.toml", {"mail": sim_conf(sim)})
    screen = run_in_terminal(["show", IDS[8]], width=width)
    assert exit_code(screen) == 0, screen
    text = "\n".join(screen_lines(screen))
    assert "DENIED_UNRESOLVED" in text and "reconcilable" in text
    assert IDS[8] in text and "Z (" in text  # ISO times with their zone
    screen = run_in_terminal(["providers"], width=width)
    assert exit_code(screen) == 0, screen
    words = " ".join(screen_lines(screen)).split()
    assert "reconcilable" in words and "reconci" not in words


@pytest.mark.parametrize("width", [80, 200])
def test_hostile_ids_and_reasons_reach_the_screen_as_written(db_path: Path, width: int) -> None:
    with Ledger.open(db_path) as led:
        add(led, "x[/]", reason="[ops] carrier confirmed")
        add(led, "[reverse]boom", reason="500 body: \x1b[1A\x1b[2KCONFIRMED")
        add(led, "evil\u202eright", reason="bell\x07 and nul\x00")
    screen = run_in_terminal(["queue"], width=width)
    assert exit_code(screen) == 0, screen
    text = "\n".join(screen_lines(screen))
    for shown in (
        "x[/]",
        "[ops] carrier confirmed",
        "[reverse]boom",
        "\\x1b[1A\\x1b[2KCONFIRMED",
        "evil\\u202eright",
        "bell\\x07 and nul\\x00",
    ):
        assert shown in text, (shown, text)
    screen = run_in_terminal(["show", "[reverse]boom"], width=width)
    assert exit_code(screen) == 0
    lines = screen_lines(screen)
    assert lines[0].startswith("[reverse]boom  DENIED_UNRESOLVED"), lines[:3]
