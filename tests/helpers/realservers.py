"""Real servers for the provider tests, started and stopped by the tests themselves on
loopback, and a fault proxy that sits between settled and them.

- ``json_server()``: npm's ``json-server@0.17.4``, installed into a cache folder on
  first use (``npm install --prefix``); ``None`` when npm is absent.
- ``datasette()``: Datasette 1.0's JSON write API, with a signed token.
- ``radicale()``: a CalDAV server.
- ``FaultProxy``: forwards one request per connection; for each request whose method
  it watches it takes the next planned fault: ``pass``, ``drop`` (forward, then cut the
  client off: the effect happens, the reply is lost), ``delay_before:S`` (hold the
  request S seconds, then forward it, whoever still listens), ``delay_after:S`` (forward,
  hold the reply S seconds), ``502`` (answer 502 without forwarding) and ``502_after``
  (forward, then answer 502 instead of the reply).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import httpx

JSON_SERVER = "json-server@0.17.4"
STARTUP = 30.0  # s: the longest a server may take to listen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def process(
    args: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_listening(port, proc, log)
            yield
        finally:
            proc.kill()
            proc.wait(timeout=10)


# -- json-server ---------------------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("SETTLED_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "settled-tests"
    )
    return Path(base)


def json_server_bin() -> Path | None:
    """The json-server entry point, installed with npm on first use; None without npm."""
    prefix = cache_dir() / "json-server-0.17.4"
    entry = prefix / "node_modules" / "json-server" / "lib" / "cli" / "bin.js"
    if entry.exists():
        return entry
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", JSON_SERVER],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return entry


@contextlib.contextmanager
def json_server(folder: Path, entry: Path) -> Iterator[str]:
    db = folder / "db.json"
    db.write_text('{"orders": []}\n')
    port = free_port()
    node = shutil.which("node") or "node"
    args = [node, str(entry), "--port", str(port), "--host", "127.0.0.1", str(db)]
    with process(args, port, folder / "json-server.log"):
        yield f"http://127.0.0.1:{port}"


# -- axe-core -------------------------------------------------------------------------------------

AXE_CORE = "axe-core@4.10.3"


def axe_core_js() -> Path | None:
    """axe-core's ``axe.min.js`` (the accessibility engine the console's browser tests
    run in the page), installed with npm on first use; None without npm."""
    prefix = cache_dir() / AXE_CORE.replace("@", "-")
    entry = prefix / "node_modules" / "axe-core" / "axe.min.js"
    if entry.exists():
        return entry
    npm = shutil.which("npm")
    if npm is None:
        return None
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", AXE_CORE],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return entry


# -- Datasette ------------------------------------------------------------------------------------

DATASETTE_SECRET = "settled-test-secret"


@contextlib.contextmanager
def datasette(folder: Path) -> Iterator[tuple[str, str]]:
    """``(base URL, token)``: database ``shop``, table ``orders(ref primary key, ...)``,
    and a token for ``root``, who may insert rows."""
    with sqlite3.connect(folder / "shop.db") as c:
        c.execute("CREATE TABLE orders (ref TEXT PRIMARY KEY, item TEXT, qty INTEGER)")
    (folder / "datasette.yaml").write_text(
        "permissions:\n  insert-row:\n    id: root\n  view-instance:\n    id: '*'\n"
    )
    port = free_port()
    exe = [sys.executable, "-m", "datasette"]
    args = [*exe, "serve", str(folder / "shop.db"), "-c", str(folder / "datasette.yaml")]
    args += ["--secret", DATASETTE_SECRET, "--port", str(port), "-h", "127.0.0.1"]
    token = subprocess.run(
        [*exe, "create-token", "root", "--secret", DATASETTE_SECRET],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    with process(args, port, folder / "datasette.log"):
        yield f"http://127.0.0.1:{port}", token


# -- Radicale -------------------------------------------------------------------------------------


@contextlib.contextmanager
def radicale(folder: Path) -> Iterator[str]:
    port = free_port()
    config = folder / "config"
    config.write_text(
        "[server]\n"
        f"hosts = 127.0.0.1:{port}\n"
        "[auth]\ntype = none\n"
        "[rights]\ntype = authenticated\n"
        f"[storage]\nfilesystem_folder = {folder / 'collections'}\n"
        "[logging]\nlevel = error\n"
    )
    args = [sys.executable, "-m", "radicale", "--config", str(config)]
    with process(args, port, folder / "radicale.log"):
        yield f"http://127.0.0.1:{port}"


# -- the fault proxy ---------------------------------------------------------------------------------

FAULTS = ("pass", "drop", "delay_before", "delay_after", "502", "502_after")
BAD_GATEWAY = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n"
    b"Connection: close\r\n\r\nbad gateway"
)


class FaultProxy:
    def __init__(
        self, upstream: str, methods: tuple[str, ...] = ("POST", "PUT", "PATCH", "DELETE")
    ) -> None:
        url = httpx.URL(upstream)
        self.upstream = (url.host, url.port or 80)
        self.methods = tuple(m.encode() for m in methods)
        self.faults: deque[str] = deque()
        self.log: list[tuple[str, bytes]] = []  # (fault, request line)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def plan(self, *faults: str) -> None:
        for f in faults:
            assert f.split(":")[0] in FAULTS, f
        with self._lock:
            self.faults.extend(faults)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every held request has been forwarded and answered."""
        stop = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, stop - time.monotonic()))

    def close(self) -> None:
        self.settle()
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    @staticmethod
    def _read_request(sock: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        # One request per connection: ask the upstream to close, then read to the end.
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(request)
            reply = b""
            while chunk := up.recv(65536):
                reply += chunk
        return reply

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = self._read_request(conn)
            except OSError:
                return
            if not request:
                return
            fault = "pass"
            if request.split(b" ", 1)[0] in self.methods:
                with self._lock:
                    fault = self.faults.popleft() if self.faults else "pass"
            kind, _, arg = fault.partition(":")
            self.log.append((fault, request.split(b"\r\n", 1)[0]))
            try:
                if kind == "502":
                    conn.sendall(BAD_GATEWAY)
                    return
                if kind == "delay_before":
                    time.sleep(float(arg))
                reply = self._forward(request)
                if kind == "drop":
                    conn.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
                    return  # reset: the effect happened, the answer is lost
                if kind == "502_after":
                    conn.sendall(BAD_GATEWAY)
                    return
                if kind == "delay_after":
                    time.sleep(float(arg))
                conn.sendall(reply)
            except OSError:
                return
