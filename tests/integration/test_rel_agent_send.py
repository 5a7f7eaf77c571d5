"""An agent's result after a send is the record's. When the request left and its
outcome could not be written (the ledger locked past its busy timeout by another
writer, after the provider applied the request), the agent is told ``accepted`` (a
query will settle it: call check_action later) or ``uncertain`` (only a person can),
with the reason; never an ``isError`` that docs/agents.md reads as "refused, nothing
sent", and never an exception from the Python API.

The MCP side is a real ``settled mcp`` process and the SDK's client over stdio; the
lock is held by another connection (another process's, for the server) from the
moment the provider has applied the request until the agent has its answer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from locks import Locker, LockingServer
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from support import ROOT, run_cli, write_config

import settled
from settled import Ledger

pytestmark = pytest.mark.slow

BUSY = "0.3"  # s: the busy timeout, far below the time the lock is held


@pytest.fixture
def server() -> Iterator[LockingServer]:
    with LockingServer(hang=1.0, honour_keys=False) as s:
        yield s


@pytest.fixture
def setup(
    server: LockingServer, tmp_path: Path, location: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Locker]:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": 0.5,
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 10.0,
    }
    config = write_config(
        tmp_path / "settled.toml", {"sim": provider}, dispatch={"lease_grace": 0.2}
    )
    monkeypatch.setenv("SETTLED_CONFIG", str(config))
    monkeypatch.setenv("SETTLED_BUSY_TIMEOUT", BUSY)
    Ledger.open(location).close()
    locker = Locker(location)
    try:
        yield locker
    finally:
        server.on_request = None
        locker.close()


def lock_on_next_request(server: LockingServer, locker: Locker) -> None:
    """Take the ledger's lock right after the provider applied the next request."""

    def once() -> None:
        server.on_request = None
        locker.hold()

    server.on_request = once


def _stdio(log: Any, elicit: Any = None) -> Client:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "settled", "mcp"], env=dict(os.environ), cwd=str(ROOT)
    )
    return Client(stdio_client(params, errlog=log), elicitation_callback=elicit)


async def _accept(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"confirm": True})


def _content(res: types.CallToolResult) -> dict[str, Any]:
    assert not res.is_error, res.content  # never "refused, nothing sent"
    data = dict(res.structured_content or {})
    text = res.content[0].text  # type: ignore[union-attr]
    assert text.startswith(data["status"] + ":") and "\n" not in text, text
    return data


def test_a_real_mcp_client_gets_the_records_status_when_the_outcome_could_not_be_written(
    server: LockingServer, setup: Locker, tmp_path: Path
) -> None:
    locker = setup
    # Recorded for a person's confirmation, from a shell: the approval path sends too.
    p = run_cli("dispatch", "sim", "book", "--needs-confirmation", "--action-id", "m-book")
    assert p.returncode == 3, p.stderr

    async def go() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with (tmp_path / "server.log").open("w") as log:
            async with _stdio(log, _accept) as c:
                for tool, aid in (
                    ("sim_send", "m-send"),
                    ("sim_notify", "m-notify"),
                    ("sim_book", "m-book"),
                ):
                    lock_on_next_request(server, locker)
                    res = await c.call_tool(tool, {"action_id": aid, "params": {}})
                    locker.release()  # the agent has its answer: the other writer is done
                    seen[aid] = _content(res)
                # Later, check_action settles what a query can settle.
                deadline = time.monotonic() + 60
                while True:
                    res = await c.call_tool("check_action", {"action_id": "m-send"})
                    seen["later"] = _content(res)
                    if seen["later"]["status"] != "accepted" or time.monotonic() > deadline:
                        break
                    await anyio.sleep(0.1)
        return seen

    async def bounded() -> dict[str, Any]:
        with anyio.fail_after(120):
            return await go()

    seen = anyio.run(bounded)
    for aid in ("m-send", "m-notify", "m-book"):
        assert server.effects_for(aid) == 1, aid  # the provider applied it, once
        got = seen[aid]
        assert got["settled_status"] == "IN_FLIGHT", got
        assert "the request was sent, but its outcome could not be recorded" in got["reason"]
    # sim.send can be queried: accepted, and when to ask again (the lease's end).
    assert seen["m-send"]["status"] == "accepted" and seen["m-send"]["next_check_at"]
    # sim.notify is blind, sim.book's reply was its only proof: only a person can say.
    assert seen["m-notify"]["status"] == "uncertain"
    assert seen["m-book"]["status"] in ("accepted", "uncertain")
    assert seen["later"]["status"] == "success", seen["later"]
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_the_python_api_returns_the_records_status_and_raises_nothing(
    server: LockingServer, setup: Locker
) -> None:
    locker = setup
    send = settled.tool("sim", "send")
    lock_on_next_request(server, locker)
    try:
        result = send("py-send")
    finally:
        locker.release()
    assert result.settled_status == "IN_FLIGHT" and result.status == "accepted", result
    assert "could not be recorded" in result.reason and not result.done
    # With wait: the wait itself meets the lock, and says so; the answer stands.
    waiting = settled.tool("sim", "send", wait=5.0)
    lock_on_next_request(server, locker)
    try:
        held = waiting("py-wait")
    finally:
        locker.release()
    assert held.settled_status == "IN_FLIGHT" and held.status == "accepted", held
    assert "waiting stopped" in held.text, held.text
    assert server.effects_for("py-send") == server.effects_for("py-wait") == 1
    # Nothing was lost: once the lease lapses, verification settles both.
    deadline = time.monotonic() + 60
    while settled.check("py-send").status == "accepted" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert settled.check("py-send").status == "success"
    out = run_cli("show", "py-wait", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["provider"] == "sim"
