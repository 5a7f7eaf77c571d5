"""Intent keys (rule 21) and approvals a model cannot grant itself: the template, its
checks at config load for every provider type, `settled dispatch` without --action-id,
`settled providers`, and the MCP tools, against a real sim provider on loopback and a
real ledger file."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from invariants import check
from mcp import Client
from support import popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.agents.mcp_server import build_server
from settled.errors import ConfigError, Conflict, InvalidInput
from settled.intent import compiled, parse
from settled.providers import Registry
from settled.providers.sim_server import SimServer
from settled.toolbox import Toolbox

KEYED = {"send": {"action_key": "receipt-{order_id}"}, "book": {"approval": "person"}}


def keyed_config(tmp_path: Path, sim: SimServer, ops: dict[str, Any] | None = None) -> Path:
    conf = sim_conf(sim, timeout=5.0)
    conf["operations"] = {k: dict(v) for k, v in (ops or KEYED).items()}
    return write_config(tmp_path / "settled.toml", {"sim": conf})


def run(fn: Callable[[], Awaitable[Any]], limit: float = 30.0) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(limit):
            return await fn()

    return anyio.run(bounded)


# ---------------------------------------------------------------------- the template


@pytest.mark.ledger_free
@pytest.mark.parametrize(
    ("template", "params", "made"),
    [
        ("receipt-{order_id}", {"order_id": 42}, "receipt-42"),
        ("receipt-{order_id}", {"order_id": "A-7", "to": "x"}, "receipt-A-7"),
        ("{customer.id}/welcome", {"customer": {"id": "c9"}}, "c9/welcome"),
        ("order-{order}-line-{line}", {"order": 7, "line": "3-b"}, "order-7-line-3-b"),
        ("{{literal}}-{a}", {"a": "x"}, "{literal}-x"),
    ],
)
def test_the_action_id_is_made_from_the_business_arguments(
    template: str, params: dict[str, Any], made: str
) -> None:
    assert parse("k", template).action_id(params) == made


@pytest.mark.ledger_free
@pytest.mark.parametrize(
    ("params", "why"),
    [
        ({}, "params need 'order'"),
        ({"order": 7}, "params need 'line'"),
        ({"order": "7-line-2", "line": 3}, "holds '-'"),  # would read as order 7, line 2-3
        ({"order": "", "line": 3}, "is empty"),
        ({"order": 1.5, "line": 3}, "is float"),
        ({"order": True, "line": 3}, "is bool"),
        ({"order": None, "line": 3}, "is null"),
        ({"order": {"a": 1}, "line": 3}, "is dict"),
        ({"order": 1, "line": "x" * 300}, "1-200 printable characters"),
        ({"order": 1, "line": "a\nb"}, "printable characters"),
    ],
)
def test_values_that_would_make_an_ambiguous_or_invalid_id_are_refused(
    params: dict[str, Any], why: str
) -> None:
    with pytest.raises(InvalidInput, match=why):
        parse("k", "order-{order}-line-{line}").action_id(params)


@pytest.mark.ledger_free
def test_no_two_sets_of_values_make_one_id() -> None:
    """Every id the template makes reads back as exactly one set of values."""
    key = compiled("o-{a}-{b}.{c}")
    seen: dict[str, tuple[str, str, str]] = {}
    alphabet = ["", "-", ".", "x", "x-", "-x", "x.y", "1"]
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                try:
                    made = key.action_id({"a": a, "b": b, "c": c})
                except InvalidInput:
                    continue
                assert seen.setdefault(made, (a, b, c)) == (a, b, c), made
    assert len(seen) > 20


@pytest.mark.ledger_free
@pytest.mark.parametrize(
    ("template", "schema", "why"),
    [
        ("receipt", None, "names no param"),
        ("{a}{b}", None, "put a separator between them"),
        ("x-{a b}", None, "is not a param"),
        ("x-{a", None, "stray"),
        (" x-{a}", None, "cannot make a valid action id"),
        (7, None, "must be a template"),
        ("r-{order}", {"type": "object", "properties": {"order_id": {}}}, "names no param"),
        (
            "r-{c.id}",
            {"type": "object", "properties": {"c": {"type": "object", "properties": {"n": {}}}}},
            "in c",
        ),
    ],
)
def test_a_bad_template_is_refused_at_load(template: Any, schema: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as exc:
        parse("operations.send.action_key", template, schema)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("operations.send.action_key")


@pytest.mark.ledger_free
def test_every_provider_type_takes_the_key_and_the_approval(sim: SimServer) -> None:
    http = {
        "type": "http",
        "base_url": sim.url,
        "operations": {
            "send": {
                "tier": "full",
                "request": {"method": "POST", "path": "/v1/book"},
                "object_id": "/id",
                "action_key": "r-{order_id}",
                "approval": "person",
            }
        },
    }
    reg = Registry({"sim": {**sim_conf(sim), "operations": KEYED}, "mail": http}, source="t.toml")
    try:
        assert reg.operation("sim", "send").action_key == "receipt-{order_id}"
        book = reg.operation("sim", "book")
        assert (book.approval, book.needs_confirmation) == ("person", True)
        assert reg.operation("sim", "deliver").action_key is None
        mail = reg.operation("mail", "send")
        assert (mail.action_key, mail.approval, mail.needs_confirmation) == (
            "r-{order_id}",
            "person",
            True,
        )
    finally:
        reg.close()


@pytest.mark.ledger_free
@pytest.mark.parametrize(
    ("ops", "why"),
    [
        ({"sned": {"action_key": "r-{a}"}}, "t.toml: providers.sim.operations.sned: sim has no"),
        ({"send": {"approval": "model"}}, "t.toml: providers.sim.operations.send.approval: 'm"),
        ({"send": {"action_key": "r"}}, "t.toml: providers.sim.operations.send.action_key: 'r"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_key(
    sim: SimServer, ops: dict[str, Any], why: str
) -> None:
    reg = Registry({"sim": {**sim_conf(sim), "operations": ops}}, source="t.toml")
    with pytest.raises(ConfigError) as exc:
        reg.load_all()
    assert str(exc.value).startswith(why) and "\n" not in str(exc.value)


# ---------------------------------------------------------------------- the CLI


def test_dispatch_without_an_action_id_reaches_one_record(
    tmp_path: Path, sim: SimServer, location: Any
) -> None:
    keyed_config(tmp_path, sim)
    params = json.dumps({"order_id": 42, "to": "ann@example.com"})
    first = run_cli("dispatch", "sim", "send", "--params", params, "--json")
    assert first.returncode == 3, first.stderr
    assert json.loads(first.stdout)["action_id"] == "receipt-42"
    assert "hint" not in first.stderr  # a re-run is safe: the key names the action
    again = run_cli("dispatch", "sim", "send", "--params", params, "--json")
    assert again.returncode == 3 and json.loads(again.stdout)["outcome"] == "in_progress"
    same = run_cli("dispatch", "sim", "send", "--params", params, "--action-id", "receipt-42")
    assert same.returncode == 3, same.stderr
    other = json.dumps({"order_id": 42, "to": "bob@example.com"})
    conflict = run_cli("dispatch", "sim", "send", "--params", other)
    assert conflict.returncode == 7 and conflict.stdout == ""
    assert conflict.stderr.count("\n") == 1 and "the intent 'receipt-42'" in conflict.stderr
    wrong = run_cli("dispatch", "sim", "send", "--params", params, "--action-id", "mine")
    assert wrong.returncode == 1 and "makes from these params ('receipt-42')" in wrong.stderr
    missing = run_cli("dispatch", "sim", "send", "--params", '{"to": "x"}')
    assert missing.returncode == 1 and "params need 'order_id'" in missing.stderr
    assert len(sim.requests_for("receipt-42")) == 1
    with Ledger.open(location) as led:
        assert [r.action_id for r in led.query()] == ["receipt-42"]  # refusals left nothing
        check(led, sim, final=False)


def test_one_intent_from_racing_processes_is_sent_once(
    tmp_path: Path, sim: SimServer, location: Any
) -> None:
    keyed_config(tmp_path, sim)
    params = json.dumps({"order_id": 7, "to": "ann@example.com"})
    procs = [popen_cli("dispatch", "sim", "send", "--params", params) for _ in range(4)]
    for p in procs:
        p.communicate(timeout=60)
    assert [p.returncode for p in procs] == [3, 3, 3, 3]
    assert len(sim.requests_for("receipt-7")) == 1
    with Ledger.open(location) as led:
        check(led, sim, final=False)


def test_providers_shows_the_key(tmp_path: Path, sim: SimServer) -> None:
    keyed_config(tmp_path, sim)
    listed = run_cli("providers", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["operation"]: r for r in json.loads(listed.stdout)}
    assert rows["send"]["action_key"] == "receipt-{order_id}"
    assert rows["deliver"]["action_key"] is None
    assert (rows["book"]["approval"], rows["book"]["needs_confirmation"]) == ("person", True)
    table = run_cli("providers")
    head, *lines = table.stdout.splitlines()
    at = head.split("\t").index("action key")
    assert {ln.split("\t")[1]: ln.split("\t")[at] for ln in lines}["send"] == "receipt-{order_id}"


# ---------------------------------------------------------------------- MCP and Python


@pytest.fixture
def box(tmp_path: Path, sim: SimServer) -> Iterator[Toolbox]:
    keyed_config(tmp_path, sim)
    with Toolbox(actor="mcp", pool=2) as made:
        yield made


def _walk(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for name, sub in (schema.get("properties") or {}).items():
            yield name
            yield from _walk(sub)


@pytest.mark.ledger_incidental
def test_no_tool_input_can_approve_and_keyed_tools_take_no_action_id(box: Toolbox) -> None:
    async def go() -> list[types.Tool]:
        async with Client(build_server(box)) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in run(go)}
    for t in tools.values():
        names = set(_walk(t.input_schema))
        assert not names & {"confirm", "confirmed", "approve", "approved", "approval"}, t.name
    send = tools["sim_send"].input_schema
    assert set(send["properties"]) == {"params"} and send["required"] == ["params"]
    assert send["properties"]["params"]["required"] == ["order_id"]
    assert "action key 'receipt-{order_id}'" in (tools["sim_send"].description or "")
    assert "no client can approve it" in (tools["sim_book"].description or "")
    assert set(tools["sim_deliver"].input_schema["properties"]) == {"action_id", "params"}


def test_a_replanned_call_and_the_cli_reach_one_send(
    box: Toolbox, sim: SimServer, location: Any
) -> None:
    async def go() -> list[types.CallToolResult]:
        async with Client(build_server(box)) as c:
            args = {"params": {"order_id": 5, "to": "ann@example.com"}}
            first = await c.call_tool("sim_send", args)
            replanned = await c.call_tool("sim_send", args)  # a new call id, the same intent
            minted = await c.call_tool("sim_send", {**args, "action_id": "fresh-id"})
            other = await c.call_tool("sim_send", {"params": {"order_id": 5, "to": "bob@x"}})
            return [first, replanned, minted, other]

    first, replanned, minted, other = run(go)
    assert first.structured_content["action_id"] == "receipt-5"  # type: ignore[index]
    assert first.structured_content["status"] == "accepted"  # type: ignore[index]
    assert "repeated intent: nothing sent again" in replanned.content[0].text  # type: ignore[union-attr]
    assert minted.is_error and "unexpected argument 'action_id'" in minted.content[0].text  # type: ignore[union-attr]
    assert other.is_error and "the intent 'receipt-5'" in other.content[0].text  # type: ignore[union-attr]
    p = run_cli("dispatch", "sim", "send", "--params", '{"order_id": 5, "to": "ann@example.com"}')
    assert p.returncode == 3, p.stderr
    assert len(sim.requests_for("receipt-5")) == 1
    with Ledger.open(location) as led:
        check(led, sim, final=False)


@pytest.mark.ledger_incidental
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_person_only_approval_never_asks_the_client(
    box: Toolbox, sim: SimServer, location: Any, mode: str
) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def go() -> types.CallToolResult:
        async with Client(build_server(box), mode=mode, elicitation_callback=elicit) as c:
            return await c.call_tool("sim_book", {"action_id": f"p-{mode}", "params": {}})

    res = run(go)
    data = res.structured_content
    assert asked == [] and sim.requests_for(f"p-{mode}") == []
    assert (data["status"], data["settled_status"]) == ("accepted", "PENDING")  # type: ignore[index]
    assert "only a person can approve it" in res.content[0].text  # type: ignore[union-attr]
    p = run_cli("confirm", f"p-{mode}")
    assert p.returncode == 0, p.stderr
    assert len(sim.requests_for(f"p-{mode}")) == 1


def test_a_refusal_is_recorded_and_sends_nothing(
    tmp_path: Path, sim: SimServer, location: Any
) -> None:
    keyed_config(tmp_path, sim, {"book": {"approval": "client"}})

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    with Toolbox(actor="mcp", pool=1) as tb:

        async def go() -> types.CallToolResult:
            async with Client(build_server(tb), elicitation_callback=elicit) as c:
                return await c.call_tool("sim_book", {"action_id": "r-1", "params": {}})

        res = run(go)
    assert "the person declined: nothing was sent" in res.content[0].text  # type: ignore[union-attr]
    assert sim.requests_for("r-1") == []
    with Ledger.open(location) as led:
        events = led.events("r-1")
        check(led, sim, final=False)
    refusal = [e for e in events if e.kind == "note"]
    assert len(refusal) == 1 and refusal[0].detail["approval"] == "not given"
    assert refusal[0].detail["reason"] == "the person declined"


@pytest.mark.ledger_incidental
def test_an_approval_binds_to_the_params_it_showed(box: Toolbox, sim: SimServer) -> None:
    op = box.operation("sim", "book")
    sub = box.submit(op, "bound-1", {"slot": "10:00"})
    with pytest.raises(Conflict, match="no longer has the params the person approved"):
        box.confirm("bound-1", params_hash="0" * 64)
    assert sim.requests_for("bound-1") == []
    ok = box.confirm("bound-1", params_hash=sub.record.params_hash)
    assert ok.status == "success" and len(sim.requests_for("bound-1")) == 1


@pytest.mark.ledger_incidental
def test_python_tools_take_the_params_alone(box: Toolbox, sim: SimServer) -> None:
    import settled

    send = settled.tool("sim", "send", config=os.environ["SETTLED_CONFIG"])
    first = send(order_id=9, to="ann@example.com")
    again = send(order_id=9, to="ann@example.com")
    assert first.action_id == again.action_id == "receipt-9"
    assert len(sim.requests_for("receipt-9")) == 1
    approve = settled.tool("sim", "book", confirm=lambda q: True)  # code is not a person
    held = approve("b-9", slot="9")
    assert (held.status, held.settled_status) == ("accepted", "PENDING")
    assert sim.requests_for("b-9") == []


@pytest.mark.ledger_incidental
def test_a_failed_intent_names_the_retry_a_person_can_make(box: Toolbox, sim: SimServer) -> None:
    op = box.operation("sim", "send")
    sim.plan("receipt-66", "reject")
    first = box.submit(op, None, {"order_id": 66, "to": "a@x.org"}).result
    again = box.submit(op, None, {"order_id": 66, "to": "a@x.org"}).result
    assert first.status == again.status == "failed"
    assert again.text.endswith("`settled retry receipt-66` opens a new attempt of this intent")
    assert len(sim.requests_for("receipt-66")) == 1
