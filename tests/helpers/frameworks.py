"""What the framework integration tests share: a settled.toml for the sim provider
with an intent key and a confirmation, and bounded waits on the ledger."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import PATIENT, sim_conf, write_config

from settled import Ledger
from settled.providers.sim_server import SimServer

# sim.send: a receipt per order (rule 21); sim.book: a person confirms, asked by the
# framework; sim.deliver: only a person through settled confirms it.
OPERATIONS = {
    "send": {"action_key": "receipt-{order_id}"},
    "book": {"action_key": "slot-{slot}", "approval": "client"},
    "deliver": {"approval": "person"},
}


def configure(tmp_path: Path, sim: SimServer, **over: Any) -> Path:
    """settled.toml for these tests, at SETTLED_CONFIG (the autouse fixture's path)."""
    conf = sim_conf(sim, timeout=PATIENT, verify_deadline=2.0, **over)
    conf["operations"] = {k: dict(v) for k, v in OPERATIONS.items()}
    return write_config(tmp_path / "settled.toml", {"sim": conf})


def status(action_id: str) -> str:
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        rec = led.find(action_id)
    return "missing" if rec is None else str(rec.status)


def events(action_id: str) -> list[Any]:
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        return led.events(action_id)


def until(what: Callable[[], Any], limit: float = 20.0) -> Any:
    """``what()`` once it is truthy, checked every 20 ms for at most ``limit`` s."""
    end = time.monotonic() + limit
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        threading.Event().wait(0.02)


def release_event_loop() -> None:
    """Close the event loop ``Agent.run_sync`` leaves as this thread's current one:
    PydanticAI makes one and never closes it, and the next ``asyncio.run`` drops it
    unclosed (a ResourceWarning in whichever test collects it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    asyncio.set_event_loop(None)
