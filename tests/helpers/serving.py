"""What the tests of `settled serve` share: a config with API tokens, the service in
process (Starlette's TestClient over the real ASGI app and a real ledger), and the
service as a real OS process on 127.0.0.1 whose JSON log is read as it comes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from support import ROOT, popen_cli, sim_conf, write_config

from settled.providers.sim_server import SimServer

# name -> (secret, roles); the secrets are read from these environment variables
TOKENS = {
    "reader": ("r" * 20, ["read"]),
    "sender": ("s" * 20, ["dispatch"]),
    "ops": ("o" * 20, ["operate"]),
    "app": ("a" * 20, ["dispatch", "operate"]),
}
PORT = 8780


def env_name(name: str) -> str:
    return f"SETTLED_TEST_TOKEN_{name.upper()}"


def token_env() -> dict[str, str]:
    return {env_name(n): secret for n, (secret, _roles) in TOKENS.items()}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name][0]}"}


def write_serve_config(
    path: Path,
    sim: SimServer,
    *,
    tokens: bool = True,
    sim_over: dict[str, Any] | None = None,
    **serve: Any,
) -> Path:
    """settled.toml: the `sim` provider at ``sim``, and [serve] with the test tokens."""
    sections: dict[str, dict[str, Any]] = {}
    if serve:
        sections["serve"] = serve
    if tokens:
        for name, (_secret, roles) in TOKENS.items():
            sections[f"serve.tokens.{name}"] = {"secret": f"${{{env_name(name)}}}", "roles": roles}
    return write_config(path, {"sim": sim_conf(sim, **(sim_over or {}))}, **sections)


def path_of(action_id: str) -> str:
    """An action's API path: the id as one percent-encoded segment ('.' too, so that no
    client or proxy treats '.' or '..' as a dot segment)."""
    return "/api/v1/actions/" + quote(action_id, safe="").replace(".", "%2E")


@dataclass
class Lines:
    """A log to read from: in process, the list the service wrote to."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, entry: dict[str, Any]) -> None:
        # as json_lines writes it: the line must serialize
        self.entries.append(json.loads(json.dumps(entry, ensure_ascii=False, default=str)))

    def requests(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["event"] == "request"]


@contextmanager
def in_process(
    *, reconcile: bool = False, mcp: bool = True, pool: int = 4
) -> Iterator[tuple[Any, Lines]]:
    """A TestClient on the service's real ASGI app (SETTLED_DB / SETTLED_CONFIG as the
    test set them), with its lifespan running; and its log."""
    from starlette.testclient import TestClient

    from settled.agents.mcp_server import SettledMCP
    from settled.serve.asgi import build
    from settled.serve.run import open_service

    lines = Lines()
    service = open_service(host="127.0.0.1", port=PORT, reconcile=reconcile, log=lines, pool=pool)
    try:
        server = SettledMCP(service.toolbox, debug=service.debug).server() if mcp else None
        app = build(service, mcp=server)
        with TestClient(
            app, base_url=f"http://127.0.0.1:{PORT}", raise_server_exceptions=True
        ) as client:
            client.service = service  # type: ignore[attr-defined]  # for a test's clock
            yield client, lines
    finally:
        service.close()


# ------------------------------------------------------------------ a real process


@dataclass
class Running:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    listening: dict[str, Any] = field(default_factory=dict)

    def next_event(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for the next log line of this event (a generous bound, never a sleep)."""
        deadline = time.monotonic() + timeout
        for entry in self.seen:
            if entry.get("event") == event and not entry.get("_taken"):
                entry["_taken"] = True
                return entry
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {event!r} line within {timeout} s; saw {self.seen[-10:]}")
            try:
                raw = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if raw == "":
                raise AssertionError(f"the service ended before {event!r}; saw {self.seen[-10:]}")
            entry = json.loads(raw)  # every stderr line is one JSON object
            self.seen.append(entry)
            if entry.get("event") == event:
                entry["_taken"] = True
                return entry

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def rest(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Every line after the process ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                raw = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            if raw == "":
                break
            self.seen.append(json.loads(raw))
        return self.seen


def _pump(stream: Any, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)
    into.put("")


@contextmanager
def process(
    *args: str,
    env: dict[str, str] | None = None,
    listen: str = "127.0.0.1:0",
    preexec: Callable[[], None] | None = None,
) -> Iterator[Running]:
    """`settled serve --listen LISTEN ARGS` as a real process, once it listens (a free
    port unless ``listen`` names one: a Twilio hook's URL is signed, so it is known first).
    ``preexec`` runs in the child before it starts (a resource limit, say): the process
    is then a fresh interpreter, not one forked from the suite's zygote."""
    full = {**token_env(), **(env or {})}
    if preexec is None:
        proc: Any = popen_cli("serve", "--listen", listen, *args, env=full)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-m", "settled", "serve", "--listen", listen, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **full},
            cwd=str(ROOT),
            preexec_fn=preexec,  # noqa: PLW1509  (a test's: only setrlimit and the like)
        )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    reader = threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True)
    reader.start()
    running = Running(proc, lines)
    try:
        running.listening = running.next_event("listening", timeout=120)
        running.url = running.listening["url"]
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
