"""The sim provider against a real SimServer on loopback, through a real httpx.Client.

Every test checks both sides: what the client reported from the wire, and the server's
ground truth of what was actually applied.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from settled.errors import ConfigError
from settled.model import Tier
from settled.providers import sim
from settled.providers.base import Observation, QueryTarget, Request, Seen, Wire, WireResult
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_free

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0) as s:
        yield s


@pytest.fixture
def provider(server: SimServer, client: httpx.Client) -> sim.SimProvider:
    return sim.create("sim", {"base_url": server.url, "dedupe": True}, client)


def execute(
    p: sim.SimProvider,
    op: str,
    action_id: str,
    *,
    params: Any = None,
    key: str | None = None,
    timeout: float = 0.5,
) -> WireResult:
    return p.execute(
        Request(
            action_id=action_id,
            operation=op,
            params={} if params is None else params,
            idempotency_key=key or f"{action_id}:1",
            reconciliation_key=f"rk-{action_id}",
            attempt=1,
            timeout=timeout,
        )
    )


def query(
    p: sim.SimProvider, op: str, action_id: str, *, params: Any = None, snapshot: Any = None
) -> Observation:
    return p.query(
        QueryTarget(
            action_id=action_id,
            operation=op,
            params={} if params is None else params,
            reconciliation_key=f"rk-{action_id}",
            provider_object_id=None,
            snapshot=snapshot,
            attempt=1,
        )
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- operations and faults ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "code", "prefix", "applied"),
    [
        ("book", 201, "bk-", True),
        ("send", 202, "msg-", None),
        ("deliver", 202, "rcpt-", None),
        ("notify", 204, None, None),
    ],
)
def test_ok_replies(
    provider: sim.SimProvider,
    server: SimServer,
    op: str,
    code: int,
    prefix: str | None,
    applied: bool | None,
) -> None:
    r = execute(provider, op, "a1")
    assert (r.wire, r.status_code, r.applied) == (Wire.ANSWERED, code, applied)
    if prefix is None:
        assert r.object_id is None
    else:
        assert r.object_id is not None and r.object_id.startswith(prefix)
    assert server.effects_for("a1") == 1
    [req] = server.requests_for("a1")
    assert req["op"] == op and req["fault"] == "ok" and req["applied"] and not req["replayed"]
    assert req["idempotency_key"] == "a1:1" and req["reconciliation_key"] == "rk-a1"


@pytest.mark.parametrize(
    ("fault", "wire", "code", "effects"),
    [
        ("lost_after_accept", Wire.ANSWERED, 202, 0),
        ("bounce", Wire.ANSWERED, 202, 0),
        ("timeout_after_apply", Wire.NO_ANSWER, None, 1),
        ("timeout_before_apply", Wire.NO_ANSWER, None, 0),
        ("reset_after_apply", Wire.NO_ANSWER, None, 1),
        ("drop", Wire.NO_ANSWER, None, 0),
        ("5xx_before", Wire.ANSWERED, 503, 0),
        ("5xx_after", Wire.ANSWERED, 500, 1),
        ("reject", Wire.ANSWERED, 422, 0),
        ("http:299", Wire.ANSWERED, 299, 0),
        ("http:408", Wire.ANSWERED, 408, 0),
        ("http:429", Wire.ANSWERED, 429, 0),
        ("http:799", Wire.ANSWERED, 799, 0),
        ("garbage", Wire.ANSWERED, 200, 1),
        ("badutf8", Wire.ANSWERED, 200, 1),
        ("huge", Wire.ANSWERED, 200, 1),
        ("lag:0.2", Wire.ANSWERED, 201, 1),
        ("no_such_fault", Wire.ANSWERED, 500, 0),
        ("http:100", Wire.ANSWERED, 500, 0),  # 1xx is refused as an unknown fault
    ],
)
def test_fault_wire_and_truth(
    provider: sim.SimProvider,
    server: SimServer,
    fault: str,
    wire: Wire,
    code: int | None,
    effects: int,
) -> None:
    server.plan("a1", fault)
    r = execute(provider, "book", "a1", timeout=0.3)
    assert (r.wire, r.status_code) == (wire, code), r
    assert server.effects_for("a1") == effects
    [req] = server.requests_for("a1")
    assert req["fault"] == fault and req["applied"] is (effects == 1)
    # Only a booking's "booked" reply proves anything.
    assert r.applied is (True if code == 201 else None)


def test_bodies_that_prove_nothing_are_reported_not_raised(
    provider: sim.SimProvider, server: SimServer
) -> None:
    server.plan("a1", "garbage", "badutf8", "huge")
    garbage, badutf8, huge = (execute(provider, "book", "a1", key=f"k{i}") for i in range(3))
    assert "not JSON" in garbage.detail
    assert "UTF-8" in badutf8.detail
    assert huge.applied is None and huge.object_id is None
    assert "reply larger than 1048576 bytes, not read" in huge.detail
    assert server.effects_for("a1") == 3


def test_lost_after_accept_looks_queued(provider: sim.SimProvider, server: SimServer) -> None:
    server.plan("a1", "lost_after_accept")
    r = execute(provider, "book", "a1")
    assert r.applied is None and r.object_id is not None  # an id, but "queued", not "booked"
    assert query(provider, "book", "a1").seen is Seen.NOT_YET


def test_unknown_fault_is_explained(provider: sim.SimProvider, server: SimServer) -> None:
    server.plan("a1", "explode")
    r = execute(provider, "book", "a1")
    assert r.status_code == 500 and "unknown fault 'explode'" in r.detail
    assert server.requests_for("a1")[0]["applied"] is False


def test_not_connected(client: httpx.Client) -> None:
    p = sim.create("sim", {"base_url": f"http://127.0.0.1:{free_port()}"}, client)
    r = execute(p, "book", "a1")
    assert r.wire is Wire.NOT_CONNECTED and "ConnectError" in r.detail


def test_unknown_operation_on_the_server_is_404(server: SimServer, client: httpx.Client) -> None:
    r = client.post(f"{server.url}/v1/frobnicate", json={"action_id": "a1", "params": {}})
    assert r.status_code == 404
    assert server.truth()["requests"] == []


# -- plans, keys, truth ---------------------------------------------------------------------


def test_plan_is_fifo_per_action_then_default(client: httpx.Client) -> None:
    with SimServer(default_fault="5xx_before") as s:
        p = sim.create("sim", {"base_url": s.url}, client)
        s.plan("a1", "reject", "ok")
        codes = [execute(p, "book", "a1", key=f"k{i}").status_code for i in range(3)]
        assert codes == [422, 201, 503]
        assert execute(p, "book", "other").status_code == 503  # plans are per action
        assert [r["fault"] for r in s.requests_for("a1")] == ["reject", "ok", "5xx_before"]
        assert s.effects_for("a1") == 1 and s.effects_for("other") == 0


def test_honoured_key_replays_without_applying(
    provider: sim.SimProvider, server: SimServer
) -> None:
    server.plan("a1", "timeout_after_apply")
    assert execute(provider, "book", "a1", timeout=0.3).wire is Wire.NO_ANSWER
    again = execute(provider, "book", "a1")
    assert (again.status_code, again.applied) == (201, True)
    assert again.object_id == query(provider, "book", "a1").object_id  # the first booking
    assert server.effects_for("a1") == 1
    first, second = server.requests_for("a1")
    assert (first["applied"], first["replayed"]) == (True, False)
    assert (second["applied"], second["replayed"]) == (False, True)


def test_replay_still_suffers_its_wire_fault(provider: sim.SimProvider, server: SimServer) -> None:
    server.plan("a1", "ok", "5xx_after")
    execute(provider, "book", "a1")
    assert execute(provider, "book", "a1").status_code == 500
    assert server.effects_for("a1") == 1
    assert server.requests_for("a1")[1]["replayed"] is True


def test_key_whose_request_applied_nothing_is_processed_anew(
    provider: sim.SimProvider, server: SimServer
) -> None:
    server.plan("a1", "5xx_before")
    assert execute(provider, "book", "a1").status_code == 503
    assert execute(provider, "book", "a1").status_code == 201
    assert server.effects_for("a1") == 1
    assert [r["replayed"] for r in server.requests_for("a1")] == [False, False]


def test_ignored_keys_apply_twice(client: httpx.Client) -> None:
    with SimServer(honour_keys=False, hang=1.0) as s:
        p = sim.create("sim", {"base_url": s.url}, client)
        s.plan("a1", "timeout_after_apply")
        assert execute(p, "send", "a1", timeout=0.3).wire is Wire.NO_ANSWER
        assert execute(p, "send", "a1").status_code == 202
        assert s.effects_for("a1") == 2
        assert [r["replayed"] for r in s.requests_for("a1")] == [False, False]


def test_truth_is_exact_under_concurrency(provider: sim.SimProvider, server: SimServer) -> None:
    def worker(n: int) -> None:
        for i in range(5):
            execute(provider, "send", "a1", key=f"k{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.effects_for("a1") == 40
    assert len(server.requests_for("a1")) == 40


def test_scripting_over_http(
    server: SimServer, client: httpx.Client, provider: sim.SimProvider
) -> None:
    r = client.post(f"{server.url}/_plan", json={"action_id": "a1", "faults": ["5xx_before"]})
    assert r.status_code == 200
    assert execute(provider, "book", "a1").status_code == 503
    truth = client.get(f"{server.url}/_truth").json()
    assert truth == server.truth()
    assert truth["effects"] == {"a1": 0} and truth["requests"][0]["fault"] == "5xx_before"
    assert client.post(f"{server.url}/_plan", json={"faults": "ok"}).status_code == 400
    assert client.post(f"{server.url}/_reset").status_code == 200
    assert server.truth() == {"requests": [], "effects": {}, "queries": {}, "callbacks": []}


def test_queries_are_counted_per_key(provider: sim.SimProvider, server: SimServer) -> None:
    execute(provider, "send", "a1")
    assert server.queries_for("rk-a1") == 0
    query(provider, "send", "a1")
    query(provider, "send", "a1")
    query(provider, "send", "a2")
    assert server.queries_for("rk-a1") == 2
    assert server.truth()["queries"] == {"rk-a1": 2, "rk-a2": 1}


# -- queries and visibility -------------------------------------------------------------------


def test_query_follows_lag(client: httpx.Client) -> None:
    with SimServer(lag=0.3) as s:
        p = sim.create("sim", {"base_url": s.url}, client)
        sent = execute(p, "send", "a1")
        assert query(p, "send", "a1").seen is Seen.NOT_YET
        time.sleep(0.35)
        seen = query(p, "send", "a1")
        assert (seen.seen, seen.object_id) == (Seen.APPLIED, sent.object_id)


def test_lag_fault_delays_visibility(provider: sim.SimProvider, server: SimServer) -> None:
    server.plan("a1", "lag:0.3")
    booked = execute(provider, "book", "a1")
    assert query(provider, "book", "a1").seen is Seen.NOT_YET
    time.sleep(0.35)
    assert query(provider, "book", "a1").object_id == booked.object_id


def test_bounce_is_not_applied(provider: sim.SimProvider, server: SimServer) -> None:
    server.plan("a1", "bounce")
    execute(provider, "send", "a1")
    seen = query(provider, "send", "a1")
    assert (seen.seen, seen.detail) == (Seen.NOT_APPLIED, "bounced")


@pytest.mark.parametrize("op", ["deliver", "notify"])
def test_partial_and_blind_have_no_query(provider: sim.SimProvider, op: str) -> None:
    execute(provider, op, "a1")
    assert query(provider, op, "a1").seen is Seen.UNKNOWN


def test_query_failure_is_unknown(client: httpx.Client) -> None:
    p = sim.create("sim", {"base_url": f"http://127.0.0.1:{free_port()}"}, client)
    seen = query(p, "book", "a1")
    assert seen.seen is Seen.UNKNOWN and "ConnectError" in seen.detail


# -- set: snapshot and attribution ------------------------------------------------------------

TZ = {"name": "tz", "value": "UTC"}


def test_set_applied_is_attributed(provider: sim.SimProvider, server: SimServer) -> None:
    server.put_setting("tz", "CET")
    snap = provider.snapshot("set", TZ)
    assert snap == {"value": "CET"}
    assert execute(provider, "set", "a1", params=TZ).status_code == 202
    seen = query(provider, "set", "a1", params=TZ, snapshot=snap)
    assert seen.seen is Seen.APPLIED
    assert server.effects_for("a1") == 1


def test_set_already_equal_cannot_be_attributed(
    provider: sim.SimProvider, server: SimServer
) -> None:
    server.put_setting("tz", "UTC")
    snap = provider.snapshot("set", TZ)
    execute(provider, "set", "a1", params=TZ)
    seen = query(provider, "set", "a1", params=TZ, snapshot=snap)
    assert seen.seen is Seen.AMBIGUOUS and "already 'UTC'" in seen.detail


def test_set_respects_lag(provider: sim.SimProvider, server: SimServer) -> None:
    snap = provider.snapshot("set", TZ)
    assert snap == {"value": None}
    server.plan("a1", "lag:0.3")
    execute(provider, "set", "a1", params=TZ)
    assert query(provider, "set", "a1", params=TZ, snapshot=snap).seen is Seen.NOT_YET
    time.sleep(0.35)
    assert query(provider, "set", "a1", params=TZ, snapshot=snap).seen is Seen.APPLIED


def test_set_changed_by_someone_else(
    provider: sim.SimProvider, server: SimServer, client: httpx.Client
) -> None:
    server.put_setting("tz", "CET")
    snap = provider.snapshot("set", TZ)
    server.plan("a1", "lost_after_accept")
    execute(provider, "set", "a1", params=TZ)
    client.put(f"{server.url}/_settings/tz", json={"value": "EST"})
    seen = query(provider, "set", "a1", params=TZ, snapshot=snap)
    assert seen.seen is Seen.AMBIGUOUS and "someone else" in seen.detail
    assert server.effects_for("a1") == 0


def test_set_without_a_snapshot_cannot_be_attributed(
    provider: sim.SimProvider, server: SimServer, client: httpx.Client
) -> None:
    down = sim.create("sim", {"base_url": f"http://127.0.0.1:{free_port()}"}, client)
    snap = down.snapshot("set", TZ)
    assert set(snap) == {"error"}
    execute(provider, "set", "a1", params=TZ)
    assert query(provider, "set", "a1", params=TZ, snapshot=snap).seen is Seen.AMBIGUOUS


def test_set_with_bad_params_is_rejected(provider: sim.SimProvider, server: SimServer) -> None:
    assert execute(provider, "set", "a1", params={"value": 1}).status_code == 422
    assert server.effects_for("a1") == 0
    assert provider.snapshot("book", {}) is None


# -- declarations and configuration -----------------------------------------------------------


def test_declared_operations(provider: sim.SimProvider) -> None:
    ops = provider.operations()
    assert {name: spec.tier for name, spec in ops.items()} == {
        "book": Tier.FULL,
        "send": Tier.RECONCILABLE,
        "deliver": Tier.PARTIAL,
        "notify": Tier.BLIND,
        "set": Tier.RECONCILABLE,
    }
    assert [n for n, s in ops.items() if s.queryable] == ["book", "send", "set"]
    assert [n for n, s in ops.items() if s.carries_key] == ["book", "send", "deliver"]
    assert [n for n, s in ops.items() if s.snapshots] == ["set"]
    assert all(s.dedupes_keys and s.attempts == 3 for s in ops.values())
    assert ops["book"].verifies == "GET /v1/effects/{reconciliation_key}"


def test_config_defaults(client: httpx.Client) -> None:
    spec = sim.create("s", {"base_url": "http://127.0.0.1:1/"}, client).operations()["send"]
    assert (spec.dedupes_keys, spec.timeout, spec.consistency_window) == (False, 5.0, 30.0)
    assert (spec.verify_interval, spec.verify_deadline, spec.attempts) == (2.0, 300.0, 3)
    assert spec.verify_min_checks == 3


def test_verify_is_a_table_as_in_the_other_types_or_its_flat_keys(client: httpx.Client) -> None:
    table = {"base_url": "http://x", "verify": {"interval": 1, "deadline": 9, "min_checks": 4}}
    flat = {
        "base_url": "http://x",
        "verify_interval": 1,
        "verify_deadline": 9,
        "verify_min_checks": 4,
    }
    for conf in (table, flat):
        spec = sim.create("s", conf, client).operations()["send"]
        assert (spec.verify_interval, spec.verify_deadline, spec.verify_min_checks) == (1, 9, 4)


@pytest.mark.parametrize(
    ("conf", "names"),
    [
        ({"base_url": "http://x", "retries": 2}, "retries"),
        ({}, "base_url"),
        ({"base_url": 5}, "base_url"),
        ({"base_url": "http://x", "timeout": "5"}, "timeout"),
        ({"base_url": "http://x", "timeout": 0}, "timeout"),
        ({"base_url": "http://x", "dedupe": "yes"}, "dedupe"),
        ({"base_url": "http://x", "attempts": True}, "attempts"),
        ({"base_url": "http://x", "attempts": 0}, "attempts"),
        ({"base_url": "http://x", "verify_min_checks": 0}, "verify_min_checks"),
        ({"base_url": "http://x", "verify": {"every": 2}}, "verify"),
        ({"base_url": "http://x", "verify": 3}, "verify"),
        ({"base_url": "http://x", "verify": {"min_checks": 0}}, "verify_min_checks"),
        ({"base_url": "http://x", "verify": {"deadline": 9}, "verify_deadline": 9}, "same setting"),
    ],
)
def test_config_errors_name_the_key(client: httpx.Client, conf: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigError) as err:
        sim.create("mysim", conf, client)
    message = str(err.value)
    assert names in message and "\n" not in message


# -- lifecycle ------------------------------------------------------------------------------


def test_stop_returns_fast_while_a_handler_hangs(client: httpx.Client) -> None:
    s = SimServer(hang=30.0).start()
    p = sim.create("sim", {"base_url": s.url}, client)
    s.plan("a1", "timeout_before_apply")
    results: list[WireResult] = []
    t = threading.Thread(target=lambda: results.append(execute(p, "book", "a1", timeout=10)))
    t.start()
    deadline = time.monotonic() + 5
    while not s.requests_for("a1") and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    s.stop()
    assert time.monotonic() - started < 1.0
    t.join(timeout=5)
    assert [r.wire for r in results] == [Wire.NO_ANSWER]
    assert s.effects_for("a1") == 0


def test_module_entry_point(client: httpx.Client) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "settled.providers.sim_server", "--port", "0", "--hang", "1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 10)
            assert ready, "no URL line within 10 s"
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            p = sim.create("sim", {"base_url": url}, client)
            assert execute(p, "book", "a1").status_code == 201
            assert client.get(f"{url}/_truth").json()["effects"] == {"a1": 1}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_after_send_crash_point_kills_between_request_and_reply(server: SimServer) -> None:
    script = (
        "import sys, httpx\n"
        "from settled import crashpoints\n"
        "from settled.providers import sim\n"
        "from settled.providers.base import Request\n"
        "with httpx.Client() as c, crashpoints.active(crashpoints.kill_at('after_send')):\n"
        "    p = sim.create('sim', {'base_url': sys.argv[1]}, c)\n"
        "    p.execute(Request('a1', 'book', {}, 'a1:1', 'rk-a1', 1, 5.0))\n"
        "print('survived')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, server.url],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == -signal.SIGKILL and "survived" not in done.stdout
    deadline = time.monotonic() + 30  # a ceiling: the effect lands at once
    while server.effects_for("a1") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.effects_for("a1") == 1  # the request left before the process died


def test_plain_params_body_is_accepted(server: SimServer, client: httpx.Client) -> None:
    """A generic HTTP client sends the params as the body, with the key in a field."""
    r = client.post(
        f"{server.url}/v1/send",
        json={"to": "x", "reconciliation_key": "rk-p"},
        headers={"Idempotency-Key": "a-plain:1"},
    )
    assert r.status_code == 202
    [req] = server.requests_for("a-plain")
    assert (req["reconciliation_key"], req["idempotency_key"]) == ("rk-p", "a-plain:1")
    assert server.effect_view("rk-p") == {"status": "delivered", "id": r.json()["id"]}
    # No idempotency key: the action is named by the reconciliation key.
    assert (
        client.post(f"{server.url}/v1/book", json={"reconciliation_key": "rk-q"}).status_code == 201
    )
    assert server.effects_for("rk-q") == 1
