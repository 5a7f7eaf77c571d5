"""`settled mcp` as a real process: the SDK's client over stdio and over streamable HTTP
on loopback, several clients and a shell racing on one action, and the command's own
failures (a missing extra, a bad config, a non-loopback address)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from invariants import check
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from support import ROOT, popen_cli, run_cli, write_config

from settled.ledger import Ledger
from settled.providers.sim_server import SimServer


def run(fn: Callable[[], Awaitable[Any]], limit: float = 60.0) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(limit):
            return await fn()

    return anyio.run(bounded)


def stdio(errlog: TextIO, elicit: Any = None) -> Client:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "settled", "mcp"], env=dict(os.environ), cwd=str(ROOT)
    )
    return Client(stdio_client(params, errlog=errlog), elicitation_callback=elicit)


async def accept(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"confirm": True})


def status(res: types.CallToolResult) -> str:
    assert not res.is_error, res.content
    return str((res.structured_content or {})["status"])


def test_stdio_lists_calls_and_reports_errors_in_one_line(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"

    async def go() -> tuple[list[str], str, types.CallToolResult, types.CallToolResult]:
        with log.open("w") as errlog:
            async with stdio(errlog) as c:
                names = [t.name for t in (await c.list_tools()).tools]
                booked = status(await c.call_tool("sim_book", {"action_id": "s-1", "params": {}}))
                unknown = await c.call_tool("sim_bogus", {"action_id": "s-2"})
                conflict = await c.call_tool("sim_book", {"action_id": "s-1", "params": {"x": 1}})
                return names, booked, unknown, conflict

    names, booked, unknown, conflict = run(go)
    assert "sim_book" in names and "check_action" in names
    assert booked == "success" and sim.effects_for("s-1") == 1
    for res in (unknown, conflict):
        assert res.is_error and "\n" not in res.content[0].text  # type: ignore[union-attr]
    assert "Traceback" not in log.read_text()


def test_two_clients_and_a_shell_confirm_race_on_one_action_and_send_once(
    sim_config: Path, sim: SimServer, tmp_path: Path
) -> None:
    # A booking recorded for a person's confirmation, from a shell.
    p = run_cli("dispatch", "sim", "book", "--needs-confirmation", "--action-id", "race-1")
    assert p.returncode == 3, p.stderr
    logs = [tmp_path / "a.log", tmp_path / "b.log"]

    async def go() -> tuple[list[str], str]:
        results: list[str] = []
        with logs[0].open("w") as la, logs[1].open("w") as lb:
            async with stdio(la, accept) as a, stdio(lb, accept) as b:
                shell: list[subprocess.Popen[str]] = []

                async def call(c: Client, aid: str) -> None:
                    res = await c.call_tool("sim_book", {"action_id": aid, "params": {}})
                    results.append(status(res))

                async def send(c: Client) -> None:
                    res = await c.call_tool("sim_send", {"action_id": "race-2", "params": {}})
                    results.append(status(res))

                async with anyio.create_task_group() as tg:
                    shell.append(popen_cli("confirm", "race-1", "--json"))
                    for c in (a, b):
                        tg.start_soon(call, c, "race-1")
                        tg.start_soon(send, c)
                out, _ = await anyio.to_thread.run_sync(lambda: shell[0].communicate(timeout=30))
                final = status(await a.call_tool("check_action", {"action_id": "race-1"}))
        return results, final + "|" + json.loads(out)["outcome"]

    results, final = run(go)
    assert len(sim.requests_for("race-1")) == 1 and sim.effects_for("race-1") == 1
    assert len(sim.requests_for("race-2")) == 1
    assert set(results) <= {"success", "accepted"}
    done, outcome = final.split("|")
    assert done == "success"
    assert outcome in ("dispatched", "already_completed", "in_progress")
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        check(led, sim, open_ok={"race-2"})


def _read_lines(stream: TextIO, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def test_streamable_http_on_loopback(sim_config: Path, sim: SimServer) -> None:
    proc = popen_cli("mcp", "--http", "127.0.0.1:0")
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    reader = threading.Thread(target=_read_lines, args=(proc.stderr, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        line = lines.get(timeout=30)
        seen.append(line)
        assert "serving streamable HTTP at http://127.0.0.1:" in line, line
        url = line.rsplit(" ", 1)[1].strip()

        async def go() -> tuple[list[str], str]:
            async with Client(url) as c:
                names = [t.name for t in (await c.list_tools()).tools]
                got = status(await c.call_tool("sim_book", {"action_id": "h-1", "params": {}}))
                return names, got

        names, got = run(go)
        assert "sim_book" in names and got == "success"
        assert len(sim.requests_for("h-1")) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        reader.join(timeout=5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert code == 0
    while not lines.empty():
        seen.append(lines.get())
    assert "Traceback" not in "".join(seen)


def test_settled_mcp_without_the_extra_exits_1_naming_the_install() -> None:
    code = "import sys; sys.modules['mcp'] = None\nfrom settled.cli import main\nmain(['mcp'])"
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 1
    assert "pip install 'settled[mcp]'" in p.stderr and "Traceback" not in p.stderr


def test_import_settled_cli_loads_no_mcp() -> None:
    code = (
        "import sys, settled.cli, settled\n"
        "bad = [m for m in ('mcp', 'mcp_types', 'jsonschema', 'uvicorn', 'settled.agents')"
        " if m in sys.modules]\nprint(','.join(bad))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert p.stdout.strip() == ""
    assert "mcp" in run_cli("--help").stdout
    helped = run_cli("mcp", "--help")
    assert helped.returncode == 0 and "--http HOST:PORT" in helped.stdout
    assert "settled mcp" in (ROOT / "docs" / "agents.md").read_text()


def test_settled_mcp_refuses_bad_config_and_non_loopback(sim: SimServer, tmp_path: Path) -> None:
    p = run_cli("mcp", "--http", "0.0.0.0:8765")
    assert p.returncode == 1 and "loopback" in p.stderr
    p = run_cli("mcp", "--http", "nonsense")
    assert p.returncode == 1 and "HOST:PORT" in p.stderr
    write_config(tmp_path / "settled.toml", {"mail": {"type": "nope"}})
    p = run_cli("mcp")
    assert p.returncode == 1, p.stderr
    assert "unknown provider type 'nope'" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
