"""The ``caldav`` provider against Radicale, behind the fault proxy, read back by an
independent client (python-caldav): after book, move and cancel, and after each fault
on the writes, what settled says must be what the calendar holds."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import caldav
import httpx
import pytest
from caldav.lib.error import NotFoundError
from realservers import FaultProxy, radicale

from settled import Ledger
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import ActionRecord, Status
from settled.providers import Registry
from settled.reconcile import Reconciler

pytestmark = [pytest.mark.ledger_incidental, pytest.mark.slow]

USER, PASSWORD = "bob", "cal-pw-123"
BOOKING = {"summary": "Review", "start": "2026-05-04T09:00:00Z", "end": "2026-05-04T10:00:00Z"}
MOVED = {"start": "2026-05-04T14:00:00Z", "end": "2026-05-04T15:00:00Z"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with radicale(tmp_path_factory.mktemp("radicale")) as url:
        yield url


@pytest.fixture
def world(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FaultProxy, Ledger, Dispatcher, Reconciler, Any]]:
    monkeypatch.setenv("CAL_PW", PASSWORD)
    path = f"/{USER}/{uuid.uuid4().hex[:10]}/"
    with httpx.Client(auth=(USER, PASSWORD)) as c:
        assert c.request("MKCALENDAR", server + path).status_code == 201
    proxy = FaultProxy(server, methods=("PUT",))
    conf = {
        "type": "caldav",
        "url": proxy.url + path,
        "username": USER,
        "password": "${CAL_PW}",
        "timeout": 1.0,
        "attempts": 3,
        "verify": {"interval": 0.1, "deadline": 3.0},
    }
    reader = caldav.DAVClient(
        url=server, username=USER, password=PASSWORD, require_tls=False, enable_rfc6764=False
    )
    calendar = reader.calendar(url=server + path)
    with (
        Ledger.open(os.environ["SETTLED_DB"]) as ledger,
        Registry({"cal": conf}, source="test") as reg,
    ):
        d = Dispatcher(ledger, reg, settings=DispatchSettings(lease_grace=2.0, backoff=0.01))
        yield proxy, ledger, d, Reconciler(ledger, reg, lease=5.0), calendar
    proxy.close()
    reader.close()


def settle(world: tuple[Any, ...], aid: str) -> ActionRecord:
    _, ledger, _, reconciler, _ = world
    stop = time.monotonic() + 6
    while True:
        r: ActionRecord = ledger.get(aid)
        if r.terminal or (r.status is Status.DENIED_UNRESOLVED and not r.next_check_at):
            return r
        if time.monotonic() > stop:
            return r
        reconciler.run_ids([aid])
        time.sleep(0.05)


def event(calendar: Any, uid: str) -> Any | None:
    """The event as python-caldav reads it, or None."""
    try:
        return calendar.get_event_by_uid(uid).icalendar_component
    except NotFoundError:
        return None


def count(calendar: Any) -> int:
    return len(calendar.get_events())


def utc(value: Any) -> datetime:
    return value.dt.astimezone(UTC)


BOOK_FAULTS = ["pass", "drop", "502", "502_after", "delay_after:1.5"]


@pytest.mark.parametrize("fault", BOOK_FAULTS)
def test_book_under_faults_matches_the_calendar(world: tuple[Any, ...], fault: str) -> None:
    proxy, _, d, _, calendar = world
    proxy.plan(fault)
    d.submit("cal", "book", BOOKING, action_id=f"book-{fault}")
    proxy.settle()
    r = settle(world, f"book-{fault}")
    assert r.status is Status.CONFIRMED, r.reason
    assert r.provider_object_id == r.reconciliation_key  # the UID, for move and cancel
    got = event(calendar, r.reconciliation_key)
    assert got is not None and count(calendar) == 1  # there, and never twice
    assert utc(got["DTSTART"]) == datetime(2026, 5, 4, 9, tzinfo=UTC)
    if fault != "pass":
        assert r.confirmed_by != "provider" or fault == "502", r.reason


def test_a_book_that_never_arrives_is_not_in_the_calendar(world: tuple[Any, ...]) -> None:
    proxy, _, d, _, calendar = world
    proxy.plan("502", "502", "502")
    d.submit("cal", "book", BOOKING, action_id="book-never")
    r = settle(world, "book-never")
    assert r.status is not Status.CONFIRMED, r.reason
    assert event(calendar, r.reconciliation_key) is None and count(calendar) == 0


@pytest.mark.parametrize("fault", ["pass", "drop", "502_after"])
def test_move_and_cancel_under_faults_match_the_calendar(
    world: tuple[Any, ...], fault: str
) -> None:
    proxy, _, d, _, calendar = world
    d.submit("cal", "book", BOOKING, action_id="b")
    uid = settle(world, "b").provider_object_id
    assert uid is not None

    proxy.plan(fault)
    d.submit("cal", "move", {"uid": uid, **MOVED}, action_id="m")
    proxy.settle()
    moved = settle(world, "m")
    got = event(calendar, uid)
    assert moved.status is Status.CONFIRMED, moved.reason
    assert got is not None and utc(got["DTSTART"]) == datetime(2026, 5, 4, 14, tzinfo=UTC)

    proxy.plan(fault)
    d.submit("cal", "cancel", {"uid": uid}, action_id="c")
    proxy.settle()
    cancelled = settle(world, "c")
    got = event(calendar, uid)
    assert cancelled.status is Status.CONFIRMED, cancelled.reason
    assert got is not None and str(got["STATUS"]) == "CANCELLED"
    assert count(calendar) == 1


def test_a_refused_move_leaves_the_calendar_as_it_was(world: tuple[Any, ...]) -> None:
    proxy, _, d, _, calendar = world
    d.submit("cal", "book", BOOKING, action_id="b2")
    uid = settle(world, "b2").provider_object_id
    proxy.plan("502", "502", "502")  # every try of the move's PUT fails at the gateway
    d.submit("cal", "move", {"uid": uid, **MOVED}, action_id="m2")
    r = settle(world, "m2")
    got = event(calendar, uid)
    assert r.status is not Status.CONFIRMED
    assert got is not None and utc(got["DTSTART"]) == datetime(2026, 5, 4, 9, tzinfo=UTC)
