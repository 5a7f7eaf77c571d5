"""Each connection limit of ``settled serve``, one at a time, on a real process with
short limits: a connection that sends nothing is closed at ``head_timeout``; half a
head is answered 408 and closed; a body that stops is answered 408 and closed at
``body_timeout`` (and logged as its route's 408); a connection past
``max_connections`` is answered 503 at the door; a body answered early is drained
(its connection serves the next request) within bounds; and a kept-alive connection
that answers requests is not cut while it works. Every wait is for an event (the service
closing the socket), bounded."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving import Running, process
from support import sim_conf, write_config
from test_serve_hooks import ENV, TABLE

from settled.providers.sim_server import SimServer

pytestmark = [pytest.mark.ledger_incidental]  # the connections are the subject, not the ledger

HEAD, BODY = 1.0, 1.5  # s: this run's [serve] head_timeout and body_timeout
CAP = 16  # [serve] max_connections (the least the service allows)
BOUND = 60.0  # s any one wait may take on a loaded machine


@pytest.fixture
def service(tmp_path: Path, sim: SimServer) -> Iterator[Running]:
    write_config(
        tmp_path / "settled.toml",
        {"sim": {**sim_conf(sim), "callbacks": TABLE}},
        serve={"head_timeout": HEAD, "body_timeout": BODY, "max_connections": CAP},
    )
    with process(env=ENV) as svc:
        yield svc


def port_of(svc: Running) -> int:
    return int(svc.url.rsplit(":", 1)[1])


def connect(svc: Running) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port_of(svc)), timeout=BOUND)
    return s


def until_closed(s: socket.socket) -> bytes:
    """Everything the service sent before it closed the connection."""
    got = b""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"the service kept the connection open {BOUND} s: {got[:200]!r}")


def test_each_stall_is_closed_at_its_limit(service: Running) -> None:
    port = port_of(service)
    assert service.listening["max_connections"] == CAP
    idle = connect(service)
    half = connect(service)
    half.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
    body = connect(service)
    body.sendall(
        (
            f"POST /hooks/sim HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nwebhook-id: m\r\n"
            "webhook-timestamp: 1\r\nwebhook-signature: v1,AAAA\r\nContent-Length: 1000\r\n\r\n{"
        ).encode()
    )
    unsigned = connect(service)
    unsigned.sendall(
        f"POST /hooks/sim HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 1000\r\n\r\n{{".encode()
    )
    try:
        assert until_closed(unsigned).startswith(b"HTTP/1.1 401 ")  # before its body
        assert until_closed(idle) == b""  # nothing said to one that said nothing
        assert until_closed(half).startswith(b"HTTP/1.1 408 ")
        assert until_closed(body).startswith(b"HTTP/1.1 408 ")
    finally:
        for s in (idle, half, body, unsigned):
            s.close()
    assert httpx.get(f"{service.url}/healthz", timeout=BOUND).status_code == 200
    assert service.stop() == 0
    hooks = [
        (e["status"], e["callback"]["reason"])
        for e in service.rest()
        if e.get("event") == "request" and e.get("route") == "/hooks/{provider}"
    ]
    assert sorted(hooks) == [(401, "bad_signature"), (408, "incomplete")], hooks


def read_answer(s: socket.socket) -> bytes:
    """One whole answer (its head and a ``content-length`` body) off the socket."""
    got = b""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        head, sep, rest = got.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")[1:]
                if line.lower().startswith(b"content-length:")
            )
            if len(rest) >= length:
                return got
        chunk = s.recv(65536)
        assert chunk, f"the service closed the connection: {got[:200]!r}"
        got += chunk
    raise AssertionError(f"no whole answer within {BOUND} s: {got[:200]!r}")


def test_an_early_answer_drains_the_body_and_keeps_the_connection(service: Running) -> None:
    """A callback refused before its body arrived (no signature): the client reads the
    401 while it is still sending, finishes its body, and its next request on the same
    connection is answered, as HTTP/1.1 allows. (Shutting the write side after an early
    answer lost that next request when the client had not seen the shutdown yet.)"""
    port = port_of(service)
    s = connect(service)
    try:
        s.sendall(
            f"POST /hooks/sim HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 2000\r\n\r\n{{".encode()
        )
        assert read_answer(s).startswith(b"HTTP/1.1 401 ")  # before its body came
        s.sendall(b" " * 1998 + b"}")  # the rest: parsed and dropped
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok\n"), answer
    finally:
        s.close()


def test_a_drained_body_that_never_ends_is_closed(service: Running) -> None:
    """The drain is bounded: a client that keeps sending a body answered early, a
    little at a time (never quiet long enough for the idle limit), is closed once
    ``body_timeout`` passes from the answer."""
    port = port_of(service)
    s = connect(service)
    try:
        s.sendall(
            f"POST /hooks/sim HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100000000\r\n\r\n{{".encode()
        )
        assert read_answer(s).startswith(b"HTTP/1.1 401 ")
        s.settimeout(0.2)
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            try:
                s.sendall(b" " * 100)
                if s.recv(65536) == b"":
                    return  # closed by the service
            except TimeoutError:
                continue  # still open: send a little more
            except (BrokenPipeError, ConnectionResetError):
                return
        raise AssertionError(f"a drained body kept its connection {BOUND} s")
    finally:
        s.close()


def test_a_connection_past_the_cap_is_answered_503_at_the_door(service: Running) -> None:
    held = [connect(service) for _ in range(CAP)]
    try:
        extra = connect(service)
        try:
            assert until_closed(extra).startswith(b"HTTP/1.1 503 ")
        finally:
            extra.close()
    finally:
        for s in held:
            s.close()
    # the held ones gone, the service answers again (each close is seen by its loop)
    deadline = time.monotonic() + BOUND
    while True:
        r = httpx.get(f"{service.url}/healthz", timeout=BOUND)
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, r.status_code
        time.sleep(0.05)


def test_a_kept_alive_connection_that_works_is_never_cut(service: Running) -> None:
    """Requests on one connection, idle between them for longer than ``head_timeout``:
    an idle kept-alive connection is the keep-alive timer's (75 s), and each head and
    body that arrive in time start their limit afresh, so none passes."""
    ports: set[int] = set()
    with httpx.Client(timeout=BOUND) as c:
        for _ in range(3):
            r = c.get(f"{service.url}/healthz")
            assert r.status_code == 200
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            time.sleep(HEAD + 0.3)  # idle: longer than a head may take, not a stall
    assert len(ports) == 1, f"the kept-alive connection was closed: local ports {ports}"
