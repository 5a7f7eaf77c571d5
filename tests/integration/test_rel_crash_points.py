"""Crash at every step: real ``settled`` processes SIGKILL themselves at an armed fault
point (``settled.faults``), then a restart and a reconciliation pass (also a real
process) must leave the invariants intact and the ledger passing
``PRAGMA integrity_check``. Real time, tiny leases: ``[dispatch] lease_grace`` and
``[reconcile] lease`` in the config.

The reconciler is ``settled reconcile --due`` (one pass per process, as cron runs it)
and ``settled daemon``, each killed at the reconciler's own crash points.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import rawdb
from invariants import check, settle
from support import popen_cli, run_cli, write_config

from settled import Ledger
from settled.clock import Clock
from settled.config import load
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=25)

C, F, U, A = (
    Status.CONFIRMED,
    Status.FAILED,
    Status.DENIED_UNRESOLVED,
    Status.AWAITING_VERIFICATION,
)

DISPATCH_LEASE_GRACE = 1.5  # with timeout 0.3 × 1 attempt: an IN_FLIGHT lease of 1.8 s, room
# for 24 processes starting at once on 2 cores (a lapsed lease sends nothing)
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


def reconcile_process(db: Path, point: str | None = None) -> subprocess.CompletedProcess[str]:
    """One pass of ``settled reconcile --due`` (cron's way), as a real process."""
    return run_cli("--db", str(db), "reconcile", "--due", "--json", crash_at=point)


def reconcile_until_killed(db: Path, point: str, passes: int = 20) -> list[str]:
    """``settled reconcile --due`` passes armed at ``point`` until one reaches it and
    SIGKILLs itself (each pass is real; a pass that finds nothing there exits 0).
    Returns the stderr of the killed one and the passes before it."""
    seen = []
    for _ in range(passes):
        done = reconcile_process(db, point)
        seen.append(done.stderr)
        if done.returncode == -signal.SIGKILL:
            assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
            return seen
        assert done.returncode == 0, (point, done.returncode, done.stderr)
        time.sleep(0.05)
    raise AssertionError(f"no pass reached {point} in {passes} passes: {seen[-1]}")


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
    return rawdb.integrity(db)


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
        for (_point, kind), aid in cases.items():
            if kind == "confirm-send":
                d.submit(
                    "sim", "send", json.loads(params[aid]), action_id=aid, needs_confirmation=True
                )
    procs = {}
    for (point, kind), aid in cases.items():
        if kind == "confirm-send":
            procs[(point, kind)] = popen_cli("confirm", aid, "--json", crash_at=point)
        else:
            procs[(point, kind)] = popen_cli(
                "dispatch",
                "sim",
                kind,
                "--action-id",
                aid,
                "--params",
                params[aid],
                "--json",
                crash_at=point,
            )
    for case, (code, out, err) in _communicate_all(procs).items():
        assert code == -signal.SIGKILL, f"{case}: exit {code}: {err}"
        assert out == "" and "Traceback" not in err, case
    sent_points = ("after_send", "after_reply", "before_commit:outcome")
    _wait_for(
        lambda: all(
            server.requests_for(aid) for (point, _), aid in cases.items() if point in sent_points
        )
    )

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
        point: popen_cli(
            "dispatch",
            "sim",
            "send",
            "--action-id",
            cases[(point, kind)],
            "--params",
            params[cases[(point, kind)]],
        )
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
    passed = reconcile_process(db_path)
    assert passed.returncode == 0, passed.stderr
    moved = {c["action_id"]: c["kind"] for c in json.loads(passed.stdout)["changes"]}
    assert {
        aid for case, aid in cases.items() if AFTER_RECOVERY[case[0]] is not NOT_CLAIMED
    } <= set(moved)

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


def _dispatch_in_process(
    db: Path, config: Path, server: SimServer, actions: list[tuple[str, str, str]]
) -> None:
    with _registry(config) as registry, Ledger.open(db) as ledger:
        d = Dispatcher(
            ledger, registry, settings=DispatchSettings(lease_grace=DISPATCH_LEASE_GRACE)
        )
        for aid, op, fault in actions:
            server.plan(aid, fault)
            d.submit("sim", op, {"to": aid}, action_id=aid)


def _ledgers_with_every_kind_of_check(
    fresh_location: Callable[[str], Any],
    config: Path,
    server: SimServer,
    file_prefix: str,
    tag_prefix: str,
) -> dict[str, Any]:
    """One new ledger per reconciler crash point, each holding work for every kind of
    check: an applied send and a bounced one waiting for verification, a lost one, a
    partial delivery for a person, and a dispatcher killed after sending whose lease
    has expired by the time this returns."""
    dbs = {
        point: fresh_location(f"{file_prefix}{point.replace(':', '_')}.db")
        for point in RECONCILE_POINTS
    }
    orphans = {}
    for point, db in dbs.items():
        tag = tag_prefix + point.replace(":", "_")
        _dispatch_in_process(
            db,
            config,
            server,
            [
                (f"{tag}-applied", "send", "ok"),
                (f"{tag}-bounced", "send", "bounce"),
                (f"{tag}-lost", "send", "lost_after_accept"),
                (f"{tag}-partial", "deliver", "ok"),
            ],
        )
        orphans[point] = popen_cli(
            "--db",
            str(db),
            "dispatch",
            "sim",
            "send",
            "--action-id",
            f"{tag}-orphan",
            "--params",
            "{}",
            crash_at="after_reply",
        )
    for point, (code, _, err) in _communicate_all(orphans).items():
        assert code == -signal.SIGKILL, (point, err)
    time.sleep(0.5 + DISPATCH_LEASE_GRACE)  # the orphans' dispatch leases have expired
    return dbs


@pytest.mark.slow
def test_reconciler_killed_at_every_step(
    server: SimServer, config: Path, fresh_location: Callable[[str], Any]
) -> None:
    """Each reconciler crash point on its own ledger, the four reconcilers at once.
    Work for every kind of check: an applied send and a bounced one waiting for
    verification, a lost one, a partial delivery for a person, and a dispatcher that
    died after sending (its lease expires)."""
    dbs = _ledgers_with_every_kind_of_check(fresh_location, config, server, "rec-", "")

    # Each reconciler (`settled reconcile --due`) kills itself at its point; the four
    # ledgers at once, one thread each.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(dbs)) as pool:
        list(pool.map(lambda item: reconcile_until_killed(item[1], item[0]), dbs.items()))
    for db in dbs.values():
        assert _raw_integrity(db) == "ok"

    time.sleep(RECONCILE_LEASE)  # the dead reconcilers' row leases expire
    for point, db in dbs.items():
        passed = reconcile_process(db)
        assert passed.returncode == 0, passed.stderr
        tag = point.replace(":", "_")
        ids = [f"{tag}-{k}" for k in ("applied", "bounced", "lost", "partial", "orphan")]
        with _registry(config) as registry, Ledger.open(db) as ledger:
            settle(ledger, registry)
            # one sim server serves all four ledgers: check only this ledger's actions
            check(ledger, _Only(server, ids), ids=ids, dedupes=False)
            final = {aid[len(tag) + 1 :]: ledger.get(aid).status for aid in ids}
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


DAEMON_LEASE = 30.0  # s: long enough that nothing here outlives it by accident


@pytest.mark.slow
def test_daemon_killed_mid_pass_loses_observations_never_statuses(
    server: SimServer, config: Path, tmp_path: Path, fresh_location: Callable[[str], Any]
) -> None:
    """A ``settled daemon`` SIGKILLed at each reconciler crash point, mid-pass. The
    reconciler commits a batch's results together: a kill before that commit loses the
    batch's observations (nothing was written), never a status (every status in the
    ledger is one its log replays to), and the rows it leased stay leased until the
    reconciler lease ends: a pass before then leaves them alone, a pass after checks
    them again and settles them exactly as if nothing had happened."""
    daemon_config = write_config(
        tmp_path / "daemon.toml",
        {
            "sim": {
                "type": "sim",
                "base_url": server.url,
                "timeout": 0.3,
                "attempts": 1,
                "consistency_window": 0.0,
                "verify_interval": 0.05,
                "verify_deadline": 0.6,
            }
        },
        dispatch={"lease_grace": DISPATCH_LEASE_GRACE},
        reconcile={"lease": DAEMON_LEASE},
    )
    kinds = ("applied", "bounced", "lost", "partial", "orphan")
    dbs = _ledgers_with_every_kind_of_check(fresh_location, config, server, "daemon-", "d")

    def snapshot(db: Path) -> dict[str, tuple[str, int, str | None]]:
        with Ledger.open(db) as ledger:
            return {
                r.action_id: (str(r.status), len(ledger.events(r.action_id)), r.lease_owner)
                for r in ledger.query()
            }

    before = {point: snapshot(db) for point, db in dbs.items()}
    daemons = {
        point: popen_cli(
            "--db",
            str(db),
            "--config",
            str(daemon_config),
            "daemon",
            "--interval",
            "0.1",
            crash_at=point,
        )
        for point, db in dbs.items()
    }
    for point, (code, _out, err) in _communicate_all(daemons).items():
        assert code == -signal.SIGKILL, (point, code, err)
        assert "Traceback" not in err, err
        assert _raw_integrity(dbs[point]) == "ok"

    for point, db in dbs.items():
        tag = "d" + point.replace(":", "_")
        ids = [f"{tag}-{k}" for k in kinds]
        after = snapshot(db)
        with Ledger.open(db) as ledger:
            moved_by_daemon = {
                aid: [e.kind for e in ledger.events(aid)[before[point][aid][1] :]] for aid in ids
            }
            leased = {aid for aid in ids if after[aid][2] is not None}
            for aid in leased:  # held by the dead daemon until its lease ends
                rec = ledger.get(aid)
                assert rec.next_check_at is not None, aid
                assert after[aid][0] == before[point][aid][0], (point, aid, "status moved")
        if point == "before_commit:lease_expired":
            # killed inside the first write: nothing of this pass was committed
            assert after == before[point], point
            continue
        # The lease expiry was committed with the claim; what the checks observed was
        # not (the kill came before the batch's commit): those rows are still leased.
        assert moved_by_daemon[f"{tag}-orphan"] == ["lease_expired"], (point, moved_by_daemon)
        assert leased, f"{point}: the daemon leased nothing before its kill"
        lost_observations = {aid for aid in leased if not moved_by_daemon[aid]}
        assert lost_observations, (point, moved_by_daemon)

        # Before the reconciler lease ends, another pass leaves those rows alone …
        early = reconcile_process(db)
        assert early.returncode == 0, early.stderr
        touched = {c["action_id"] for c in json.loads(early.stdout)["changes"]}
        touched |= {c["action_id"] for c in json.loads(early.stdout)["skipped"]}
        assert not touched & lost_observations, (point, touched)
        with Ledger.open(db) as ledger:
            for aid in lost_observations:
                assert str(ledger.get(aid).status) == after[aid][0]

        # … and once it has ended they are checked again and settle exactly.
        with _registry(config) as registry, Ledger.open(db) as ledger:
            later = FakeClockAt(DAEMON_LEASE + 1)
            settle(ledger, registry, clock=later)
            check(ledger, _Only(server, ids), ids=ids, dedupes=False)
            final = {aid[len(tag) + 1 :]: ledger.get(aid).status for aid in ids}
            for aid in lost_observations:
                actors = {e.actor for e in ledger.events(aid)[before[point][aid][1] :]}
                assert "reconciler" in actors, (aid, actors)
        assert final == {"applied": C, "bounced": F, "lost": U, "partial": U, "orphan": C}, point


class FakeClockAt(Clock):
    """Real time, shifted ``seconds`` ahead: past every lease the dead daemon took."""

    def __init__(self, seconds: float) -> None:
        self.shift = timedelta(seconds=seconds)

    def now(self) -> datetime:
        return super().now() + self.shift
