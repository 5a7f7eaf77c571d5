"""The shared wire code under real sockets on loopback: one total deadline per try,
``send_by`` checked right before the first byte, ``written_at``, ``Retry-After``, keys
that are not ASCII, and what counts as "never sent"."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from settled.providers import make_client
from settled.providers._wire import exchange, header_value, retry_after
from settled.providers.base import Request, Wire
from settled.providers.sim import create as create_sim
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.ledger_free


class RawServer:
    """A loopback server that reads one request per connection, records its bytes,
    then answers with ``reply`` one byte every ``drip`` seconds."""

    def __init__(self, reply: bytes, drip: float = 0.0) -> None:
        self.reply = reply
        self.drip = drip
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            self.received.append(data)
            if not data:
                return
            try:
                if self.drip:
                    for i in range(len(self.reply)):
                        if self._stop.wait(self.drip):
                            return
                        conn.sendall(self.reply[i : i + 1])
                else:
                    conn.sendall(self.reply)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    c = make_client()
    yield c
    c.close()


OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"ok": true}'


def test_a_dripped_reply_cannot_outlive_the_total_deadline(client: httpx.Client) -> None:
    """One byte every 0.1 s keeps each read alive: a per-read timeout of 1 s would
    wait the whole ~8 s. The total deadline ends the try at 1 s."""
    server = RawServer(OK, drip=0.1)
    try:
        start = time.monotonic()
        ex = exchange(client, "GET", server.url + "/x", timeout=1.0)
        took = time.monotonic() - start
    finally:
        server.close()
    assert took < 3.0, took  # a per-read timeout would wait for the whole reply: ~8 s
    assert ex.wire is Wire.NO_ANSWER and "Timeout" in ex.problem
    assert ex.written_at is not None and start <= ex.written_at <= start + took


def test_a_dripped_body_after_the_headers_is_cut_at_the_deadline(client: httpx.Client) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    server = RawServer(head + b"x" * 1000, drip=0.005)  # headers in ~0.2 s, body in ~5 s more
    try:
        start = time.monotonic()
        ex = exchange(client, "GET", server.url + "/x", timeout=0.8)
        took = time.monotonic() - start
    finally:
        server.close()
    assert took < 3.0, took
    assert ex.wire is Wire.ANSWERED and ex.status_code == 200 and ex.body is None
    assert "unreadable" in ex.problem


def test_send_by_already_passed_sends_nothing(client: httpx.Client) -> None:
    server = RawServer(OK)
    try:
        ex = exchange(
            client, "POST", server.url + "/x", timeout=1.0, send_by=time.monotonic() - 0.01
        )
        time.sleep(0.1)
    finally:
        server.close()
    assert ex.wire is Wire.NOT_CONNECTED and ex.problem.startswith("not sent:")
    assert ex.written_at is None and server.received == []


def test_send_by_is_checked_right_before_the_request_is_written(client: httpx.Client) -> None:
    """A pause between connecting and writing (a stopped process, slow TLS) that
    outlasts ``send_by``: the trace hook stops the write, the server reads zero bytes,
    and the result is "never sent"."""
    server = RawServer(OK)

    def slow_connect(event: str, info: Any) -> None:
        if event == "connection.connect_tcp.complete":
            time.sleep(0.3)

    try:
        ex = exchange(
            client,
            "POST",
            server.url + "/x",
            timeout=2.0,
            send_by=time.monotonic() + 0.1,
            content=b"effect",
            extensions={"trace": slow_connect},
        )
        time.sleep(0.2)
    finally:
        server.close()
    assert ex.wire is Wire.NOT_CONNECTED and ex.problem.startswith("not sent:"), ex
    assert "lease lapsed" in ex.problem and ex.written_at is None
    assert server.received == [b""]  # connected, and not one byte written


def test_written_at_lies_within_the_call_and_is_none_when_refused(client: httpx.Client) -> None:
    server = RawServer(OK)
    try:
        before = time.monotonic()
        ex = exchange(client, "GET", server.url + "/x", timeout=1.0)
        after = time.monotonic()
    finally:
        server.close()
    assert ex.wire is Wire.ANSWERED and ex.written_at is not None
    assert before <= ex.written_at <= after
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        refused = exchange(client, "GET", f"http://127.0.0.1:{port}/", timeout=1.0)
    assert refused.wire is Wire.NOT_CONNECTED and refused.written_at is None
    assert refused.problem.startswith("not sent:")


def test_an_invalid_url_is_never_sent(client: httpx.Client) -> None:
    ex = exchange(client, "GET", "http://host:port/x", timeout=1.0)
    assert ex.wire is Wire.NOT_CONNECTED and ex.problem.startswith("not sent: invalid URL")


@pytest.mark.parametrize(
    ("status", "value", "expected"),
    [
        (429, "7", 7.0),
        (503, "0", 0.0),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past
        (429, "soon", None),
        (500, "7", None),  # only 429 and 503 ask to wait
    ],
)
def test_retry_after(status: int, value: str, expected: float | None) -> None:
    assert retry_after(status, {"Retry-After": value}) == expected


def test_retry_after_reaches_the_wire_result() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "12"}, json={"error": "slow down"})

    with SimServer() as server, httpx.Client(transport=httpx.MockTransport(handler)) as c:
        sim = create_sim("sim", {"base_url": server.url}, c)
        r = sim.execute(_request("a1", "book"))
    assert (r.wire, r.status_code, r.retry_after) == (Wire.ANSWERED, 429, 12.0)


def _request(action_id: str, op: str) -> Request:
    return Request(action_id, op, {"x": 1}, f"{action_id}:1", "stl-k1", 1, 1.0)


@pytest.mark.parametrize(
    ("text", "sent"),
    [
        ("order-42:1", "order-42:1"),
        ("café-42:1", "caf%C3%A9-42:1"),
        ("50%-off:1", "50%25-off:1"),  # % itself is encoded: no two ids share one key
        ("tab\there:1", "tab%09here:1"),
    ],
)
def test_header_values_are_ascii_and_injective(text: str, sent: str) -> None:
    assert header_value(text) == sent


def test_a_non_ascii_action_id_is_sent_not_refused_after_the_claim(client: httpx.Client) -> None:
    with SimServer() as server:
        sim = create_sim("sim", {"base_url": server.url}, client)
        r = sim.execute(_request("café-42", "book"))
        [seen] = server.requests_for("café-42")
    assert r.wire is Wire.ANSWERED and r.status_code == 201 and r.applied is True
    assert seen["idempotency_key"] == "café-42:1"  # sent as caf%C3%A9-42:1, decoded by the sim


def test_the_sim_provider_honours_the_total_deadline(client: httpx.Client) -> None:
    with SimServer(latency=3.0) as server:
        sim = create_sim("sim", {"base_url": server.url}, client)
        start = time.monotonic()
        r = sim.execute(_request("slow", "book"))
        took = time.monotonic() - start
        assert server.effects_for("slow") == 1  # applied, then answered too late
    assert r.wire is Wire.NO_ANSWER and took < 2.5 and r.written_at is not None


def test_the_sim_provider_does_not_send_after_send_by(client: httpx.Client) -> None:
    with SimServer() as server:
        sim = create_sim("sim", {"base_url": server.url}, client)
        req = Request("late", "book", {}, "late:1", "stl-k", 1, 1.0, send_by=time.monotonic() - 1)
        r = sim.execute(req)
        assert server.requests_for("late") == []
    assert r.wire is Wire.NOT_CONNECTED and r.detail.startswith("not sent:")


def test_sim_latency_knobs(client: httpx.Client) -> None:
    with SimServer(latency=0.2) as server:
        sim = create_sim("sim", {"base_url": server.url}, client)
        start = time.monotonic()
        sim.execute(_request("a", "book"))
        server_wide = time.monotonic() - start
        server.latency = 0.0
        server.plan("b", "latency:0.3")
        start = time.monotonic()
        planned = sim.execute(_request("b", "book"))
        per_plan = time.monotonic() - start
        start = time.monotonic()
        r = client.post(
            server.url + "/v1/book",
            json={"action_id": "c", "reconciliation_key": "k", "params": {}},
            headers={"X-Sim-Latency": "0.25"},
        )
        per_request = time.monotonic() - start
    assert server_wide >= 0.2 and per_plan >= 0.3 and per_request >= 0.25
    assert planned.applied is True and r.status_code == 201


def test_a_header_h11_refuses_is_never_sent(client: httpx.Client) -> None:
    server = RawServer(OK)
    try:
        ex = exchange(client, "GET", server.url + "/x", timeout=1.0, headers={"X-Bad": "a\x00b"})
        time.sleep(0.1)
    finally:
        server.close()
    assert ex.wire is Wire.NOT_CONNECTED and ex.problem.startswith("not sent:"), ex
    assert all(r == b"" for r in server.received)
    assert "\x00" not in ex.problem


def test_the_sim_checks_its_base_url_at_load(client: httpx.Client) -> None:
    from settled.errors import ConfigError

    with pytest.raises(ConfigError, match="base_url"):
        create_sim("sim", {"base_url": "http://host:port/"}, client)


def test_the_http_provider_keeps_the_total_deadline_and_send_by(client: httpx.Client) -> None:
    from settled.providers.http import HttpProvider

    server = RawServer(OK, drip=0.1)
    conf = {
        "base_url": server.url,
        "operations": {"op": {"tier": "full", "request": {"path": "/x"}, "object_id": "/id"}},
    }
    try:
        p = HttpProvider("api", conf, client, {})
        start = time.monotonic()
        slow = p.execute(Request("a", "op", {}, "a:1", None, 1, 1.0))
        took = time.monotonic() - start
        late = p.execute(
            Request("b", "op", {}, "b:1", None, 1, 1.0, send_by=time.monotonic() - 0.5)
        )
    finally:
        server.close()
    assert slow.wire is Wire.NO_ANSWER and took < 3.0 and slow.written_at is not None
    assert late.wire is Wire.NOT_CONNECTED and late.detail.startswith("not sent:")
    assert late.written_at is None and len(server.received) == 1
