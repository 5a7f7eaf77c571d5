"""``settled serve``: API dispatches per second over HTTP, against a raw Starlette handler
under uvicorn doing the same ledger writes and the same provider POST (bench._serve_raw),
both real processes on 127.0.0.1 against the sim in a third, one keep-alive client
posting in turn, interleaved in chunks in the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .common import Row, remove_db
from .fixtures import new_ledger
from .http_e2e import sim_process
from .ledger_ops import interleave_many

TOKEN = "bench-token-0123456789abcdef"


@contextmanager
def _service(cmd: list[str], env: dict[str, str], listening: str) -> Iterator[str]:
    """A server process, once it says where it listens (the serve's JSON line, or the
    raw one's URL on stdout); its output drained until it ends."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stream = proc.stderr if listening == "json" else proc.stdout
        assert stream is not None
        url = ""
        for line in stream:
            if listening == "json":
                entry = json.loads(line)
                if entry.get("event") == "listening":
                    url = entry["url"]
                    break
            elif line.startswith("http://"):
                url = line.strip()
                break
        if not url:
            raise RuntimeError(f"{cmd[2]} did not start (exit {proc.wait()})")
        for pipe in (proc.stdout, proc.stderr):
            threading.Thread(target=pipe.read, daemon=True).start()  # type: ignore[union-attr]
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def api_dispatch(tmp: str, n: int, repeats: int) -> list[Row]:
    """One service and one raw server for all repeats (each start costs seconds), each
    repeat with ids of its own."""
    import httpx

    sett, base = [], []
    path, rpath = os.path.join(tmp, "serve.db"), os.path.join(tmp, "serve-raw.db")
    conf = os.path.join(tmp, "serve.toml")
    remove_db(path)
    remove_db(rpath)
    new_ledger(rpath)
    with sim_process() as sim:
        with open(conf, "w") as fh:
            fh.write(
                f'[providers.sim]\ntype = "sim"\nbase_url = "{sim}"\ntimeout = 5.0\n'
                '[serve.tokens.bench]\nsecret = "${SETTLED_BENCH_TOKEN}"\nroles = ["dispatch"]\n'
            )
        env = {
            **os.environ,
            "SETTLED_DB": path,
            "SETTLED_CONFIG": conf,
            "SETTLED_BENCH_TOKEN": TOKEN,
        }
        serve_cmd = [sys.executable, "-m", "settled", "serve", "--listen", "127.0.0.1:0"]
        raw_cmd = [sys.executable, "-m", "bench._serve_raw", rpath, sim]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with (
            _service(serve_cmd, env, "json") as url,
            _service(raw_cmd, env, "url") as raw,
            httpx.Client(timeout=30) as c,
        ):

            def settled_op(i: int, tag: str = "w") -> None:
                resp = c.post(
                    f"{url}/api/v1/actions",
                    headers=auth,
                    json={
                        "provider": "sim",
                        "operation": "book",
                        "action_id": f"s{tag}-{i}",
                        "params": {"to": "customer@example.com", "n": i},
                    },
                )
                assert resp.status_code == 201 and resp.json()["status"] == "CONFIRMED", resp.text

            def raw_op(i: int, tag: str = "w") -> None:
                resp = c.post(
                    f"{raw}/dispatch",
                    json={
                        "action_id": f"raw{tag}-{i}",
                        "params": {"to": "customer@example.com", "n": i},
                    },
                )
                assert resp.status_code == 201

            settled_op(-1)  # warm both: connections, pools, first-use imports
            raw_op(-1)
            for r in range(repeats):
                order = ["raw", "settled"] if r % 2 else ["settled", "raw"]
                ops = {
                    "settled": lambda i, r=r: settled_op(i, str(r)),
                    "raw": lambda i, r=r: raw_op(i, str(r)),
                }
                rates = interleave_many(n, ops, order)
                sett.append(rates["settled"])
                base.append(rates["raw"])
    remove_db(path)
    remove_db(rpath)
    return [
        Row(
            "serve",
            "API dispatch over HTTP (POST /api/v1/actions, settled serve)",
            "actions/s",
            sett,
            base,
            "raw Starlette handler under uvicorn: same 2 durable txns + POST",
            target=0.7,
            note="the service's own cost per call: token, Host/Origin checks, body schema, the "
            "record's JSON, the log line, and settled's dispatch on top of the floor",
        )
    ]


HOOK_SECRET = "whsec_" + "YmVuY2gtY2FsbGJhY2stc2VjcmV0LTAxMjM0NTY3"  # base64 of a bench secret
CALLBACKS = (
    "[providers.sim.callbacks]\n"
    'scheme = "standard-webhooks"\nsecret = "${SETTLED_BENCH_HOOK_SECRET}"\n'
    'names = "provider_object_id"\nkey = "/data/id"\nstatus = "/data/status"\n'
    'applied = ["delivered"]\nnot_applied = ["bounced"]\n'
)


def _awaiting(path: str, ids: list[str]) -> None:
    """``ids`` as partial-tier deliveries the sim answered (AWAITING_VERIFICATION, the
    receipt ``rcpt-ID`` as object id), written through settled's own ledger calls, so
    that the callbacks find records as a dispatch leaves them."""
    from settled import Ledger, policy
    from settled.model import Declared, Tier
    from settled.providers.base import Wire, WireResult

    d = Declared(
        Tier.PARTIAL,
        consistency_window=0.0,
        queryable=False,
        carries_key=True,
        verify_interval=1.0,
        verify_deadline=86400.0,
    )
    with Ledger.open(path) as led:
        now = led.clock().now()
        for aid in ids:
            rec = policy.new_record(
                action_id=aid,
                provider="sim",
                operation="deliver",
                params={"n": aid},
                declared=d,
                now=now,
            )
            taken = policy.claim(rec, d, now, actor="bench", grace=30.0, default_backoff=0.05)
            claimed, _ = led.record_and_claim(rec, actor="bench", claim=taken.move)
            wire = WireResult(Wire.ANSWERED, status_code=202, object_id="rcpt-" + aid)
            led.move(
                policy.outcome(
                    claimed,
                    d,
                    policy.ReplyProof.ACCEPTED,
                    wire,
                    now,
                    owner=taken.owner,
                    actor="bench",
                    tries=[],
                )
            )


def callbacks(tmp: str, n: int, repeats: int) -> list[Row]:
    """Signed callbacks per second: ``settled serve`` at ``POST /hooks/sim`` against the
    raw handler (bench._serve_raw), both real processes on 127.0.0.1, one keep-alive
    client posting in turn, interleaved in chunks; each callback settles one record."""
    import shutil
    from datetime import UTC, datetime

    import httpx
    from standardwebhooks.webhooks import Webhook

    path, rpath = os.path.join(tmp, "hooks.db"), os.path.join(tmp, "hooks-raw.db")
    conf = os.path.join(tmp, "hooks.toml")
    remove_db(path)
    remove_db(rpath)
    ids = [f"h{r}-{i}" for r in ["w", *map(str, range(repeats))] for i in range(-1, n)]
    _awaiting(path, ids)
    shutil.copyfile(path, rpath)  # the same records on both sides (closed: no WAL left)
    signer = Webhook(HOOK_SECRET)
    sett, base = [], []
    with sim_process() as sim:
        with open(conf, "w") as fh:
            fh.write(f'[providers.sim]\ntype = "sim"\nbase_url = "{sim}"\n' + CALLBACKS)
        env = {
            **os.environ,
            "SETTLED_DB": path,
            "SETTLED_CONFIG": conf,
            "SETTLED_BENCH_HOOK_SECRET": HOOK_SECRET,
        }
        serve_cmd = [sys.executable, "-m", "settled", "serve", "--listen", "127.0.0.1:0"]
        raw_cmd = [sys.executable, "-m", "bench._serve_raw", rpath, sim]
        with (
            _service(serve_cmd, env, "json") as url,
            _service(raw_cmd, env, "url") as raw,
            httpx.Client(timeout=30) as c,
        ):

            def post(base_url: str, aid: str, side: str) -> None:
                body = json.dumps(
                    {"type": "effect.status", "data": {"id": "rcpt-" + aid, "status": "delivered"}}
                )
                msg = f"msg_{side}_{aid}"
                headers = {
                    "webhook-id": msg,
                    "content-type": "application/json",
                    "webhook-timestamp": str(int(datetime.now(UTC).timestamp())),
                    "webhook-signature": signer.sign(msg, datetime.now(UTC), body),
                }
                resp = c.post(f"{base_url}/hooks/sim", content=body, headers=headers)
                assert resp.status_code == 200 and resp.json() == {"received": 1, "matched": 1}, (
                    resp.text
                )

            post(url, "hw--1", "s")  # warm both: connections, pools, first-use imports
            post(raw, "hw--1", "r")
            for r in range(repeats):
                order = ["raw", "settled"] if r % 2 else ["settled", "raw"]
                ops = {
                    "settled": lambda i, r=r: post(url, f"h{r}-{i}", "s"),
                    "raw": lambda i, r=r: post(raw, f"h{r}-{i}", "r"),
                }
                rates = interleave_many(n, ops, order)
                sett.append(rates["settled"])
                base.append(rates["raw"])
    remove_db(path)
    remove_db(rpath)
    return [
        Row(
            "serve",
            "signed callbacks settling records (POST /hooks/sim, settled serve)",
            "callbacks/s",
            sett,
            base,
            "raw Starlette handler under uvicorn: same signature check + 1 durable txn",
            target=0.7,
            note="settled's own cost per callback: Host checks, the config-driven reading of "
            "the body, rule 16's policy, the metric and the log line",
        )
    ]
