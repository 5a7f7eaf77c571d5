"""The floor for ``settled serve``: a raw Starlette handler under uvicorn doing the same
durable work per dispatch (record + claim in one transaction, the POST to the provider,
the outcome in another; raw sqlite3 and raw httpx, the same statements settled issues),
and per callback (the Standard Webhooks signature checked over the raw body by the
reference package; then in one transaction: the callback's row, the record it names
read, moved to CONFIRMED and given its event, the row marked matched), and nothing
else: no auth, no Host/Origin checks, no config-driven reading, no log.

    python -m bench._serve_raw LEDGER SIM_URL     # prints its URL on stdout, then serves

The callbacks' secret is ``SETTLED_BENCH_HOOK_SECRET`` (``whsec_...``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
from datetime import UTC, datetime

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
        r = client.post(
            f"{sim}/v1/book",
            json={"action_id": aid, "reconciliation_key": "stl-" + aid, "params": params},
            headers={"Idempotency-Key": aid + ":1"},
            timeout=5.0,
        )
        assert r.status_code == 201
        with lock:
            raw_outcome(conn, aid)

    async def dispatch(request: Request) -> JSONResponse:
        body = await request.json()
        await run_in_threadpool(work, body["action_id"], body.get("params", {}))
        return JSONResponse(
            {"action_id": body["action_id"], "status": "CONFIRMED"}, status_code=201
        )

    from standardwebhooks.webhooks import Webhook

    hook = Webhook(
        os.environ.get("SETTLED_BENCH_HOOK_SECRET", "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZg==")
    )

    def take(event_id: str, object_id: str, status: str, digest: str) -> None:
        if not hasattr(local, "conn"):
            local.conn = raw_conn(path)
        conn = local.conn
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute(
                "INSERT INTO callbacks (provider, event_id, scheme, names, key, status, reported,"
                " digest, item, received_at, expires_at, state, next_check_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(provider, event_id) DO NOTHING",
                (
                    "sim",
                    event_id,
                    "standard-webhooks",
                    "provider_object_id",
                    object_id,
                    status,
                    "applied",
                    digest,
                    0,
                    at,
                    at,
                    "pending",
                    at,
                ),
            )
            if cur.rowcount == 1:
                row = conn.execute(
                    "SELECT action_id, status, attempt FROM actions WHERE provider = ?"
                    " AND provider_object_id = ? LIMIT 2",
                    ("sim", object_id),
                ).fetchall()
                aid, frm, attempt = row[0]
                detail = {
                    "scheme": "standard-webhooks",
                    "event_id": event_id,
                    "names": "provider_object_id",
                    "key": object_id,
                    "status": status,
                    "reported": "applied",
                    "body_sha256": digest,
                    "item": 0,
                }
                conn.execute(
                    "INSERT INTO events (action_id, at, actor, kind, from_status, to_status,"
                    " attempt, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        aid,
                        at,
                        "callback:sim",
                        "callback",
                        frm,
                        "CONFIRMED",
                        attempt,
                        json.dumps(detail),
                    ),
                )
                conn.execute(
                    "UPDATE actions SET acceptance = ?, delivery = ?, confirmed_at = ?,"
                    " confirmed_by = ?, next_check_at = NULL, lease_owner = NULL, reason = NULL,"
                    " check_error = NULL, status = ?, updated_at = ? WHERE action_id = ?"
                    " AND status = ?",
                    ("ACCEPTED", "DELIVERED", at, "callback:sim", "CONFIRMED", at, aid, frm),
                )
                conn.execute(
                    "UPDATE callbacks SET state = 'matched', action_id = ?, attempt = ?,"
                    " matched_at = ?, next_check_at = NULL WHERE provider = ? AND event_id = ?",
                    (aid, attempt, at, "sim", event_id),
                )
            conn.execute("COMMIT")

    async def callback(request: Request) -> JSONResponse:
        body = await request.body()
        event = hook.verify(body, dict(request.headers))  # raises on a bad signature
        digest = hashlib.sha256(body).hexdigest()
        data = event["data"]
        await run_in_threadpool(
            take, request.headers["webhook-id"], data["id"], data["status"], digest
        )
        return JSONResponse({"received": 1, "matched": 1})

    app = Starlette(
        routes=[
            Route("/dispatch", dispatch, methods=["POST"]),
            Route("/hooks/sim", callback, methods=["POST"]),
        ]
    )
    sock = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # TCP_NODELAY, as serve
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
