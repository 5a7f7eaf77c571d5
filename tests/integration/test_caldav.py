"""The caldav provider against a live Radicale server, started once per session as a
subprocess on a free loopback port (auth none, rights for every authenticated user,
storage in a temp folder) and killed at the end.

A lost reply is simulated by a small TCP proxy in front of Radicale that forwards a
request, lets Radicale answer it, and then cuts the connection instead of passing
the answer on: the effect is applied and the client never hears of it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import rawdb

from settled import Ledger
from settled.dispatch import Dispatcher, DispatchSettings
from settled.errors import InvalidInput
from settled.model import Status
from settled.providers import Registry
from settled.providers.base import QueryTarget, Seen
from settled.reconcile import Reconciler

pytestmark = pytest.mark.ledger_incidental

USER, PASSWORD = "alice", "s3cret-cal-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def radicale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live Radicale for the whole session; yields its base URL."""
    root = tmp_path_factory.mktemp("radicale")
    port = free_port()
    config = root / "config"
    config.write_text(
        "[server]\n"
        f"hosts = 127.0.0.1:{port}\n"
        "[auth]\ntype = none\n"
        "[rights]\ntype = authenticated\n"
        f"[storage]\nfilesystem_folder = {root / 'collections'}\n"
        "[logging]\nlevel = error\n"
    )
    log = (root / "log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "radicale", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"radicale did not start: {(root / 'log').read_text()}"
                    ) from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def calendar(radicale: str) -> str:
    """A fresh calendar collection for one test; returns its path."""
    path = f"/{USER}/{uuid.uuid4().hex[:12]}/"
    with httpx.Client(auth=(USER, PASSWORD)) as c:
        assert c.request("MKCALENDAR", radicale + path).status_code == 201
    return path


class LossyProxy:
    """Forwards one request per connection to ``upstream``; for the first ``drops``
    requests whose method is ``method`` it reads the upstream reply and then resets
    the client connection instead of passing it on."""

    def __init__(self, upstream: str, method: str, drops: int = 1) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.method = method.encode()
        self.drops = drops
        self.dropped: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    @staticmethod
    def _read_message(sock: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def _one(self, conn: socket.socket) -> None:
        request = self._read_message(conn)
        if not request:
            return
        with socket.create_connection(self.upstream) as up:
            up.sendall(request)
            reply = self._read_message(up)
        if request.startswith(self.method + b" ") and self.drops > 0:
            self.drops -= 1
            self.dropped.append(reply.split(b"\r\n", 1)[0])
            conn.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            return  # reset: the effect happened, the answer is lost
        status, _, rest = reply.partition(b"\r\n")
        conn.sendall(status + b"\r\nConnection: close\r\n" + rest)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAL_PASSWORD", PASSWORD)


def registry_for(base: str, path: str, **over: Any) -> Registry:
    conf = {
        "type": "caldav",
        "url": base + path,
        "username": USER,
        "password": "${CAL_PASSWORD}",
        "timeout": 2.0,
        "attempts": 2,
        "verify": {"interval": 0.05, "deadline": 1.0},
        **over,
    }
    return Registry({"cal": conf}, source="test")


def dispatcher(ledger: Ledger, reg: Registry) -> Dispatcher:
    return Dispatcher(ledger, reg, settings=DispatchSettings(backoff=0.01))


BOOKING = {
    "summary": "Dentist; room 2, floor 3",
    "start": "2026-03-02T09:00:00Z",
    "end": "2026-03-02T09:30:00+00:00",
}


def ics(base: str, path: str, uid: str) -> httpx.Response:
    with httpx.Client(auth=(USER, PASSWORD)) as c:
        return c.get(f"{base}{path}{uid}.ics")


def events_in(base: str, path: str) -> int:
    with httpx.Client(auth=(USER, PASSWORD)) as c:
        r = c.request("PROPFIND", base + path, headers={"Depth": "1"})
    return r.text.count(".ics</")


def test_book_is_confirmed_by_the_reply_and_queryable(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    with registry_for(radicale, calendar) as reg:
        report = dispatcher(ledger, reg).submit("cal", "book", BOOKING, action_id="b1")
        rec = report.record
        assert (rec.status, rec.confirmed_by) == (Status.CONFIRMED, "provider"), rec.reason
        uid = rec.reconciliation_key
        assert rec.provider_object_id == uid
        seen = reg.provider("cal").query(QueryTarget("b1", "book", BOOKING, uid, uid, None, 1))
    assert seen.seen is Seen.APPLIED
    got = ics(radicale, calendar, uid)
    assert got.status_code == 200
    assert f"UID:{uid}" in got.text and "DTSTART:20260302T090000Z" in got.text
    assert "SUMMARY:Dentist\\; room 2\\, floor 3" in got.text
    assert events_in(radicale, calendar) == 1


def test_rebook_after_lost_reply_is_a_412_conflict_that_the_query_settles(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    """The 412 is never proof (rule 10): it is reported as a conflict, with the UID as
    the object id, and the event is read before the booking counts as made."""
    proxy = LossyProxy(radicale, "PUT")
    try:
        with registry_for(proxy.url, calendar) as reg:
            rec = dispatcher(ledger, reg).submit("cal", "book", BOOKING, action_id="b2").record
            assert rec.confirmed_by != "provider", rec.reason
            assert rec.provider_object_id == rec.reconciliation_key
            if not rec.terminal:
                Reconciler(ledger, reg, lease=5.0).run_ids(["b2"])
            rec = ledger.get("b2")
    finally:
        proxy.close()
    # Radicale created it; we never heard.
    assert [line.split(b" ", 1)[1] for line in proxy.dropped] == [b"201 Created"]
    assert rec.status is Status.CONFIRMED and rec.confirmed_by != "provider", rec.reason
    [outcome] = [e for e in ledger.events("b2") if e.kind == "outcome"]
    assert [(t["wire"], t["status_code"]) for t in outcome.detail["tries"]] == [
        ("no_answer", None),
        ("answered", 412),
    ]
    assert events_in(radicale, calendar) == 1  # never twice


def test_lost_reply_without_a_repeat_is_settled_by_the_query(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    proxy = LossyProxy(radicale, "PUT")
    try:
        with registry_for(proxy.url, calendar, attempts=1) as reg:
            rec = dispatcher(ledger, reg).submit("cal", "book", BOOKING, action_id="b3").record
            assert rec.status is Status.DENIED_UNRESOLVED and rec.next_check_at
            Reconciler(ledger, reg).run_ids(["b3"])
    finally:
        proxy.close()
    final = ledger.get("b3")
    assert (final.status, final.confirmed_by) == (Status.CONFIRMED, "reconciliation")


def book(ledger: Ledger, reg: Registry, aid: str) -> str:
    rec = dispatcher(ledger, reg).submit("cal", "book", BOOKING, action_id=aid).record
    assert rec.status is Status.CONFIRMED
    return str(rec.reconciliation_key)


def test_move_then_cancel(radicale: str, calendar: str, ledger: Ledger, env: None) -> None:
    with registry_for(radicale, calendar) as reg:
        uid = book(ledger, reg, "b4")
        d = dispatcher(ledger, reg)
        move = {"uid": uid, "start": "2026-03-02T11:00:00+01:00", "end": "2026-03-02T10:45:00Z"}
        moved = d.submit("cal", "move", move, action_id="m4").record
        assert (moved.status, moved.confirmed_by) == (Status.CONFIRMED, "provider"), moved.reason
        p = reg.provider("cal")
        seen = p.query(QueryTarget("m4", "move", move, moved.reconciliation_key, uid, None, 1))
        assert seen.seen is Seen.APPLIED and seen.evidence["start"] == "20260302T100000Z"
        body = ics(radicale, calendar, uid).text
        assert "DTSTART:20260302T100000Z" in body and "DTEND:20260302T104500Z" in body
        assert "SEQUENCE:1" in body
        # Another action's key is not on the event: its move did not happen.
        other = p.query(
            QueryTarget(
                "m5", "move", {**move, "start": "2026-03-02T12:00:00Z"}, "stl-other", uid, None, 1
            )
        )
        assert other.seen is Seen.NOT_YET

        cancelled = d.submit("cal", "cancel", {"uid": uid}, action_id="c4").record
        assert cancelled.status is Status.CONFIRMED, cancelled.reason
        seen = p.query(
            QueryTarget("c4", "cancel", {"uid": uid}, cancelled.reconciliation_key, uid, None, 1)
        )
        assert seen.seen is Seen.APPLIED
        body = ics(radicale, calendar, uid).text
        assert "STATUS:CANCELLED" in body and "SEQUENCE:2" in body
        # The booking still shows as made (then cancelled); the move's key survived.
        assert moved.reconciliation_key in body
    assert events_in(radicale, calendar) == 1


def test_move_repeated_after_lost_reply_finds_its_own_mark(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    with registry_for(radicale, calendar) as reg:
        uid = book(ledger, reg, "b6")
    proxy = LossyProxy(radicale, "PUT")
    move = {"uid": uid, "start": "2026-03-03T09:00:00Z", "end": "2026-03-03T10:00:00Z"}
    try:
        with registry_for(proxy.url, calendar) as reg:
            rec = dispatcher(ledger, reg).submit("cal", "move", move, action_id="m6").record
    finally:
        proxy.close()
    assert proxy.dropped and rec.status is Status.CONFIRMED, rec.reason
    [outcome] = [e for e in ledger.events("m6") if e.kind == "outcome"]
    assert [t["wire"] for t in outcome.detail["tries"]] == ["no_answer", "answered"]
    body = ics(radicale, calendar, uid).text
    assert body.count(str(rec.reconciliation_key)) == 1 and "SEQUENCE:1" in body


def test_move_of_a_missing_event_fails(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    with registry_for(radicale, calendar) as reg:
        move = {"uid": "nope", "start": "2026-03-03T09:00:00Z", "end": "2026-03-03T10:00:00Z"}
        rec = dispatcher(ledger, reg).submit("cal", "move", move, action_id="m7").record
    assert rec.status is Status.FAILED and "404" in (rec.reason or "")


def test_cancel_query_when_someone_else_deleted_it(
    radicale: str, calendar: str, ledger: Ledger, env: None
) -> None:
    with registry_for(radicale, calendar) as reg:
        uid = book(ledger, reg, "b8")
        with httpx.Client(auth=(USER, PASSWORD)) as c:
            assert c.delete(f"{radicale}{calendar}{uid}.ics").status_code in (200, 204)
        seen = reg.provider("cal").query(
            QueryTarget("c8", "cancel", {"uid": uid}, "stl-x", uid, None, 1)
        )
    assert seen.seen is Seen.AMBIGUOUS


@pytest.mark.parametrize(
    ("op", "params", "words"),
    [
        ("book", {"summary": "x", "start": "2026-03-02T09:00:00Z"}, "'end'"),
        (
            "book",
            {"summary": "x", "start": "2026-03-02T09:00:00", "end": "2026-03-02T10:00:00"},
            "UTC offset",
        ),
        (
            "book",
            {"summary": "x", "start": "2026-03-02T10:00:00Z", "end": "2026-03-02T09:00:00Z"},
            "after start",
        ),
        ("move", {"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z"}, "'uid'"),
        ("cancel", {}, "'uid'"),
    ],
)
def test_bad_params_are_refused_before_recording(
    radicale: str, calendar: str, ledger: Ledger, env: None, op: str, params: Any, words: str
) -> None:
    with registry_for(radicale, calendar) as reg, pytest.raises(InvalidInput, match=words):
        dispatcher(ledger, reg).submit("cal", op, params, action_id="x1")
    assert ledger.find("x1") is None


def test_password_never_reaches_the_ledger(
    radicale: str, calendar: str, ledger: Ledger, env: None, db_path: Path
) -> None:
    with registry_for(radicale, calendar) as reg:
        book(ledger, reg, "b9")
    ledger.close()
    if rawdb.is_pg(db_path):
        raw = str(rawdb.dump(db_path)).encode()
    else:
        raw = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
    assert PASSWORD.encode() not in raw


def test_verify_declares_min_checks(env: None) -> None:
    """verify = { interval, deadline, min_checks } as on every provider type (rule 15)."""
    from settled.errors import ConfigError

    reg = registry_for("http://127.0.0.1:1", "/cal/", verify={"deadline": 9, "min_checks": 4})
    try:
        spec = reg.operation("cal", "book")
        assert (spec.verify_deadline, spec.verify_min_checks) == (9.0, 4)
    finally:
        reg.close()
    for bad in ({"min_checks": 0}, {"min_checks": 1.5}, {"every": 2}):
        reg = registry_for("http://127.0.0.1:1", "/cal/", verify=bad)
        try:
            with pytest.raises(ConfigError, match="verify"):
                reg.operation("cal", "book")
        finally:
            reg.close()
