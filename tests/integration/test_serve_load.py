"""`settled serve` under load on loopback: about 200 requests in flight at once, API
calls and signed provider callbacks mixed, for a bounded time: a few seconds in the
normal suite (``SETTLED_SERVE_LOAD_SECONDS``, default 3), 20 with ``SETTLED_SOAK=1``;
both times SETTLED_TEST_BUDGET; at least ``MIN_ROUNDS`` requests per worker, at
most ``MAX_DISPATCHES`` dispatches.

Each worker, in turn: dispatches a booking (full tier: CONFIRMED by its reply);
dispatches a delivery (partial tier: only a callback settles it) and then posts the
sim's signed "delivered" callback for its receipt, sometimes twice (a redelivery);
posts a callback naming a receipt nobody sent (kept, pending); reads (show, list,
stats). Nothing is lost: every dispatched id is in the ledger once and reached the sim
once; every callback event is recorded once (its events and the callbacks table
agree with what was posted, and so do the metrics); no answer is a 5xx."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hookkit import STD_SECRET, std_headers
from invariants import budget, check
from serving import auth, path_of, process, write_serve_config

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=25)

IN_FLIGHT = 200
MAX_DISPATCHES = 20_000
MIN_ROUNDS = 2  # per worker, whatever the time: 400 requests, 250 of them dispatches
CALLBACKS = {
    "scheme": "standard-webhooks",
    "secret": "${LOAD_HOOK_SECRET}",
    "names": "provider_object_id",
    "key": "/data/id",
    "status": "/data/status",
    "applied": ["delivered"],
    "not_applied": ["bounced"],
}
OK = {"dispatch 201", "callback 200", "show 200", "list 200", "stats 200"}


def seconds() -> float:
    default = "20" if os.environ.get("SETTLED_SOAK") == "1" else "3"
    return float(os.environ.get("SETTLED_SERVE_LOAD_SECONDS", default)) * budget()


def signed(object_id: str, msg_id: str) -> tuple[bytes, dict[str, str]]:
    """The sim's callback for a receipt, as a Standard Webhooks sender signs it."""
    import json

    body = json.dumps(
        {"type": "effect.status", "data": {"id": object_id, "status": "delivered"}}
    ).encode()
    return body, std_headers(body, msg_id=msg_id, ts=datetime.now(UTC))


@pytest.fixture
def service(tmp_path: Path, sim: SimServer) -> Iterator[Any]:
    cfg = write_serve_config(tmp_path / "settled.toml", sim, sim_over={"timeout": 30.0})
    cfg.write_text(cfg.read_text() + "\n" + _table())
    with process(env={"LOAD_HOOK_SECRET": STD_SECRET}) as svc:
        yield svc


def _table() -> str:
    from support import toml_value

    return "[providers.sim.callbacks]\n" + "".join(
        f"{k} = {toml_value(v)}\n" for k, v in CALLBACKS.items()
    )


@pytest.mark.slow
def test_two_hundred_calls_and_callbacks_at_once_lose_nothing(service: Any, sim: SimServer) -> None:
    svc = service
    sent: list[str] = []  # every action id dispatched
    done: list[str] = []  # answered: what a read may ask for
    called: dict[str, str] = {}  # action id -> the event id of its callback
    answers: Counter[str] = Counter()  # what the callbacks were answered
    orphans: list[str] = []  # event ids of callbacks naming a receipt nobody sent
    codes: Counter[str] = Counter()

    async def run() -> None:
        limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
        async with httpx.AsyncClient(base_url=svc.url, timeout=120, limits=limits) as c:
            stop = time.monotonic() + seconds()
            counter = iter(range(10**9))

            async def callback(object_id: str, msg_id: str) -> dict[str, Any]:
                body, headers = signed(object_id, msg_id)
                r = await c.post("/hooks/sim", content=body, headers=headers)
                codes[f"callback {r.status_code}"] += 1
                got: dict[str, Any] = r.json()
                answers.update(k for k in got if k != "received")
                return got

            async def dispatch(aid: str, operation: str) -> dict[str, Any] | None:
                sent.append(aid)
                r = await c.post(
                    "/api/v1/actions",
                    headers=auth("sender"),
                    json={"provider": "sim", "operation": operation, "action_id": aid},
                )
                codes[f"dispatch {r.status_code}"] += 1
                if r.status_code != 201:
                    return None
                rec: dict[str, Any] = r.json()
                assert rec["action_id"] == aid
                done.append(aid)
                return rec

            async def worker(w: int) -> None:
                # at least MIN_ROUNDS each, however slow the machine: every kind is seen
                for rounds in range(10**9):
                    if rounds >= MIN_ROUNDS and (
                        time.monotonic() >= stop or len(sent) >= MAX_DISPATCHES
                    ):
                        break
                    n = next(counter)
                    kind = n % 8
                    if kind in (0, 4):
                        rec = await dispatch(f"load/{w}-{n}", "book")
                        assert rec is None or rec["status"] == "CONFIRMED", rec
                    elif kind in (1, 3, 5):
                        aid = f"deliver/{w}-{n}"
                        rec = await dispatch(aid, "deliver")
                        if rec is None:
                            continue
                        assert rec["status"] == "AWAITING_VERIFICATION", rec
                        msg = f"msg_{w}_{n}"
                        called[aid] = msg
                        got = await callback(rec["provider_object_id"], msg)
                        assert got == {"received": 1, "matched": 1}, (aid, got)
                        if n % 5 == 0:  # the sender did not hear the answer: it delivers again
                            again = await callback(rec["provider_object_id"], msg)
                            assert again == {"received": 1, "duplicate": 1}, (aid, again)
                    elif kind == 7:
                        orphans.append(f"orphan_{w}_{n}")
                        got = await callback(f"rcpt-nobody-{w}-{n}", orphans[-1])
                        assert got == {"received": 1, "pending": 1}, got
                    elif done:
                        what = ("show", "list", "stats")[n % 3]
                        path = {
                            "show": path_of(done[n % len(done)]),
                            "list": "/api/v1/actions?status=all&limit=20",
                            "stats": "/api/v1/stats",
                        }[what]
                        r = await c.get(path, headers=auth("reader"))
                        codes[f"{what} {r.status_code}"] += 1

            await asyncio.gather(*(worker(w) for w in range(IN_FLIGHT)))
            metrics = (await c.get("/metrics")).text
            counted.update(_callbacks_total(metrics))

    counted: Counter[str] = Counter()
    try:
        asyncio.run(run())
    except BaseException:
        svc.stop()
        print(
            [e for e in svc.rest() if e.get("event") != "request" or e.get("status", 200) >= 500][
                -20:
            ]
        )
        raise
    assert svc.stop() == 0
    assert set(codes) <= OK, codes  # no 5xx, no refusal
    assert codes["dispatch 201"] == len(sent) and len(sent) >= IN_FLIGHT, codes
    assert len(called) >= IN_FLIGHT // 2 and orphans, (len(called), len(orphans))
    truth = Counter(r["action_id"] for r in sim.truth()["requests"])
    assert set(truth) == set(sent) and set(truth.values()) == {1}
    redelivered = answers["duplicate"]
    assert answers == Counter(matched=len(called), duplicate=redelivered, pending=len(orphans))
    # the metrics counted what was answered, each event once
    assert counted == answers, (counted, answers)
    with Ledger.open(os.environ["SETTLED_DB"]) as led:
        statuses = check(led, sim, ids=sent)
        for aid in called:
            rec = led.get(aid)
            assert rec.status is Status.CONFIRMED and rec.confirmed_by == "callback:sim", aid
            assert [e.kind for e in led.events(aid)].count("callback") == 1, aid
        # the callbacks table: one row per event id posted, whatever became of it
        figures = led.callback_figures()["sim"]
        assert (figures.matched, figures.pending, figures.expired) == (len(called), len(orphans), 0)
    assert statuses == Counter({"CONFIRMED": len(sent)})
    reads = sum(v for k, v in codes.items() if not k.startswith(("dispatch", "callback")))
    print(
        f"{len(sent)} dispatches, {codes['callback 200']} callbacks ({redelivered} "
        f"redelivered, {len(orphans)} kept) and {reads} reads in {seconds():g} s"
    )


def _callbacks_total(text: str) -> Counter[str]:
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "settled_callbacks_total" and s.labels["provider"] == "sim":
                out[s.labels["reason"]] += int(s.value)
    return +out
