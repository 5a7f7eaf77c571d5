"""The floor for ``settled serve``: a raw Starlette handler under uvicorn doing the same
durable work per dispatch (record + claim in one transaction, the POST to the provider,
the outcome in another; raw sqlite3 and raw httpx, the same statements settled issues),
and nothing else: no auth, no checks, no validation, no log.

    python -m bench._serve_raw LEDGER SIM_URL     # prints its URL on stdout, then serves
"""

from __future__ import annotations

import socket
import sys
import threading

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .ledger_ops import raw_conn, raw_outcome, raw_record_claim


def main() -> None:
    path, sim = sys.argv[1], sys.argv[2]
    conn = raw_conn(path)
    conn.close()  # the pragmas are the file's; the handler's threads each open their own
    local = threading.local()
    lock = threading.Lock()  # one writer at a time, as SQLite allows

    client = httpx.Client()

    def work(aid: str, params: dict) -> None:
        if not hasattr(local, "conn"):
            local.conn = raw_conn(path)
        conn = local.conn
        with lock:
            raw_record_claim(conn, aid)
        r = client.post(f"{sim}/v1/book", json={"action_id": aid, "reconciliation_key": "stl-" + aid,
                                                "params": params},
                        headers={"Idempotency-Key": aid + ":1"}, timeout=5.0)  # fmt: skip
        assert r.status_code == 201
        with lock:
            raw_outcome(conn, aid)

    async def dispatch(request: Request) -> JSONResponse:
        body = await request.json()
        await run_in_threadpool(work, body["action_id"], body.get("params", {}))
        return JSONResponse(
            {"action_id": body["action_id"], "status": "CONFIRMED"}, status_code=201
        )

    app = Starlette(routes=[Route("/dispatch", dispatch, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
