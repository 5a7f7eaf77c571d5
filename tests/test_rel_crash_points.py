"""Crash at every step: real ``settled`` processes SIGKILL themselves at an armed fault
point (``settled.faults``), then a restart and a reconciliation pass (also a real
process) must leave the invariants intact and the ledger passing
``PRAGMA integrity_check``. Real time, tiny leases: ``[dispatch] lease_grace`` and
``[reconcile] lease`` in the config.

The reconciler runs as a small ``python -c`` script over the library
(``RECONCILE_SCRIPT``); once ``settled reconcile`` exists it can take its place there.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, popen_cli, write_config
from invariants import check, settle

from settled.config import load
from settled.dispatch import Dispatcher, DispatchSettings
from settled.ledger import Ledger
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

C, F, U, A = (
    Status.CONFIRMED,
    Status.FAILED,
    Status.DENIED_UNRESOLVED,
    Status.AWAITING_VERIFICATION,
)

DISPATCH_LEASE_GRACE = 0.2  # with timeout 0.3 × 1 attempt: an IN_FLIGHT lease of 0.5 s
RECONCILE_LEASE = 0.3

DISPATCH_POINTS = (
    "before_claim",
    "before_commit:claimed",
    "after_claim",
    "after_send",
    "after_reply",
    "before_commit:outcome",
)
RECONCILE_POINTS = (
    "before_commit:lease_expired",
    "before_check",
    "before_commit:reconciled",
    "before_commit:unresolved",
)

# What each crash leaves provably unknown, once restarted and reconciled:
#   before the claim commits  -> nothing sent: `confirm` finds the record still PENDING;
#                                `dispatch` records and claims in one transaction, so
#                                it left no record, and dispatching again sends it
#   after the claim, unsent   -> lease expires -> unresolved; nothing ever shows
#   sent (after the send, the reply, before the outcome commits)
#                             -> lease expires -> unresolved -> the query observes it
NOT_CLAIMED = {"book": C, "send": C, "notify": U, "confirm-send": C}
CLAIMED_UNSENT = {"book": U, "send": U, "notify": U, "confirm-send": U}
SENT = {"book": C, "send": C, "notify": U, "confirm-send": C}
AFTER_RECOVERY = {
    "before_claim": NOT_CLAIMED,
    "before_commit:claimed": NOT_CLAIMED,
    "after_claim": CLAIMED_UNSENT,
    "after_send": SENT,
    "after_reply": SENT,
    "before_commit:outcome": SENT,
}

RECONCILE_SCRIPT = """
import sys, time
from settled.config import load
from settled.ledger import Ledger
from settled.providers import Registry
from settled.reconcile import Reconciler

db, config = sys.argv[1], sys.argv[2]
cfg = load(config)
registry = Registry(cfg.providers, source=config)
with Ledger.open(db) as ledger:
    r = Reconciler(ledger, registry, lease=cfg.reconcile_lease)
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        r.run_due()
        time.sleep(0.02)
registry.close()
print("pass complete")
"""


def reconcile_process(db: Path, config: Path, seconds: float, point: str | None = None) -> subprocess.CompletedProcess[str]:
    """One reconciler, as a real process, running passes for ``seconds``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if point:
        env["SETTLED_FAULTPOINT"] = point
    return subprocess.run(
        [sys.executable, "-c", RECONCILE_SCRIPT, str(db), str(config), str(seconds)],
        capture_output=True, text=True, env=env, timeout=60, cwd=str(ROOT),
    )


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0, honour_keys=False) as s:
        yield s


@pytest.fixture
def config(tmp_path: Path, server: SimServer) -> Path:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": 0.3,
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 0.6,
    }
    return write_config(
        tmp_path / "settled.toml",
        {"sim": provider},
        dispatch={"lease_grace": DISPATCH_LEASE_GRACE},
        reconcile={"lease": RECONCILE_LEASE},
    )


def _wait_for(cond: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _raw_integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


@contextmanager
def _registry(config: Path) -> Iterator[Registry]:
    cfg = load(str(config))
    registry = Registry(cfg.providers, source=str(config))
    try:
        yield registry
    finally:
        registry.close()


def _communicate_all(procs: dict[Any, subprocess.Popen[str]]) -> dict[Any, tuple[int, str, str]]:
    out = {}
    for key, p in procs.items():
        stdout, stderr = p.communicate(timeout=90)
        out[key] = (p.returncode, stdout, stderr)
    return out


@pytest.mark.slow
def test_dispatcher_killed_at_every_step(server: SimServer, config: Path, db_path: Path) -> None:
    """Every crash point × (dispatch book, dispatch send, dispatch notify, confirm send),
    all at once on one ledger: 24 processes that each SIGKILL themselves."""
    cases = {
        (point, kind): f"crash-{point.replace(':', '_')}-{kind}"
        for point in DISPATCH_POINTS
        for kind in ("book", "send", "notify", "confirm-send")
    }
    params = {aid: json.dumps({"to": aid}) for aid in cases.values()}
    # The confirm path: recorded first (no crash), then confirmed by a process that dies.
    with Ledger.open(db_path) as ledger, _registry(config) as registry:
        d = Dispatcher(ledger, registry)
        for (point, kind), aid in cases.items():
            if kind == "confirm-send":
                d.submit("sim", "send", json.loads(params[aid]), action_id=aid,
                         needs_confirmation=True)
    procs = {}
    for (point, kind), aid in cases.items():
        armed = {"SETTLED_FAULTPOINT": point}
        if kind == "confirm-send":
            procs[(point, kind)] = popen_cli("confirm", aid, "--json", env=armed)
        else:
            procs[(point, kind)] = popen_cli("dispatch", "sim", kind, "--action-id", aid,
                                             "--params", params[aid], "--json", env=armed)
    for case, (code, out, err) in _communicate_all(procs).items():
        assert code == -signal.SIGKILL, f"{case}: exit {code}: {err}"
        assert out == "" and "Traceback" not in err, case
    sent_points = ("after_send", "after_reply", "before_commit:outcome")
    _wait_for(lambda: all(server.requests_for(aid) for (point, _), aid in cases.items()
                          if point in sent_points))

    # The killed processes left the ledger whole, each record where its crash put it
    # (a dispatch killed before its claim committed left none).
    assert _raw_integrity(db_path) == "ok"
    with Ledger.open(db_path) as ledger:
        for (point, kind), aid in cases.items():
            found = ledger.find(aid)
            if AFTER_RECOVERY[point] is not NOT_CLAIMED:
                assert found is not None and found.status is Status.IN_FLIGHT, (point, kind)
            elif kind == "confirm-send":
                assert found is not None and found.status is Status.PENDING, (point, kind)
            else:
                assert found is None, (point, kind)
                assert ledger.events(aid) == [], (point, kind)

    # A cron job repeating the same dispatch sends nothing new (one record left
    # PENDING by its crash, one left IN_FLIGHT).
    before = len(server.truth()["requests"])
    again = {
        point: popen_cli("dispatch", "sim", "send", "--action-id", cases[(point, kind)],
                         "--params", params[cases[(point, kind)]])
        for point, kind in (("before_claim", "confirm-send"), ("after_send", "send"))
    }
    for point, (code, _, err) in _communicate_all(again).items():
        assert code == 3, (point, code, err)  # PENDING / IN_FLIGHT: in progress
    assert len(server.truth()["requests"]) == before

    # Restart: a new dispatcher confirms the records that were never claimed and
    # dispatches again the ones that left no record; the rest wait for their lease to
    # expire and a reconciler (a real process) to take over.
    with Ledger.open(db_path) as ledger, _registry(config) as registry:
        d = Dispatcher(ledger, registry, actor="restarted")
        for (point, kind), aid in cases.items():
            if AFTER_RECOVERY[point] is not NOT_CLAIMED:
                continue
            if kind == "confirm-send":
                rep = d.confirm(aid)
            else:
                rep = d.submit("sim", kind, json.loads(params[aid]), action_id=aid)
            assert rep.outcome.value == "dispatched", (point, kind)
    time.sleep(0.5 + DISPATCH_LEASE_GRACE)
    passed = reconcile_process(db_path, config, seconds=0.3)
    assert passed.returncode == 0 and "pass complete" in passed.stdout, passed.stderr

    with _registry(config) as registry, Ledger.open(db_path) as ledger:
        settle(ledger, registry)
        check(ledger, server, ids=cases.values(), dedupes=False)
        final = {case: ledger.get(aid).status for case, aid in cases.items()}
        for (point, kind), aid in cases.items():
            if AFTER_RECOVERY[point] is not NOT_CLAIMED:
                kinds = [e.kind for e in ledger.events(aid)]
                assert "lease_expired" in kinds, (point, kind, kinds)
    assert final == {(p, k): AFTER_RECOVERY[p][k] for p, k in cases}
    sent = {case: len(server.requests_for(aid)) for case, aid in cases.items()}
    assert sent == {(p, k): 0 if AFTER_RECOVERY[p] is CLAIMED_UNSENT else 1 for p, k in cases}
    assert _raw_integrity(db_path) == "ok"


def _dispatch_in_process(db: Path, config: Path, server: SimServer,
                         actions: list[tuple[str, str, str]]) -> None:
    with _registry(config) as registry, Ledger.open(db) as ledger:
        d = Dispatcher(ledger, registry, settings=DispatchSettings(lease_grace=DISPATCH_LEASE_GRACE))
        for aid, op, fault in actions:
            server.plan(aid, fault)
            d.submit("sim", op, {"to": aid}, action_id=aid)


@pytest.mark.slow
def test_reconciler_killed_at_every_step(server: SimServer, config: Path, tmp_path: Path) -> None:
    """Each reconciler crash point on its own ledger, the four reconcilers at once.
    Work for every kind of check: an applied send and a bounced one waiting for
    verification, a lost one, a partial delivery for a person, and a dispatcher that
    died after sending (its lease expires)."""
    dbs = {point: tmp_path / f"rec-{point.replace(':', '_')}.db" for point in RECONCILE_POINTS}
    orphans = {}
    for point, db in dbs.items():
        tag = point.replace(":", "_")
        _dispatch_in_process(db, config, server, [
            (f"{tag}-applied", "send", "ok"),
            (f"{tag}-bounced", "send", "bounce"),
            (f"{tag}-lost", "send", "lost_after_accept"),
            (f"{tag}-partial", "deliver", "ok"),
        ])
        orphans[point] = popen_cli("--db", str(db), "dispatch", "sim", "send", "--action-id",
                                   f"{tag}-orphan", "--params", "{}",
                                   env={"SETTLED_FAULTPOINT": "after_reply"})
    for point, (code, _, err) in _communicate_all(orphans).items():
        assert code == -signal.SIGKILL, (point, err)
    time.sleep(0.5 + DISPATCH_LEASE_GRACE)  # the orphans' leases have expired

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killers = {
        point: subprocess.Popen(
            [sys.executable, "-c", RECONCILE_SCRIPT, str(db), str(config), "5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
            env={**env, "SETTLED_FAULTPOINT": point},
        )
        for point, db in dbs.items()
    }
    for point, (code, _, err) in _communicate_all(killers).items():
        assert code == -signal.SIGKILL, (point, code, err)
        assert "Traceback" not in err
        assert _raw_integrity(dbs[point]) == "ok"

    time.sleep(RECONCILE_LEASE)  # the dead reconcilers' row leases expire
    for point, db in dbs.items():
        passed = reconcile_process(db, config, seconds=0.2)
        assert passed.returncode == 0, passed.stderr
        tag = point.replace(":", "_")
        ids = [f"{tag}-{k}" for k in ("applied", "bounced", "lost", "partial", "orphan")]
        with _registry(config) as registry, Ledger.open(db) as ledger:
            settle(ledger, registry)
            # one sim server serves all four ledgers: check only this ledger's actions
            check(ledger, _Only(server, ids), ids=ids, dedupes=False)
            final = {aid[len(tag) + 1:]: ledger.get(aid).status for aid in ids}
        assert final == {"applied": C, "bounced": F, "lost": U, "partial": U, "orphan": C}, point
        assert _raw_integrity(db) == "ok"


class _Only:
    """A view of a SimServer's ground truth restricted to some actions."""

    def __init__(self, server: SimServer, ids: list[str]) -> None:
        self._server, self._ids = server, set(ids)

    def truth(self) -> dict[str, Any]:
        t = self._server.truth()
        return {
            "requests": [r for r in t["requests"] if r["action_id"] in self._ids],
            "effects": {k: v for k, v in t["effects"].items() if k in self._ids},
        }
