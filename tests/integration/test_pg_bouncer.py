"""The PostgreSQL ledger through a real PgBouncer in transaction mode
(``[postgres] pgbouncer = true``; docs/postgres.md, "Through PgBouncer").

A server connection belongs to a client for one transaction, so nothing may be set for
a session: the tests run PgBouncer with server connections whose own time zone is not
UTC (what a session ``SET TIME ZONE`` would have hidden), and check that settled left
nothing on them (``lock_timeout``, prepared statements), that its ``lock_timeout``
still holds inside each transaction, and that dispatch, a claim race between
processes, reconcile, ``serve`` and the daemon work through it and keep the promise:
one request per action, every record settled, records read the same byte for byte
through PgBouncer as directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pgbouncer import Bouncer
from serving import auth, process, write_serve_config
from support import popen_cli, run_cli, sim_conf, write_config

from settled import Ledger
from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.storage import PostgresSettings

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow(seconds=30)]

THROUGH = PostgresSettings(pgbouncer=True)


@pytest.fixture
def bouncer(db_path: str) -> Iterator[Bouncer]:
    with Bouncer(db_path, timezone="Asia/Kolkata") as b:
        yield b


def _env(b: Bouncer, conf: Path) -> dict[str, str]:
    return {"SETTLED_DB": b.url, "SETTLED_CONFIG": str(conf)}


def _conf(tmp_path: Path, sim: SimServer, **sections: Any) -> Path:
    return write_config(
        tmp_path / "settled.toml",
        {"sim": sim_conf(sim, timeout=10.0, verify_deadline=30.0)},
        postgres={"pgbouncer": True},
        **sections,
    )


def test_commands_through_pgbouncer_read_what_a_direct_connection_reads(
    tmp_path: Path, db_path: str, bouncer: Bouncer, sim: SimServer
) -> None:
    env = _env(bouncer, _conf(tmp_path, sim))
    for n in range(6):  # each statement more often than psycopg's prepare threshold (5)
        done = run_cli("dispatch", "sim", "book", "--action-id", f"b{n}", "--params", "{}", env=env)
        assert done.returncode == 0, done.stderr
    sent = run_cli("dispatch", "sim", "send", "--action-id", "s1", "--params", "{}", env=env)
    assert sent.returncode == 3, sent.stderr
    for argv in (["reconcile", "--due"], ["queue", "--json"], ["stats", "--json"], ["verify"]):
        done = run_cli(*argv, env=env)
        assert done.returncode == 0, (argv, done.stderr)
    shown = run_cli("show", "b0", "s1", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    with Ledger.open(db_path) as direct, Ledger.open(bouncer.url, postgres=THROUGH) as pooled:
        for aid in ("b0", "b5", "s1"):
            assert pooled.get(aid).to_json() == direct.get(aid).to_json()
            assert [e.to_json() for e in pooled.events(aid)] == [
                e.to_json() for e in direct.events(aid)
            ]
        assert pooled.get("b0").created_at.endswith("Z")
        assert direct.integrity_check() == "ok"
    assert len(sim.requests_for("b0")) == 1 and len(sim.requests_for("s1")) == 1


def test_nothing_is_left_on_the_server_connection(
    tmp_path: Path, db_path: str, sim: SimServer
) -> None:
    """One server connection (pool size 1): every statement settled ran went through it,
    and afterwards it holds none of settled's settings and no prepared statement."""
    import psycopg

    with Bouncer(db_path, pool_size=1) as b:
        env = _env(b, _conf(tmp_path, sim))
        for n in range(7):
            done = run_cli(
                "dispatch", "sim", "book", "--action-id", f"p{n}", "--params", "{}", env=env
            )
            assert done.returncode == 0, done.stderr
        with Ledger.open(b.url, postgres=THROUGH) as led:
            for _ in range(8):
                assert led.get("p0").status is Status.CONFIRMED
        with psycopg.connect(b.url, autocommit=True, prepare_threshold=None) as raw:
            shown = {
                name: raw.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("lock_timeout", "idle_in_transaction_session_timeout")
            }
            assert shown == {"lock_timeout": "0", "idle_in_transaction_session_timeout": "0"}
            prepared = raw.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            assert prepared == (0,)
        pools = [p for p in b.show("POOLS") if p["database"] == "ledger"]
        assert pools and pools[0]["pool_mode"] == "transaction"
        assert sum(p["sv_idle"] + p["sv_used"] + p["sv_active"] for p in pools) == 1


def test_busy_timeout_holds_in_each_transaction(
    tmp_path: Path, db_path: str, bouncer: Bouncer, sim: SimServer
) -> None:
    """A row locked by another writer: the claim through PgBouncer gives up after
    ``busy_timeout`` (its ``lock_timeout``, set for its transaction) with
    ``LedgerBusy``, and sends nothing."""
    env = _env(bouncer, _conf(tmp_path, sim))
    made = run_cli(
        "dispatch", "sim", "book", "--action-id", "held", "--params", "{}",
        "--needs-confirmation", env=env,
    )  # fmt: skip
    assert made.returncode == 3, made.stderr  # recorded, waiting for a confirmation
    import psycopg

    with psycopg.connect(db_path) as writer:
        writer.execute("SELECT 1 FROM actions WHERE action_id = 'held' FOR UPDATE")
        confirm = run_cli("confirm", "held", env={**env, "SETTLED_BUSY_TIMEOUT": "0.3"}, timeout=60)
        writer.rollback()
    assert confirm.returncode == 1, confirm.stderr
    assert "locked by another writer" in confirm.stderr and "Traceback" not in confirm.stderr
    assert sim.requests_for("held") == []
    with Ledger.open(db_path) as led:
        assert led.get("held").status is Status.PENDING


def test_a_claim_race_through_pgbouncer_sends_once(
    tmp_path: Path, db_path: str, bouncer: Bouncer
) -> None:
    with SimServer(latency=0.3) as sim:
        env = _env(bouncer, _conf(tmp_path, sim))
        made = run_cli(
            "dispatch", "sim", "book", "--action-id", "race", "--params", "{}",
            "--needs-confirmation", env=env,
        )  # fmt: skip
        assert made.returncode == 3, made.stderr
        procs = [popen_cli("confirm", "race", "--json", env=env) for _ in range(8)]
        outs = [p.communicate(timeout=120) for p in procs]
        codes = [p.returncode for p in procs]
        assert all(c in (0, 3, 4) for c in codes), (codes, [e for _, e in outs])
        assert not [e for _, e in outs if "Traceback" in e or "connection" in e.lower()]
        assert len(sim.requests_for("race")) == 1
        with Ledger.open(db_path) as led:
            assert led.get("race").status is Status.CONFIRMED
            assert led.integrity_check() == "ok"


def test_serve_and_daemons_through_pgbouncer(
    tmp_path: Path, db_path: str, bouncer: Bouncer
) -> None:
    """``serve --reconcile`` takes dispatches over its API and two daemons check
    them, all through PgBouncer: every action sent once and settled."""
    with SimServer(lag=0.2) as sim:
        conf = write_serve_config(
            tmp_path / "settled.toml",
            sim,
            sim_over={"timeout": 10.0, "verify_deadline": 60.0, "verify_interval": 0.1},
        )
        conf.write_text(
            conf.read_text() + "[postgres]\npgbouncer = true\n[daemon]\ninterval = 0.2\n"
        )
        env = _env(bouncer, conf)
        daemons = [popen_cli("daemon", env=env) for _ in range(2)]
        try:
            with process("--reconcile", env=env) as svc, httpx.Client(timeout=60) as c:
                codes = []
                for n in range(30):
                    body = {"provider": "sim", "operation": "send", "action_id": f"v{n}"}
                    r = c.post(svc.url + "/api/v1/actions", headers=auth("app"), json=body)
                    codes.append(r.status_code)
                assert codes == [201] * 30

                def settled() -> bool:
                    with Ledger.open(db_path) as led:
                        return all(led.get(f"v{n}").status is Status.CONFIRMED for n in range(30))

                _until(settled, "every action confirmed", timeout=120)
            assert svc.proc.returncode == 0
            assert not [e for e in svc.seen if e.get("event") == "pass_failed"]
        finally:
            for d in daemons:
                d.terminate()
            logs = [d.communicate(timeout=60)[1] for d in daemons]
        for log in logs:
            lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
            assert not [e for e in lines if e["event"] == "pass_failed"], lines
        assert all(len(sim.requests_for(f"v{n}")) == 1 for n in range(30))
        with Ledger.open(db_path) as led:
            assert led.integrity_check() == "ok"


def test_without_the_binary_the_tests_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import pgbouncer

    monkeypatch.setattr(pgbouncer, "BINARY", "/nonexistent/pgbouncer")
    monkeypatch.delenv("SETTLED_REQUIRE_POSTGRES", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        pgbouncer.require()
    assert "Debian package pgbouncer" in str(skipped.value)
    monkeypatch.setenv("SETTLED_REQUIRE_POSTGRES", "1")
    with pytest.raises(pytest.fail.Exception):
        pgbouncer.require()


def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
