"""Rule 13 in every question a person answers: what a person reads before saying yes
is what will be sent. Control, bidi and C1 characters in the params (or anything else
the question shows) are written out escaped, and the question says so; a spoofed
recipient such as ``"evil\\u202e@moc.elpmaxe"`` cannot be rendered as another one.

The MCP question is captured from a real MCP client session over stdio (the SDK's
client, ``settled mcp`` a real process); the Python API asks the same question; the
``[y/N]`` of ``resolve`` is read off a real terminal (tmux).
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from ledger_rows import add
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from support import ROOT, run_cli
from tmux import exit_code, run_in_terminal, tmux_available

import settled
from settled import Ledger
from settled.providers.sim_server import SimServer
from settled.toolbox import HIDDEN_NOTE

pytestmark = pytest.mark.slow

# Each is a recipient that a screen would show as something else: a right-to-left
# override, isolates, a C1 CSI, marks, zero-width and separator characters.
SPOOFS = {
    "rlo": "evil\u202e@moc.elpmaxe",
    "isolates": "\u2066ann@example.com\u2069\u2067evil\u2069",
    "c1-csi": "ann\u009b2K@example.com",
    "marks": "ann\u200f@\u061cexample.com",
    "zero-width": "ann\u200b@exa\u200dmple.com",
    "separators": "ann@example.com\u2028evil@example.com",
    "tag": "ann@example.com\U000e0065\U000e0076",
}


def _params_shown(question: str) -> Any:
    """The params JSON a question shows, read back."""
    head, _, tail = question.partition("Params: ")
    assert head.startswith("Send "), question
    shown = tail.removesuffix(f" {HIDDEN_NOTE}")
    return json.loads(shown)


def _assert_safe(question: str, params: dict[str, Any]) -> None:
    # Nothing in the text can hide, move or reorder what is around it ...
    bad = [c for c in question if not c.isprintable() and c != " "]
    assert not bad, [unicodedata.name(c, hex(ord(c))) for c in bad]
    assert not any(
        unicodedata.bidirectional(c)
        in ("RLO", "LRO", "RLE", "LRE", "PDF", "RLI", "LRI", "FSI", "PDI")
        for c in question
    )
    # ... it says so, and what it shows is exactly what is recorded and sent.
    assert question.endswith(HIDDEN_NOTE), question
    assert _params_shown(question) == params


def _stdio(errlog: Any, elicit: Any) -> Client:
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "settled", "mcp"], env=dict(os.environ), cwd=str(ROOT)
    )
    return Client(stdio_client(server, errlog=errlog), elicitation_callback=elicit)


def test_the_mcp_question_a_person_reads_shows_every_spoof_escaped(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    asked: list[str] = []

    async def decline(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    calls = {}
    for name, to in SPOOFS.items():
        params = {"to": to, "subject": "Invoice"}
        # Recorded for a person's confirmation, as a shell or another agent would.
        p = run_cli(
            "dispatch",
            "sim",
            "book",
            "--needs-confirmation",
            "--action-id",
            f"q-{name}",
            "--params",
            json.dumps(params),
        )
        assert p.returncode == 3, p.stderr
        calls[name] = params

    async def go() -> list[types.CallToolResult]:
        out = []
        with (tmp_path / "server.log").open("w") as log:
            async with _stdio(log, decline) as c:
                for name, params in calls.items():
                    args = {"action_id": f"q-{name}", "params": params}
                    out.append(await c.call_tool("sim_book", args))
        return out

    async def bounded() -> list[types.CallToolResult]:
        with anyio.fail_after(120):
            return await go()

    results = anyio.run(bounded)
    assert len(asked) == len(SPOOFS), asked
    for question, (name, params) in zip(asked, calls.items(), strict=True):
        _assert_safe(question, params)
        assert f"as action q-{name}?" in question
    for res in results:  # declined: nothing sent
        assert not res.is_error and (res.structured_content or {})["settled_status"] == "PENDING"
    assert all(sim.requests_for(f"q-{n}") == [] for n in SPOOFS)
    # The record holds the real characters: escaping is for the person, not the data.
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        assert led.get("q-rlo").params["to"] == SPOOFS["rlo"]


def test_the_python_api_asks_the_same_question(sim_config: Path, sim: SimServer) -> None:
    asked: list[str] = []

    def ask(question: str) -> bool:
        asked.append(question)
        return False

    book = settled.tool("sim", "book", needs_confirmation=True, confirm=ask)
    result = book("py-1", to=SPOOFS["rlo"], note="line\nbreak")
    assert result.status == "accepted" and result.settled_status == "PENDING"
    _assert_safe(asked[0], {"to": SPOOFS["rlo"], "note": "line\nbreak"})
    assert "evil\\u202e@moc.elpmaxe" in asked[0]
    plain = settled.tool("sim", "book", needs_confirmation=True, confirm=ask)
    plain("py-2", to="ann@example.com")
    assert asked[1] == 'Send sim.book once, as action py-2? Params: {"to": "ann@example.com"}'


def test_a_long_question_says_how_much_it_leaves_out(sim_config: Path, sim: SimServer) -> None:
    asked: list[str] = []
    book = settled.tool(
        "sim", "book", needs_confirmation=True, confirm=lambda q: bool(asked.append(q))
    )
    book("long-1", body="x" * 2000 + "\u202e")
    assert "more characters not shown" in asked[0] and asked[0].endswith(HIDDEN_NOTE)
    assert all(c.isprintable() for c in asked[0])


@pytest.mark.skipif(not tmux_available(), reason="tmux is not installed")
def test_the_resolve_question_on_a_terminal_says_what_it_escaped(db_path: Path) -> None:
    with Ledger.open(db_path) as led:
        add(
            led,
            "r-1",
            provider="mail",
            operation="send",
            reason="bounce for evil\u202e@moc.elpmaxe",
        )
        add(led, "r-2", provider="mail", operation="send", reason="ann\u009b2J gone")
    screen = run_in_terminal(
        ["resolve", "--provider", "mail", "--not-applied", "--reason", "bounced"],
        width=160,
        keys=["n", "Enter"],
        wait_for="Record this verdict",
    )
    assert exit_code(screen) == 0, screen
    assert "\u202e" not in screen and "\u009b" not in screen
    assert "\\u202e" in screen and "\\x9b" in screen
    flat = " ".join(screen.split())  # lines the terminal wrapped
    assert flat.count(HIDDEN_NOTE) == 2, screen  # the preview's title and the [y/N]
    assert f"action(s)? {HIDDEN_NOTE} [y/N]" in flat
    assert "nothing recorded" in screen


def test_a_resolve_preview_without_hidden_characters_says_nothing_of_them(
    db_path: Path,
) -> None:
    with Ledger.open(db_path) as led:
        add(led, "r-3", provider="mail", operation="send", reason="bounced")
    out = run_cli("resolve", "--provider", "mail", "--not-applied", "--reason", "x", "--dry-run")
    assert out.returncode == 0 and HIDDEN_NOTE not in out.stdout + out.stderr
    with Ledger.open(db_path) as led:
        add(led, "r-4", provider="mail", operation="send", reason="evil\u202e")
    out = run_cli("resolve", "--provider", "mail", "--not-applied", "--reason", "x", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "the preview contains hidden control characters, shown escaped" in out.stderr
    assert "evil\\u202e" in out.stdout and "\u202e" not in out.stdout
