"""settled's MCP server, driven by the SDK's own client in-process: over the SDK's memory
transport (the handshake era, "legacy") and over its direct in-process path (the
2026-07-28 era, "auto"), against a real sim provider on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from invariants import check
from mcp import Client
from mcp.shared.exceptions import MCPError
from support import run_cli

from settled import Ledger
from settled.agents.mcp_server import build_server
from settled.providers.base import OperationSpec
from settled.providers.sim_server import SimServer
from settled.toolbox import Operation, Toolbox

pytestmark = pytest.mark.ledger_incidental

MODES = ["legacy", "auto"]
OPS = {"sim_book", "sim_deliver", "sim_notify", "sim_send", "sim_set"}
FIVE = {"action_id", "status", "settled_status", "reason", "next_check_at"}

Elicit = Callable[[Any, types.ElicitRequestParams], Awaitable[types.ElicitResult]]


def run(fn: Callable[[], Awaitable[Any]], limit: float = 30.0) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(limit):
            return await fn()

    return anyio.run(bounded)


def sc(res: types.CallToolResult) -> dict[str, Any]:
    assert not res.is_error, res.content
    data = dict(res.structured_content or {})
    assert set(data) == FIVE, data
    text = res.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text and text.startswith(data["status"] + ":"), text
    return data


def error_line(res: types.CallToolResult) -> str:
    assert res.is_error, res
    assert len(res.content) == 1
    text: str = res.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text and "Traceback" not in text and len(text) <= 1000, text
    return text


def answering(action: str, confirm: bool = True) -> Elicit:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert "Send sim.book once" in params.message
        content = {"confirm": confirm} if action == "accept" else None
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return elicit


@pytest.fixture
def ledger_path(sim_config: Path, location: Path) -> Path:
    return location


@pytest.fixture
def box() -> Iterator[Callable[..., Toolbox]]:
    """Toolboxes as ``settled mcp`` makes them (a pool of sessions), closed after the test."""
    made: list[Toolbox] = []

    def make(cls: type[Toolbox] = Toolbox, **kw: Any) -> Toolbox:
        made.append(cls(actor="mcp", pool=4, **kw))
        return made[-1]

    yield make
    for b in made:
        b.close()


# ---------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class DeclaredSpec(OperationSpec):
    """A sim operation with the declarations a provider can add."""

    destructive: bool = True
    title: str = ""
    description: str = ""
    params_schema: Mapping[str, Any] | None = None
    needs_confirmation: bool = False


class DeclaredToolbox(Toolbox):
    def operations(self) -> list[Operation]:
        out = []
        for found in super().operations():
            op = found
            if op.operation == "send":
                spec = DeclaredSpec(
                    **{
                        **asdict(op.spec),  # the declarations may be OperationSpec's own
                        "destructive": False,
                        "title": "Send a mail",
                        "description": "Sends one mail.",
                        "params_schema": {
                            "type": "object",
                            "properties": {"to": {"type": "string", "format": "email"}},
                            "required": ["to"],
                        },
                    }
                )
                op = Operation(op.name, op.provider, op.operation, spec, False)
            elif op.operation == "book":
                spec = DeclaredSpec(**{**asdict(op.spec), "needs_confirmation": True})
                op = Operation(op.name, op.provider, op.operation, spec, True)
            out.append(op)
        return out


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_gives_names_schemas_and_honest_annotations(
    box: Callable[..., Toolbox], sim_config: Path, mode: str
) -> None:
    async def go() -> list[types.Tool]:
        async with Client(build_server(box()), mode=mode) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in run(go)}
    assert set(tools) == OPS | {"check_action", "list_unresolved"}
    for name in OPS:
        t = tools[name]
        assert t.input_schema["required"] == ["action_id"]
        assert set(t.input_schema["properties"]) == {"action_id", "params"}
        assert t.input_schema["additionalProperties"] is False
        assert set(t.output_schema["required"]) == FIVE  # type: ignore[index]
        a = t.annotations
        assert a is not None and a.title == t.title == name.replace("_", ".")
        assert (a.idempotent_hint, a.open_world_hint, a.destructive_hint) == (True, True, True)
        assert a.read_only_hint is False
        assert "only 'success' means the effect was observed" in (t.description or "")
    assert "only means accepted (queued), not done" in (tools["sim_send"].description or "")
    assert "reply proves the effect" in (tools["sim_book"].description or "")
    assert "proves delivery only" in (tools["sim_deliver"].description or "")
    assert "Nothing can observe" in (tools["sim_notify"].description or "")
    for name in ("check_action", "list_unresolved"):
        a = tools[name].annotations
        assert a is not None and a.read_only_hint is True and a.destructive_hint is False


def test_declared_fields_shape_the_tools(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, ledger_path: Path
) -> None:
    async def go() -> tuple[list[types.Tool], types.CallToolResult, types.CallToolResult]:
        async with Client(build_server(box(DeclaredToolbox))) as c:
            tools = (await c.list_tools()).tools
            bad = await c.call_tool("sim_send", {"action_id": "s-1", "params": {"to": 7}})
            missing = await c.call_tool("sim_send", {"action_id": "s-2"})
            return tools, bad, missing

    tools, bad, missing = run(go)
    by = {t.name: t for t in tools}
    send = by["sim_send"]
    assert send.title == "Send a mail" and send.annotations.destructive_hint is False  # type: ignore[union-attr]
    assert send.input_schema["required"] == ["action_id", "params"]
    assert send.input_schema["properties"]["params"]["required"] == ["to"]
    assert (send.description or "").startswith("Sends one mail.")
    assert "A person must confirm" in (by["sim_book"].description or "")
    assert "params do not match sim.send's schema" in error_line(bad)
    assert "'to' is a required property" in error_line(missing)
    assert sim.requests_for("s-1") == [] and sim.requests_for("s-2") == []
    with Ledger.open(ledger_path) as led:
        assert led.find("s-1") is None


# ---------------------------------------------------------------------- the fault matrix

# (operation, fault, status of the call, status once settled)
MATRIX = [
    ("book", "ok", "success", "success"),
    ("book", "reject", "failed", "failed"),
    ("book", "timeout_after_apply", "uncertain", "success"),
    ("book", "5xx_before", "uncertain", "uncertain"),
    ("book", "drop", "uncertain", "uncertain"),
    ("book", "lost_after_accept", "accepted", "uncertain"),
    ("book", "badutf8", "accepted", "success"),
    ("book", "huge", "accepted", "success"),
    ("send", "ok", "accepted", "success"),
    ("send", "lag:0.3", "accepted", "success"),
    ("send", "garbage", "accepted", "success"),
    ("send", "lost_after_accept", "accepted", "uncertain"),
    ("send", "bounce", "accepted", "failed"),
    ("send", "reject", "failed", "failed"),
    ("send", "http:400", "failed", "failed"),
    ("send", "http:429", "uncertain", "uncertain"),
    ("send", "5xx_after", "uncertain", "success"),
    ("send", "reset_after_apply", "uncertain", "success"),
    ("send", "timeout_before_apply", "uncertain", "uncertain"),
    ("deliver", "ok", "accepted", "uncertain"),
    ("notify", "ok", "uncertain", "uncertain"),
    ("set", "ok", "accepted", "success"),
]


def test_every_tier_and_fault_maps_to_the_right_status(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, ledger_path: Path
) -> None:
    seen: dict[str, list[str]] = {}

    def observe(aid: str, data: dict[str, Any]) -> str:
        assert data["action_id"] == aid
        if data["status"] == "success":  # the promise: success only on an observed effect
            assert sim.effects_for(aid) == 1, (aid, data)
            assert data["settled_status"] == "CONFIRMED"
        seen.setdefault(aid, []).append(data["status"])
        return str(data["status"])

    async def go() -> dict[str, str]:
        final: dict[str, str] = {}
        async with Client(build_server(box())) as c:
            for op, fault, first, _ in MATRIX:
                aid = f"{op}-{fault}"
                sim.plan(aid, fault)
                params = {"name": "volume", "value": 7} if op == "set" else {"n": 1}
                res = await c.call_tool(f"sim_{op}", {"action_id": aid, "params": params})
                assert observe(aid, sc(res)) == first, (aid, res.content)
            deadline = time.monotonic() + 15
            todo = {f"{op}-{fault}" for op, fault, _, _ in MATRIX}
            while todo and time.monotonic() < deadline:
                await anyio.sleep(0.05)
                for aid in sorted(todo):
                    data = sc(await c.call_tool("check_action", {"action_id": aid}))
                    final[aid] = observe(aid, data)
                    if data["next_check_at"] is None:
                        todo.discard(aid)
            assert not todo, f"still checking: {sorted(todo)}"
        return final

    final = run(go)
    for op, fault, _, last in MATRIX:
        assert final[f"{op}-{fault}"] == last, (op, fault, seen[f"{op}-{fault}"])
    with Ledger.open(ledger_path) as led:
        check(led, sim)


def test_check_action_never_checks_sooner_than_scheduled(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, ledger_path: Path
) -> None:
    sim.plan("m-1", "lost_after_accept")

    async def go() -> list[dict[str, Any]]:
        async with Client(build_server(box())) as c:
            await c.call_tool("sim_send", {"action_id": "m-1", "params": {}})
            return [sc(await c.call_tool("check_action", {"action_id": "m-1"})) for _ in range(5)]

    results = run(go)
    with Ledger.open(ledger_path) as led:
        key = led.get("m-1").reconciliation_key
    assert key is not None
    # The first look finds the check due (window 0) and runs it; the next looks come
    # before the next scheduled check (0.05 s later) far less often than they are asked.
    assert 1 <= sim.queries_for(key) < len(results)
    assert all(r["status"] == "accepted" for r in results)


# ---------------------------------------------------------------------- at most once


@pytest.mark.parametrize("mode", MODES)
def test_the_same_action_id_sends_once(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, mode: str
) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any], str, list[dict[str, Any]]]:
        async with Client(build_server(box()), mode=mode) as c:
            args = {"action_id": "once", "params": {"to": "a"}}
            first = sc(await c.call_tool("sim_send", args))
            again = sc(await c.call_tool("sim_send", args))
            other = error_line(
                await c.call_tool("sim_send", {"action_id": "once", "params": {"to": "b"}})
            )
            results: list[dict[str, Any]] = []

            async def one() -> None:
                res = await c.call_tool("sim_book", {"action_id": "twin", "params": {}})
                results.append(sc(res))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one)
            return first, again, other, results

    first, again, other, results = run(go)
    assert first["status"] == again["status"] == "accepted"
    assert "already used with different params; nothing was sent" in other
    assert len(sim.requests_for("once")) == 1
    assert len(sim.requests_for("twin")) == 1 and sim.effects_for("twin") == 1
    assert {r["status"] for r in results} <= {"success", "accepted"}


# ---------------------------------------------------------------------- confirmation


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("answer", "confirm", "sent", "why"),
    [
        ("accept", True, 1, "confirmed and sent once"),
        ("accept", False, 0, "did not tick 'Send it': nothing was sent"),
        ("decline", True, 0, "the person declined: nothing was sent"),
        ("cancel", True, 0, "dismissed the confirmation: nothing was sent"),
    ],
)
def test_elicitation_accept_decline_cancel(
    box: Callable[..., Toolbox],
    sim_config: Path,
    sim: SimServer,
    mode: str,
    answer: str,
    confirm: bool,
    sent: int,
    why: str,
) -> None:
    box = box(confirm={"sim.book"})

    async def go() -> tuple[types.CallToolResult, dict[str, Any]]:
        async with Client(
            build_server(box), mode=mode, elicitation_callback=answering(answer, confirm)
        ) as c:
            res = await c.call_tool("sim_book", {"action_id": "slot", "params": {"at": "10:00"}})
            return res, sc(await c.call_tool("check_action", {"action_id": "slot"}))

    res, later = run(go)
    data = sc(res)
    assert why in res.content[0].text  # type: ignore[union-attr]
    assert len(sim.requests_for("slot")) == sent
    if sent:
        assert data["status"] == later["status"] == "success"
    else:
        assert data["status"] == "accepted" and data["settled_status"] == "PENDING"
        assert why.split(":", maxsplit=1)[0] in data["reason"]
        assert later["status"] == "accepted"


def test_a_declared_confirmation_is_asked_for(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer
) -> None:
    async def go() -> dict[str, Any]:
        server = build_server(box(DeclaredToolbox))
        async with Client(server, elicitation_callback=answering("decline")) as c:
            return sc(await c.call_tool("sim_book", {"action_id": "d-1", "params": {}}))

    assert run(go)["settled_status"] == "PENDING"
    assert sim.requests_for("d-1") == []


def test_without_elicitation_a_shell_confirm_completes_it(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, ledger_path: Path
) -> None:
    box = box(confirm={"sim.book"})

    async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        async with Client(build_server(box)) as c:  # a client that cannot elicit
            return sc(await c.call_tool(name, args))

    first = run(lambda: call("sim_book", {"action_id": "p-1", "params": {}}))
    assert first["status"] == "accepted" and first["settled_status"] == "PENDING"
    assert first["reason"] == "awaiting a person's confirmation; nothing has been sent"
    assert sim.requests_for("p-1") == []
    p = run_cli("confirm", "p-1", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outcome"] == "dispatched"
    assert run(lambda: call("check_action", {"action_id": "p-1"}))["status"] == "success"
    again = run(lambda: call("sim_book", {"action_id": "p-1", "params": {}}))
    assert again["status"] == "success"
    assert len(sim.requests_for("p-1")) == 1
    with Ledger.open(ledger_path) as led:
        check(led, sim)


# ---------------------------------------------------------------------- errors


class BrokenToolbox(Toolbox):
    def check(self, action_id: Any) -> Any:
        raise RuntimeError("boom\nwith a second line")


def test_tool_errors_are_one_line_is_error_results(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer
) -> None:
    calls: Iterable[tuple[str, dict[str, Any], str]] = [
        ("nope", {}, "unknown tool 'nope'"),
        ("sim_send", {}, "action_id must be a string"),
        ("sim_send", {"action_id": 7}, "action_id must be a string"),
        ("sim_send", {"action_id": " x"}, "without surrounding spaces"),
        ("sim_send", {"action_id": "x", "to": "a"}, 'operation parameters go inside "params"'),
        ("sim_send", {"action_id": "x", "params": [1]}, "params must be a JSON object"),
        ("check_action", {"action_id": "missing"}, "no action 'missing'"),
        ("list_unresolved", {"limit": 0}, "limit must be a whole number"),
    ]

    async def go() -> list[tuple[str, types.CallToolResult]]:
        out = []
        async with Client(build_server(box()), mode="legacy") as c:
            for name, args, want in calls:
                out.append((want, await c.call_tool(name, args)))
        async with Client(build_server(box(BrokenToolbox))) as c:
            res = await c.call_tool("check_action", {"action_id": "x"})
            out.append(("internal error: RuntimeError: boom with a second line", res))
        return out

    for want, res in run(go):
        assert want in error_line(res)
    assert sim.truth()["requests"] == []


# ---------------------------------------------------------------------- resources


@pytest.mark.parametrize("mode", MODES)
def test_resources_show_the_queue_and_a_timeline(
    box: Callable[..., Toolbox], sim_config: Path, sim: SimServer, mode: str
) -> None:
    async def go() -> tuple[Any, ...]:
        async with Client(build_server(box()), mode=mode) as c:
            await c.call_tool("sim_notify", {"action_id": "blind-1", "params": {}})
            await c.call_tool("sim_book", {"action_id": "ok-1", "params": {}})
            unresolved = await c.call_tool("list_unresolved", {})
            listed = (await c.list_resources()).resources
            templates = (await c.list_resource_templates()).resource_templates
            queue = await c.read_resource("settled://queue")
            timeline = await c.read_resource("settled://actions/ok-1")
            errors = []
            for uri in ("settled://actions/missing", "settled://elsewhere"):
                with pytest.raises(MCPError) as info:
                    await c.read_resource(uri)
                errors.append(str(info.value))
            return unresolved, listed, templates, queue, timeline, errors

    unresolved, listed, templates, queue, timeline, errors = run(go)
    assert unresolved.structured_content["count"] == 1
    assert unresolved.structured_content["actions"][0]["status"] == "uncertain"
    assert [str(r.uri) for r in listed] == ["settled://queue"]
    assert [t.uri_template for t in templates] == ["settled://actions/{action_id}"]
    rows = json.loads(queue.contents[0].text)
    assert [(r["action_id"], r["agent_status"]) for r in rows] == [("blind-1", "uncertain")]
    data = json.loads(timeline.contents[0].text)
    assert data["agent_status"] == "success" and data["status"] == "CONFIRMED"
    assert [e["kind"] for e in data["events"]][:2] == ["recorded", "claimed"]
    assert "no action 'missing'" in errors[0] and "no resource" in errors[1]
    assert all("Traceback" not in e and "\n" not in e for e in errors)
