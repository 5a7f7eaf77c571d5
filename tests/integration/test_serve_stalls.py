"""Stalled clients against a real ``settled serve`` started with a soft descriptor limit
of 1,024 (as a shell or a unit without ``LimitNOFILE`` leaves it): 1,100 unsigned
callback uploads that stop half-way through their bodies, plus connections that send
nothing, half a request head, or a signed-looking body that stops. While the attacker
holds every one of its sockets open, ``/healthz``, the API and a correctly signed
callback are answered; and every stalled connection is closed by the service once its
limit passes (an unsigned upload at once, before its body is read; a head or a body
that stops after ``[serve] head_timeout`` / ``body_timeout``).

Both ways a machine can be set: a soft limit the service raises to a higher hard one
at start (logged), and a hard limit of 1,024 too, where the connection cap (kept below
the limit) is what leaves descriptors for the service's own work.

The attacker connects from 127.0.0.2, the honest clients from 127.0.0.1: the cap on
bodies read at once is per client address."""

from __future__ import annotations

import resource
import selectors
import socket
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from hookkit import body, sent, std_headers
from serving import Running, auth, env_name, process
from support import sim_conf, write_config
from test_serve_hooks import ENV, TABLE

from settled.model import Status
from settled.providers.sim_server import SimServer
from settled.storage import Ledger

pytestmark = [pytest.mark.slow(seconds=100)]

SOFT = 1024
UPLOADS = 1_100  # unsigned callbacks that stop half-way through their bodies
OTHERS = 30  # of each: idle, half a head, a signed-looking body that stops
HEAD, BODY = 6.0, 8.0  # s: [serve] head_timeout, body_timeout for this run
BODIES = 16  # [serve] bodies_per_client
ATTACKER = "127.0.0.2"
BOUND = 120.0  # s for the whole attack to be closed; the test waits for events within it


@pytest.fixture(params=["raised", "capped"])
def service(request: pytest.FixtureRequest, tmp_path: Path, sim: SimServer) -> Iterator[Running]:
    """``settled serve`` started with a soft limit of 1,024 descriptors ("raised": under
    the machine's hard limit, which it raises to; "capped": the hard limit 1,024 too)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * SOFT:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves no room for the attack")
    reader = {"secret": f"${{{env_name('reader')}}}", "roles": ["read"]}
    limits = {"head_timeout": HEAD, "body_timeout": BODY, "bodies_per_client": BODIES}
    write_config(
        tmp_path / "settled.toml",
        {"sim": {**sim_conf(sim), "callbacks": TABLE}},
        serve=limits,
        **{"serve.tokens.reader": reader},
    )
    child_hard = SOFT if request.param == "capped" else hard

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, child_hard))

    with process(env=ENV, preexec=limit) as running:
        running.mode = request.param  # type: ignore[attr-defined]
        yield running


@pytest.fixture
def many_sockets() -> Iterator[None]:
    """This process may hold the attack's sockets (its own soft limit raised)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * SOFT if hard == resource.RLIM_INFINITY else min(hard, 4 * SOFT)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((ATTACKER, 0))
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    return s


def head(port: int, headers: dict[str, str], length: int = 100_000) -> bytes:
    lines = [
        "POST /hooks/sim HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def closed_by_the_service(socks: dict[socket.socket, str], bound: float) -> dict[str, Counter[str]]:
    """Wait (at most ``bound`` s) until the service has closed every socket; for each
    kind of stall, what the service answered before it closed (the status line's code,
    or "" for a close without a word)."""
    answers: dict[socket.socket, bytes] = {s: b"" for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + bound
    open_ = set(socks)
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""  # closed by the service, with data it did not read
            if data:
                answers[s] += data
                continue
            sel.unregister(s)
            open_.discard(s)
    sel.close()
    assert not open_, f"{len(open_)} stalled connections still open after {bound} s"
    out: dict[str, Counter[str]] = {}
    for s, kind in socks.items():
        first = answers[s].split(b"\r\n", 1)[0].decode("latin-1")
        code = first.split(" ")[1] if first.startswith("HTTP/1.1 ") else ""
        out.setdefault(kind, Counter())[code] += 1
    return out


def test_stalled_uploads_cannot_take_the_service_down(
    service: Running, ledger: Ledger, many_sockets: None
) -> None:
    listening = service.listening
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if service.mode == "raised":  # type: ignore[attr-defined]
        assert listening["nofile_was"] == SOFT and listening["nofile"] > SOFT, listening
    else:
        assert listening["nofile"] == SOFT and "nofile_was" not in listening, listening
    assert listening["max_connections"] < listening["nofile"] <= max(hard, SOFT)
    port = int(service.url.rsplit(":", 1)[1])
    sent(ledger, "a-1", object_id="m-1", provider="sim")

    # the attack: every socket is held open by the attacker until the end of the test
    socks: dict[socket.socket, str] = {}
    unsigned = head(port, {})
    forged = head(
        port, {"webhook-id": "msg_x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"}
    )
    try:
        for kind, n in (("idle", OTHERS), ("half-head", OTHERS)):
            for _ in range(n):
                s = connect(port)
                if kind == "half-head":
                    s.sendall(f"POST /hooks/sim HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
                socks[s] = kind
        for _ in range(OTHERS):
            s = connect(port)
            s.sendall(forged + b"{" + b" " * 999)
            socks[s] = "forged-body"
        for _ in range(UPLOADS):
            try:
                s = connect(port)
                s.sendall(unsigned + b"{" + b" " * 999)
            except OSError:
                continue  # refused at the door: counted below as not uploaded
            socks[s] = "unsigned-upload"

        # the service answers its honest clients while the attacker holds all of it
        with httpx.Client(timeout=30) as c:
            h = c.get(f"{service.url}/healthz")
            assert h.status_code == 200 and h.text == "ok\n", h.text
            r = c.get(f"{service.url}/api/v1/actions/a-1", headers=auth("reader"))
            assert r.status_code == 200 and r.json()["status"] == "AWAITING_VERIFICATION"
            good = body(type="x", data={"id": "m-1", "status": "delivered"})
            ok = c.post(
                f"{service.url}/hooks/sim",
                content=good,
                headers=std_headers(good, ts=datetime.now(UTC), msg_id="msg_ok"),
            )
            assert ok.status_code == 200 and ok.json() == {"received": 1, "matched": 1}, ok.text
        assert ledger.get("a-1").status is Status.CONFIRMED

        # and every stalled connection is closed by the service, each once its limit passed
        seen = closed_by_the_service(socks, BOUND)
    finally:
        for s in socks:
            s.close()
    uploads = seen["unsigned-upload"]
    assert set(uploads) <= {"401", "503"} and uploads["401"] > 0, uploads  # 503: the cap
    if service.mode == "raised":  # type: ignore[attr-defined]
        assert uploads == {"401": UPLOADS}, uploads
    assert set(seen["idle"]) <= {"", "503"}, seen["idle"]  # no word to one that said nothing
    assert set(seen["half-head"]) <= {"408", "503"}, seen["half-head"]
    forged_seen = seen["forged-body"]
    assert set(forged_seen) <= {"408", "429", "503"} and forged_seen["408"] <= BODIES, forged_seen
    assert service.stop() == 0
