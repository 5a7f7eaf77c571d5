"""`settled serve` under load on loopback: about 200 API calls in flight at once
(dispatches with distinct ids, and reads) for ``SETTLED_SERVE_LOAD_SECONDS`` (default
20, times SETTLED_TEST_BUDGET), at most ``MAX_DISPATCHES``. Nothing is lost: every
dispatched id is in the ledger exactly once, as CONFIRMED, and the sim received each
exactly once; no call failed."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from invariants import budget, check
from serving import auth, path_of, process, write_serve_config

from settled.ledger import Ledger
from settled.providers.sim_server import SimServer

IN_FLIGHT = 200
MAX_DISPATCHES = 20_000


def seconds() -> float:
    return float(os.environ.get("SETTLED_SERVE_LOAD_SECONDS", "20")) * budget()


@pytest.mark.slow
def test_two_hundred_calls_at_once_lose_nothing(tmp_path: Path, sim: SimServer) -> None:
    write_serve_config(tmp_path / "settled.toml", sim, sim_over={"timeout": 30.0})
    sent: list[str] = []
    done: list[str] = []  # answered: what a read may ask for
    codes: Counter[str] = Counter()
    with process() as svc:

        async def run() -> None:
            limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
            async with httpx.AsyncClient(base_url=svc.url, timeout=120, limits=limits) as c:
                stop = time.monotonic() + seconds()
                counter = iter(range(10**9))

                async def worker(w: int) -> None:
                    while time.monotonic() < stop and len(sent) < MAX_DISPATCHES:
                        n = next(counter)
                        if n % 4 == 3 and done:  # a read among three dispatches
                            kind = ("show", "list", "stats")[n % 3]
                            path = {"show": path_of(done[n % len(done)]),
                                    "list": "/api/v1/actions?status=all&limit=20",
                                    "stats": "/api/v1/stats"}[kind]  # fmt: skip
                            r = await c.get(path, headers=auth("reader"))
                            codes[f"{kind} {r.status_code}"] += 1
                            continue
                        aid = f"load/{w}-{n}"
                        sent.append(aid)
                        r = await c.post("/api/v1/actions", headers=auth("sender"), json={
                            "provider": "sim", "operation": "book", "action_id": aid})  # fmt: skip
                        codes[f"dispatch {r.status_code}"] += 1
                        if r.status_code == 201:
                            assert (
                                r.json()["action_id"] == aid and r.json()["status"] == "CONFIRMED"
                            )
                            done.append(aid)

                await asyncio.gather(*(worker(w) for w in range(IN_FLIGHT)))

        try:
            asyncio.run(run())
        except BaseException:
            svc.stop()
            print(
                [
                    e
                    for e in svc.rest()
                    if e.get("event") != "request" or e.get("status", 200) >= 500
                ][-20:]
            )
            raise
        assert svc.stop() == 0
    assert set(codes) <= {"dispatch 201", "show 200", "list 200", "stats 200"}, codes
    assert codes["dispatch 201"] == len(sent) and len(sent) >= IN_FLIGHT, codes
    truth = Counter(r["action_id"] for r in sim.truth()["requests"])
    assert set(truth) == set(sent) and set(truth.values()) == {1}
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        statuses = check(led, sim, ids=sent)
    assert statuses == Counter({"CONFIRMED": len(sent)})
    print(f"{len(sent)} dispatches and {sum(codes.values()) - len(sent)} reads in {seconds():g} s")
