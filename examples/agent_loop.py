"""An agent loop with no LLM: a scripted policy plays the model, settled's MCP server
plays the tools, the simulated provider plays the world.

    python examples/agent_loop.py          # needs: pip install 'settled[mcp]'

1. The model sends a receipt mail. The provider says 202 "queued" and then loses it.
   The model's context receives ``accepted``, then ``uncertain`` -- never ``success``.
2. The model books a slot that needs the user's confirmation. While the user is
   answering, a background job (``settled confirm`` in another process) confirms the
   same booking. Both go through one atomic claim: exactly one booking is made.

Everything runs on loopback in a temporary directory; the script exits 1 if any of
these promises is broken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

from settled.agents.mcp_server import build_server
from settled.providers.sim_server import SimServer
from settled.toolbox import Toolbox

CONFIG = """\
[providers.mail]
type = "sim"
base_url = "{url}"
consistency_window = 0.2   # s before the first check
verify_interval = 0.1      # s between checks
verify_deadline = 1.0      # s of checks before the answer is "nobody knows"
attempts = 1

[providers.calendar]
type = "sim"
base_url = "{url}"
attempts = 1
"""


class ScriptedModel:
    """Acts like a model: reads tool results from its context and picks the next call.
    It believes what the tools say, exactly as a model would."""

    def __init__(self) -> None:
        self.context: list[dict[str, Any]] = []

    def see(self, call: str, result: types.CallToolResult) -> dict[str, Any]:
        seen = dict(result.structured_content or {})
        text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
        self.context.append({"call": call, "status": seen.get("status"), "text": text})
        print(f"  model context <- {call}: {text}")
        return seen

    def says(self, line: str) -> None:
        self.context.append({"reply": line})
        print(f"  model -> user: {line}")


def reply_for(status: str, what: str) -> str:
    """What a model that trusts its tools tells the user."""
    return {
        "success": f"Done: {what}.",
        "accepted": f"{what}: accepted, not confirmed yet.",
        "uncertain": f"I cannot confirm {what}; it is marked unresolved for a person to check.",
        "failed": f"{what} did not happen.",
    }[status]


async def poll(client: Client, model: ScriptedModel, action_id: str, limit: float) -> str:
    """check_action until the status is no longer 'accepted' (or the time is up)."""
    deadline = time.monotonic() + limit
    status = "accepted"
    while status == "accepted" and time.monotonic() < deadline:
        await anyio.sleep(0.25)
        res = await client.call_tool("check_action", {"action_id": action_id})
        status = model.see("check_action", res)["status"]
    return status


async def lost_mail(client: Client, model: ScriptedModel, sim: SimServer) -> bool:
    print("1. a receipt mail the provider accepts and then loses")
    sim.plan("receipt-42", "lost_after_accept")
    res = await client.call_tool(
        "mail_send",
        {"action_id": "receipt-42", "params": {"to": "ann@example.com", "subject": "Receipt"}},
    )
    first = model.see("mail_send", res)["status"]
    final = await poll(client, model, "receipt-42", limit=10)
    model.says(reply_for(final, "the receipt mail"))
    statuses = [c.get("status") for c in model.context if c.get("call")]
    ok = first == "accepted" and final == "uncertain" and "success" not in statuses
    print(f"   statuses seen: {statuses} -> {'ok' if ok else 'BROKEN'}")
    return ok


class User:
    """The person at the keyboard. Asked to confirm the booking, they take a moment;
    meanwhile a background job (``settled confirm``, in its own process) confirms the
    same pending booking."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.background: list[subprocess.Popen[str]] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        print(f"  user is asked: {params.message}")
        self.background.append(
            subprocess.Popen(
                [sys.executable, "-m", "settled", "confirm", "slot-7", "--json"],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        await anyio.sleep(0.25)  # the job starts up while the user reaches for the button
        return types.ElicitResult(action="accept", content={"confirm": True})


async def raced_booking(client: Client, model: ScriptedModel, sim: SimServer, user: User) -> bool:
    print("2. a booking whose user confirmation races a background job")
    res = await client.call_tool(
        "calendar_book", {"action_id": "slot-7", "params": {"slot": "Tue 10:00", "who": "Ann"}}
    )
    status = model.see("calendar_book", res)["status"]
    if status == "accepted":
        status = await poll(client, model, "slot-7", limit=10)
    model.says(reply_for(status, "the Tuesday 10:00 booking"))
    for job in user.background:
        out, _ = job.communicate(timeout=30)
        outcome = json.loads(out).get("outcome") if out.strip() else f"exit {job.returncode}"
        print(f"  background job: settled confirm -> {outcome}")
    bookings = sim.effects_for("slot-7")
    sent = len(sim.requests_for("slot-7"))
    ok = bookings == 1 and sent == 1 and status == "success" and len(user.background) == 1
    print(f"   bookings made: {bookings}, requests sent: {sent} -> {'ok' if ok else 'BROKEN'}")
    return ok


async def run(workdir: Path, sim: SimServer) -> bool:
    config = workdir / "settled.toml"
    config.write_text(CONFIG.format(url=sim.url))
    db = workdir / "settled.db"
    env = dict(os.environ, SETTLED_DB=str(db), SETTLED_CONFIG=str(config))
    # The server as `settled mcp` builds it, in this process. The booking needs a
    # person's confirmation: Toolbox(confirm=...) adds that here; an operation can also
    # declare it.
    toolbox = Toolbox(
        db=str(db), config_path=str(config), actor="mcp", confirm={"calendar.book"}, pool=4
    )
    model, user = ScriptedModel(), User(env)
    with toolbox, anyio.fail_after(60):
        async with Client(build_server(toolbox), elicitation_callback=user) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            print(f"tools: {', '.join(names)}")
            first = await lost_mail(client, model, sim)
            second = await raced_booking(client, model, sim, user)
    return first and second


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, SimServer(hang=1.0) as sim:
        ok = anyio.run(run, Path(tmp), sim)
    print("all promises kept" if ok else "A PROMISE WAS BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
