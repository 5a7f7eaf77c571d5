"""Ten daemons and four `settled serve` processes on one PostgreSQL ledger, as a login
role whose ``CONNECTION LIMIT`` is 50 (the server refuses the 51st connection): the
connection budget of docs/postgres.md holds for a fleet. Clients dispatch through the
four services (each action id posted to two of them), the daemons settle what the
provider accepted; bounded in time. Nothing is sent twice, nothing is lost, and no
process meets a connection error.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from pg_budget import Peak, role
from serving import auth, process, write_serve_config
from support import popen_cli

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow(seconds=120)]

DAEMONS = 10
SERVICES = 4
POOL_MAX = 2
LIMIT = 50
ACTIONS = 160


def _drain(proc: Any) -> Any:
    import threading

    out: list[str] = []

    def read() -> None:
        with proc.stderr:
            out.append(proc.stderr.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()

    def rest() -> str:
        t.join(30)
        if proc.stdout is not None:
            proc.stdout.close()
        return out[0] if out else ""

    return rest


def test_ten_daemons_and_four_services_under_a_limit_of_fifty(tmp_path: Path, db_path: str) -> None:
    with SimServer(latency=0.01, lag=0.1) as sim:
        conf = write_serve_config(
            tmp_path / "settled.toml",
            sim,
            sim_over={"timeout": 10.0, "verify_deadline": 120.0, "verify_interval": 0.2},
        )
        conf.write_text(
            conf.read_text()
            + f"[postgres]\npool_max = {POOL_MAX}\n[daemon]\ninterval = 0.5\n"
            + "[reconcile]\nconcurrency = 2\n"
        )
        with role(db_path, LIMIT) as url, ExitStack() as stack:
            user = url.split("//", 1)[1].split("@", 1)[0]
            env = {"SETTLED_DB": url, "SETTLED_CONFIG": str(conf)}
            peak = stack.enter_context(Peak(user, by="usename"))
            # the ledger made once, before the fleet starts
            with Ledger.open(url):
                pass
            daemons = [popen_cli("daemon", env=env) for _ in range(DAEMONS)]
            logs = [_drain(d) for d in daemons]
            services = [stack.enter_context(process(env=env)) for _ in range(SERVICES)]
            try:
                codes = _dispatch(services)
                assert set(codes) <= {200, 201}, sorted(set(codes))
                ids = [f"f{n}" for n in range(ACTIONS)]
                deadline = time.monotonic() + 180
                while True:
                    with Ledger.open(url) as led:
                        open_ = [a for a in ids if led.get(a).status is not Status.CONFIRMED]
                    if not open_:
                        break
                    assert time.monotonic() < deadline, f"{len(open_)} never confirmed"
                    time.sleep(0.2)
            finally:
                for d in daemons:
                    if d.poll() is None:
                        d.send_signal(signal.SIGTERM)
                for d in daemons:
                    d.wait(timeout=60)
                texts = [read() for read in logs]
            for s in services:
                assert s.stop() == 0
            assert [d.returncode for d in daemons] == [0] * DAEMONS, texts
            for text in texts:
                entries = [json.loads(x) for x in text.splitlines() if x.strip()]
                bad = [e for e in entries if e["event"] in ("pass_failed", "ledger_moved")]
                assert not bad, bad
                assert "connection" not in text.lower().replace("connections", ""), text[-2000:]
            for s in services:
                errors = [e for e in s.seen if e.get("level") in ("error", "critical")]
                assert not errors, errors
            with Ledger.open(url) as led:
                assert led.integrity_check() == "ok"
                records = [led.get(a) for a in ids]
            assert all(r.status is Status.CONFIRMED for r in records)
            assert all(len(sim.requests_for(a)) == 1 for a in ids)  # none sent twice
            # each query a check the ledger recorded: none doubled between daemons
            assert sum(sim.truth()["queries"].values()) == sum(r.checks for r in records)
        budget = DAEMONS * POOL_MAX + SERVICES * POOL_MAX
        # the ledger the test itself opens is one more; the limit was never the bound
        assert 1 < peak.peak <= budget + 2 < LIMIT, peak.peak


def _dispatch(services: list[Any]) -> list[int]:
    """Every action posted to two services in turn (the second finds it taken)."""

    def one(n: int) -> list[int]:
        body = {"provider": "sim", "operation": "send", "action_id": f"f{n}"}
        a, b = services[n % SERVICES], services[(n + 1) % SERVICES]
        with httpx.Client(timeout=60) as c:
            got = []
            for svc in (a, b):
                r = c.post(svc.url + "/api/v1/actions", headers=auth("app"), json=body)
                got.append(r.status_code)
        return got

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [code for pair in pool.map(one, range(ACTIONS)) for code in pair]
