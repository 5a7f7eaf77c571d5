"""What holds across the framework integrations: one intent from every framework and
the CLI is one send; no tool input of any framework can approve; a missing framework
is one line naming its install; and no framework is imported by settled itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from frameworks import configure
from mcp import Client
from support import ROOT, run_cli

from settled.errors import InvalidInput
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_incidental

MODULES = ("openai_agents", "pydantic_ai", "langchain", "claude_agent_sdk")
FRAMEWORKS = {
    "openai_agents": "agents",
    "pydantic_ai": "pydantic_ai",
    "langchain": "langchain_core",
    "claude_agent_sdk": "claude_agent_sdk",
}
APPROVING = {"confirm", "confirmed", "approve", "approved", "approval", "yes"}


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, sim: SimServer) -> Iterator[None]:
    configure(tmp_path, sim)
    yield


def test_one_intent_from_four_frameworks_and_the_cli_is_one_send(sim: SimServer) -> None:
    from agents.tool_context import ToolContext
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from settled.integrations import claude_agent_sdk, langchain, openai_agents, pydantic_ai

    params = {"order_id": 77, "to": "ann@example.com"}
    texts = []
    send = {t.name: t for t in langchain.tools()}["sim_send"]
    texts.append(str(send.invoke({"params": params})))
    oa = {t.name: t for t in openai_agents.tools()}["sim_send"]
    ctx = ToolContext(context=None, tool_name="sim_send", tool_call_id="x", tool_arguments="{}")
    texts.append(asyncio.run(oa.on_invoke_tool(ctx, json.dumps({"params": params}))))
    tool = pydantic_ai.toolset().tools["sim_send"]
    rctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    texts.append(str(tool.function(rctx, params=params).return_value))  # type: ignore[call-arg]

    async def claude() -> str:
        async with Client(claude_agent_sdk.server()["instance"]) as c:
            return str((await c.call_tool("sim_send", {"params": params})).content[0].text)  # type: ignore[union-attr]

    texts.append(anyio.run(claude))
    cli = run_cli("dispatch", "sim", "send", "--params", json.dumps(params), "--json")
    assert cli.returncode == 3 and json.loads(cli.stdout)["action_id"] == "receipt-77"
    assert texts[0].startswith("accepted: sim.send receipt-77")
    assert all("repeated intent: nothing sent again" in t for t in texts[1:]), texts
    assert len(sim.requests_for("receipt-77")) == 1


def _names(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for name, sub in (schema.get("properties") or {}).items():
            yield str(name)
            yield from _names(sub)


def test_no_tool_input_of_any_framework_can_approve() -> None:
    from settled.integrations import claude_agent_sdk, langchain, openai_agents, pydantic_ai

    schemas: dict[str, Any] = {}
    for t in openai_agents.tools():
        schemas[f"openai_agents.{t.name}"] = t.params_json_schema
    for name, t in pydantic_ai.toolset().tools.items():
        schemas[f"pydantic_ai.{name}"] = t.function_schema.json_schema
    for t in langchain.tools():
        schemas[f"langchain.{t.name}"] = t.args_schema

    async def claude() -> list[Any]:
        async with Client(claude_agent_sdk.server()["instance"]) as c:
            return (await c.list_tools()).tools

    for t in anyio.run(claude):
        schemas[f"claude_agent_sdk.{t.name}"] = t.input_schema
    assert len(schemas) == 4 * 6  # five operations and check_action, in each
    for where, schema in schemas.items():
        assert not set(_names(schema)) & APPROVING, where
    assert set(_names(schemas["langchain.sim_book"])) == {"params"}  # the key's params alone


@pytest.mark.ledger_free
@pytest.mark.parametrize("module", MODULES)
def test_a_missing_framework_is_one_line_naming_its_install(module: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{FRAMEWORKS[module]!r}] = None\n"
        "from settled.errors import MissingExtra\n"
        "try:\n"
        f"    import settled.integrations.{module}\n"
        "except MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith(f"pip install 'settled[{module}]'"), p.stdout
    assert p.stdout.count("\n") == 1


@pytest.mark.ledger_free
def test_settled_imports_no_framework() -> None:
    code = (
        "import sys, settled, settled.agents, settled.toolbox, settled.integrations\n"
        "import settled.cli\n"
        f"print([m for m in {[*FRAMEWORKS.values(), 'langgraph']!r} if m in sys.modules])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_operations_choose_the_tools_and_an_unknown_one_is_refused() -> None:
    from settled.integrations import langchain

    names = [t.name for t in langchain.tools(operations=["sim.send"])]
    assert names == ["sim_send", "check_action"]
    with pytest.raises(InvalidInput, match=r"'sim\.sned' is not configured"):
        langchain.tools(operations=["sim.sned"])
    with pytest.raises(InvalidInput, match="wait"):
        langchain.tools(wait=-1)


def test_an_error_after_the_send_is_answered_from_the_record(
    sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug after the request left must not read as "nothing sent": the claim was
    committed first, so the tool answers with the record."""
    from settled.integrations import _kit, langchain

    def broken(self: Any, result: Any) -> Any:
        raise RuntimeError("a bug after the send")

    monkeypatch.setattr(_kit.Kit, "finish", broken)
    send = {t.name: t for t in langchain.tools()}["sim_send"]
    text = str(send.invoke({"params": {"order_id": 88, "to": "a@x.org"}}))
    assert text.startswith("accepted: sim.send receipt-88 — internal error after recording")
    assert "RuntimeError: a bug after the send" in text
    assert len(sim.requests_for("receipt-88")) == 1
