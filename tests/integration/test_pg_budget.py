"""The connection budget of docs/postgres.md ("Connections"), measured: each kind of
process runs as a login role whose ``CONNECTION LIMIT`` is its budget (the server
refuses one connection more, and the process would fail), while a sampler counts its
connections in ``pg_stat_activity``.

- a CLI call: 1 connection;
- ``settled daemon``: at most ``pool_max`` (its checks in threads share them);
- ``settled serve --reconcile``: at most ``pool_max`` for the whole service (its API
  calls, console, MCP and the sweeper share one ledger's connections);
- ``[postgres] pool_min`` connections are opened when the ledger opens and kept.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import httpx
import pg_schemas as pg
import pytest
from pg_budget import Peak, role
from serving import auth, process, write_serve_config
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.errors import ConfigError, LedgerBusy
from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.storage import PostgresSettings

pytestmark = [pytest.mark.postgres_only]


def _awaiting(url: str, conf: Path, n: int) -> None:
    """``n`` records accepted by the sim and awaiting verification."""
    from settled.session import Session

    with Session(db=url, config_path=str(conf)) as s:
        d = s.dispatcher("test")
        for i in range(n):
            report = d.submit("sim", "send", {"n": i}, action_id=f"w{i}")
            assert report.record is not None
            assert report.record.status is Status.AWAITING_VERIFICATION


def test_a_cli_call_holds_one_connection(tmp_path: Path, db_path: str, sim: SimServer) -> None:
    conf = write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
    with role(db_path, 1) as url:
        env = {"SETTLED_DB": url, "SETTLED_CONFIG": str(conf)}
        calls = [
            ["dispatch", "sim", "book", "--action-id", "a1", "--params", "{}"],
            ["dispatch", "sim", "send", "--action-id", "a2", "--params", "{}"],
            ["show", "a1", "--json"],
            ["queue", "--json"],
            ["stats", "--json"],
            ["reconcile", "--due", "--json"],
            ["verify", "--json"],
        ]
        with Peak(pg.schema_of(db_path)) as peak:
            for argv in calls:
                done = run_cli(*argv, env=env)
                assert done.returncode in (0, 3), (argv, done.stderr)
                assert "connection" not in done.stderr, done.stderr
        assert peak.samples > 0
        assert peak.peak == 1, peak.peak


def test_a_daemon_holds_at_most_pool_max(tmp_path: Path, db_path: str) -> None:
    with SimServer() as sim:
        conf = write_config(
            tmp_path / "settled.toml",
            {"sim": sim_conf(sim, max_in_flight=8, verify_deadline=30.0)},
            reconcile={"concurrency": 8, "batch": 100},
            postgres={"pool_max": 2},
        )
        with role(db_path, 2) as url:
            _awaiting(url, conf, 40)
            env = {"SETTLED_DB": url, "SETTLED_CONFIG": str(conf)}
            with Peak(pg.schema_of(db_path)) as peak:
                done = run_cli("daemon", "--once", env=env, timeout=120)
            assert done.returncode == 0, done.stderr
            log = [json.loads(line) for line in done.stderr.splitlines()]
            assert not [e for e in log if e["event"] == "pass_failed"], log
            with Ledger.open(url) as led:
                assert all(led.get(f"w{i}").checks >= 1 for i in range(40))
        assert 1 <= peak.peak <= 2, peak.peak


def test_serve_holds_at_most_pool_max_for_the_whole_service(
    tmp_path: Path, db_path: str, sim: SimServer
) -> None:
    conf = write_serve_config(tmp_path / "settled.toml", sim, sim_over={"timeout": 10.0})
    conf.write_text(conf.read_text() + "[postgres]\npool_max = 3\n")
    with role(db_path, 3) as url:
        env = {"SETTLED_DB": url, "SETTLED_CONFIG": str(conf)}
        with Peak(pg.schema_of(db_path)) as peak:
            with process("--reconcile", env=env) as svc, httpx.Client(timeout=60) as c:

                def one(n: int) -> int:
                    body = {"provider": "sim", "operation": "send", "action_id": f"s{n}"}
                    r = c.post(svc.url + "/api/v1/actions", headers=auth("app"), json=body)
                    got = c.get(svc.url + f"/api/v1/actions/s{n}", headers=auth("reader"))
                    return r.status_code if got.status_code == 200 else got.status_code

                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    codes = list(pool.map(one, range(64)))
                stats = c.get(svc.url + "/api/v1/stats", headers=auth("reader"))
                assert stats.status_code == 200
            assert svc.proc.returncode == 0
        assert codes == [201] * 64, codes
        errors = [e for e in svc.seen if e.get("level") == "error" or "pass_failed" in str(e)]
        assert not errors, errors
    assert 1 <= peak.peak <= 3, peak.peak


def test_pool_min_connections_are_kept_open(db_path: str) -> None:
    settings = PostgresSettings(pool_min=3, pool_max=3)
    with Peak(pg.schema_of(db_path)) as peak, Ledger.open(db_path, postgres=settings) as led:
        led.find("x")

        def held() -> int:
            (n,) = (
                pg.admin()
                .execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (pg.schema_of(db_path),),
                )
                .fetchone()
            )
            return int(n)

        _until(lambda: held() == 3, "pool_min connections")
    assert peak.peak == 3


def test_a_thread_past_pool_max_waits_then_is_told_busy(db_path: str) -> None:
    import threading

    settings = PostgresSettings(pool_min=1, pool_max=1)
    with Ledger.open(db_path, postgres=settings, busy_timeout=0.2) as led:
        inside = threading.Event()
        release = threading.Event()
        seen: list[Any] = []

        def hold() -> None:
            with led._conns.connection():  # type: ignore[attr-defined]
                inside.set()
                release.wait(30)

        t = threading.Thread(target=hold)
        t.start()
        assert inside.wait(30)
        try:
            led.find("x")
        except LedgerBusy as exc:
            seen.append(str(exc))
        finally:
            release.set()
            t.join(30)
        assert seen and "pool_max" in seen[0], seen
        assert led.find("x") is None  # free again: it answers


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("pool_min = 0", "postgres.pool_min: must be a whole number >= 1"),
        ("pool_max = 1.5", "postgres.pool_max: must be a whole number >= 1"),
        ("pool_min = 4\npool_max = 2", "postgres.pool_max must be at least pool_min (4)"),
        ("pool_max = 101", "postgres.pool_max must be at most 100"),
        ("pgbouncer = 1", "postgres.pgbouncer must be true or false"),
        ("pool = 2", "postgres.pool: unknown key"),
    ],
)
def test_bad_postgres_keys_are_one_line(tmp_path: Path, body: str, says: str) -> None:
    from settled import config

    path = tmp_path / "settled.toml"
    path.write_text(f"[postgres]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        config.load(str(path))
    assert says in str(err.value) and "\n" not in str(err.value), err.value
    done = run_cli("queue", env={"SETTLED_CONFIG": str(path)})
    assert done.returncode == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
