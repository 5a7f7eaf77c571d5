"""The ``http`` provider against Datasette 1.0's JSON write API, with a signed token,
behind the fault proxy: a wrapped body (``{"row": {...}}``) with the key at a JSON
pointer, read back by primary key. The final statuses must agree with the table."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from realservers import FaultProxy, datasette

from settled import Ledger
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import ActionRecord, Status
from settled.providers import Registry
from settled.reconcile import Reconciler

pytestmark = [pytest.mark.ledger_incidental, pytest.mark.slow]

HOLD = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with datasette(tmp_path_factory.mktemp("datasette")) as found:
        yield found


@pytest.fixture
def world(
    server: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FaultProxy, Ledger, Dispatcher, Reconciler]]:
    url, token = server
    monkeypatch.setenv("DS_TOKEN", token)
    proxy = FaultProxy(url)
    conf = {
        "type": "http",
        "base_url": proxy.url,
        "timeout": 0.5,
        "auth": {"type": "bearer", "token": "${DS_TOKEN}"},
        "operations": {
            "insert": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "attempts": 1,
                "request": {
                    "method": "POST",
                    "path": "/shop/orders/-/insert",
                    "body": {"row": "{params}"},
                },
                "reconciliation_key_field": "/row/ref",
                "query": {
                    "path": "/shop/orders/{reconciliation_key}.json",
                    "list": "/rows",
                    "match": "/ref",
                },
                "verify": {"interval": 0.1, "deadline": 3.0},
            }
        },
    }
    with (
        Ledger.open(os.environ["SETTLED_DB"]) as ledger,
        Registry({"ds": conf}, source="test") as reg,
    ):
        d = Dispatcher(ledger, reg, settings=DispatchSettings(lease_grace=2.0, backoff=0.01))
        yield proxy, ledger, d, Reconciler(ledger, reg, lease=5.0)
    proxy.close()


def rows(url: str, ref: str | None) -> list[dict[str, Any]]:
    if ref is None:
        return []
    got = httpx.get(f"{url}/shop/orders.json", params={"ref": ref, "_shape": "array"}, timeout=30)
    return [r for r in got.json() if r["ref"] == ref]


def settle(ledger: Ledger, reconciler: Reconciler, aid: str, budget: float = 6.0) -> ActionRecord:
    stop = time.monotonic() + budget
    while True:
        r = ledger.get(aid)
        if r.terminal or (r.status is Status.DENIED_UNRESOLVED and not r.next_check_at):
            return r
        if time.monotonic() > stop:
            return r
        reconciler.run_ids([aid])
        time.sleep(0.05)


FAULTS = {
    "pass": Status.CONFIRMED,
    "drop": Status.CONFIRMED,
    f"delay_before:{HOLD}": Status.CONFIRMED,
    f"delay_after:{HOLD}": Status.CONFIRMED,
    "502_after": Status.CONFIRMED,
    "502": Status.DENIED_UNRESOLVED,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_insert_under_faults_agrees_with_the_table(
    server: tuple[str, str], world: tuple[Any, ...], fault: str
) -> None:
    proxy, ledger, d, reconciler = world
    proxy.plan(fault)
    report = d.submit("ds", "insert", {"item": "tea", "qty": 2}, action_id=f"ds-{fault}")
    if fault == "pass":
        [(_, line)] = proxy.log
        assert line.startswith(b"POST /shop/orders/-/insert ")
    proxy.settle()
    r = settle(ledger, reconciler, report.record.action_id)
    found = rows(server[0], r.reconciliation_key)
    assert len(found) <= 1
    assert r.status is FAULTS[fault], r.reason
    assert (len(found) == 1) == (r.status is Status.CONFIRMED)
    if found:
        assert found[0]["item"] == "tea" and found[0]["qty"] == 2


def test_the_token_never_reaches_the_ledger(
    server: tuple[str, str], world: tuple[Any, ...]
) -> None:
    proxy, ledger, d, _ = world
    proxy.plan("502")
    d.submit("ds", "insert", {"item": "x"}, action_id="ds-secret")
    token = server[1]
    dumped = repr(ledger.get("ds-secret")) + repr(ledger.events("ds-secret"))
    assert token not in dumped and token[-20:] not in dumped
