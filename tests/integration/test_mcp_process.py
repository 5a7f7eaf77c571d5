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
import pytest
from invariants import check
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from support import ROOT, popen_cli, run_cli, write_config

from settled import Ledger
from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.ledger_incidental, pytest.mark.slow]


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


# -- raw JSON-RPC bytes on stdin: every request gets an answer ---------------------------------


class RawSession:
    """``settled mcp`` fed raw bytes on stdin; answers read off stdout as they come."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "settled", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(ROOT),
            env=dict(os.environ),
        )
        self.answers: queue.Queue[bytes] = queue.Queue()
        self.errors: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        err = self.proc.stderr
        threading.Thread(
            target=lambda: [self.errors.put(x.decode()) for x in err], daemon=True
        ).start()

    def _pump(self, out: Any) -> None:
        for line in out:
            self.answers.put(line)

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 60) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.answers.get(timeout=timeout))
        return got

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return code


def _call(rid: Any, params: bytes) -> bytes:
    head = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call"}).encode()[:-1]
    return (
        head
        + b', "params": {"name": "sim_book", "arguments": {"action_id": "raw-%s", "params": %s}}}'
        % (str(rid).encode(), params)
    )


def _nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE_LINES = {
    "nested-200": (_nested(200), -32600),
    "nested-1000": (_nested(1000), -32600),
    "nested-100000": (_nested(100000), -32600),
    "lone-high-surrogate": (b'{"to": "\\ud800"}', -32700),
    "lone-low-surrogate": (b'{"to": "x\\udfff"}', -32700),
    "invalid-utf8": (b'{"to": "\xff\xfe"}', -32700),
    "truncated-utf8": (b'{"to": "\xe2\x82"}', -32700),
    "not-json": (b'{"to": nope}', -32700),
}


def test_every_raw_request_gets_an_answer_and_the_server_stays_up(
    sim_config: Path, sim: SimServer
) -> None:
    s = RawSession()
    try:
        init = {
            "jsonrpc": "2.0",
            "id": "init",
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        }
        s.send(json.dumps(init).encode())
        assert s.answer()["id"] == "init"
        s.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        for n, (name, (params, code)) in enumerate(HOSTILE_LINES.items()):
            s.send(_call(n, params))
            got = s.answer()  # bounded: a missing answer fails here, never hangs
            assert got["id"] == n and got["error"]["code"] == code, (name, got)
            message = got["error"]["message"]
            assert "\n" not in message and "Traceback" not in message, message
            s.send(_call(f"ok-{n}", b"{}"))  # and the next request is served
            ok = s.answer()
            assert ok["id"] == f"ok-{n}" and ok["result"]["isError"] is False, (name, ok)
        # Not a JSON-RPC message, or no id to be found: answered with a null id.
        for raw in (b"[1, 2]", b"garbage", b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": 7}'):
            s.send(raw)
            got = s.answer()
            assert got["id"] is None and got["error"]["code"] in (-32600, -32700), got
        # A notification that cannot be read is answered by nothing (JSON-RPC), and
        # the session goes on.
        s.send(b'{"jsonrpc": "2.0", "method": "notifications/x", "params": ' + _nested(500) + b"}")
        s.send(_call("last", b"{}"))
        assert s.answer()["id"] == "last"
        # A line larger than the transport takes is refused by its own id.
        s.send(_call("huge", b'{"x": "' + b"y" * (4 * 1024 * 1024) + b'"}'))
        got = s.answer()
        assert got["id"] == "huge" and got["error"]["code"] == -32600, got
        s.send(_call("after-huge", b"{}"))
        assert s.answer()["id"] == "after-huge"
    finally:
        code = s.close()
    assert code == 0
    errors = "".join(iter_queue(s.errors))
    assert "Traceback" not in errors, errors
    assert sim.effects_for("raw-ok-0") == 1 and sim.requests_for("raw-0") == []


def iter_queue(q: queue.Queue[str]) -> list[str]:
    out = []
    while not q.empty():
        out.append(q.get())
    return out


def test_scan_finds_the_id_at_any_depth() -> None:
    from settled.agents.mcp_stdio import scan

    deep = (
        '{"jsonrpc": "2.0", "params": ' + "[" * 100000 + "]" * 100000 + ', "id": 7, "method": "m"}'
    )
    assert scan(deep) == (True, 7, True, True)
    assert scan('{"id": "a\\"b", "method": "x", "params": {"id": 5}}') == (True, 'a"b', True, True)
    assert scan('{"method": "n", "params": {"id": 5}}') == (False, None, False, True)
    assert scan('{"id": null}') == (True, None, True, False)
    assert scan('{"id": 1.5}') == (False, None, True, False)
    assert scan('{"id": {"x": 1}, "method": 7}') == (False, None, True, True)
    assert scan('{"id": "\\ud800"}') == (False, None, True, False)
    assert scan("not json at all") == (False, None, False, False)
