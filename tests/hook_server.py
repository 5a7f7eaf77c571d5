"""A test-only HTTP front for the callback core: ``POST /hooks/{provider}`` calls
``Hooks.handle`` and answers what it says, on 127.0.0.1, in a process of its own
(``settled serve`` mounts the same function). Run as ``python tests/hook_server.py
[--port N]``
with ``SETTLED_DB`` / ``SETTLED_CONFIG`` set; it prints its URL, then one JSON line per
request it answered (provider, status, reason; never the body)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from settled.session import Session


def main() -> int:
    session = Session()
    hooks = session.hooks()
    out = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            path, _, query = self.path.partition("?")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if not path.startswith("/hooks/"):
                self._answer(404, b'{"error":"no such route"}')
                return
            provider = path[len("/hooks/") :]
            got = hooks.handle(provider, "POST", list(self.headers.items()), body, query)
            with out:
                print(json.dumps({"provider": provider, "status": got.status,
                                  "reason": got.reason, "counts": got.counts}), flush=True)  # fmt: skip
            self._answer(got.status, got.content())

        def _answer(self, code: int, content: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
