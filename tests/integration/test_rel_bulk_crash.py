"""Crash at every point of the bulk path: real ``settled dispatch --from`` processes
SIGKILL themselves at an armed crash point (``python -m settled.testing``), each on its
own ledger. What they leave is at most the claimed groups in hand, ``IN_FLIGHT``;
running the same file again sends only the lines that were never claimed; every
record left ``IN_FLIGHT`` expires by its lease and is reconciled, never re-sent.

Real time, tiny leases: groups of 4, a request budget of 0.3 s and 1.5 s of grace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from invariants import check, settle
from support import popen_cli, run_cli, write_config

from settled import Ledger
from settled.config import load
from settled.model import Status
from settled.providers import Registry
from settled.providers.sim_server import SimServer

pytestmark = pytest.mark.slow(seconds=25)

GROUP = 4
LINES = 10
LEASE_GRACE = 1.5
TIMEOUT = 0.3

# point -> (concurrency, records left IN_FLIGHT, requests that reached the provider).
# In turn (concurrency 1) a group's outcomes are committed before the next is claimed.
CASES: dict[str, tuple[int, int, int]] = {
    "before_claim": (1, 0, 0),  # nothing recorded
    "before_commit:claimed": (1, 0, 0),  # the claim transaction never committed
    "after_group_claim": (1, GROUP, 0),  # claimed, nothing sent
    "before_write": (1, GROUP, 0),  # connected, the first request not written
    "after_send": (1, GROUP, 1),  # one request written, its reply unread
    "between_requests": (1, GROUP, 1),  # one answered, the next not started
    "after_reply": (1, GROUP, 1),
    "before_commit:outcome": (1, GROUP, GROUP),  # every reply in hand, none written
    "after_group_outcome": (1, 0, GROUP),  # the first group settled, the next unclaimed
}
# From a pool, the next group may be claimed while one is in flight: at most
# concurrency + group records are left claimed.
POOLED = {"after_group_claim": 4, "between_requests": 4, "before_commit:outcome": 4}


@pytest.fixture
def server() -> Iterator[SimServer]:
    with SimServer(hang=1.0, honour_keys=False) as s:
        yield s


@pytest.fixture
def config(tmp_path: Path, server: SimServer) -> Path:
    provider = {
        "type": "sim",
        "base_url": server.url,
        "timeout": TIMEOUT,
        "attempts": 1,
        "consistency_window": 0.0,
        "verify_interval": 0.05,
        "verify_deadline": 0.6,
    }
    return write_config(
        tmp_path / "settled.toml",
        {"sim": provider},
        dispatch={"lease_grace": LEASE_GRACE, "group": GROUP},
        reconcile={"lease": 0.3},
    )


def _file(tmp_path: Path, tag: str) -> Path:
    src = tmp_path / f"{tag}.jsonl"
    src.write_text(
        "".join(
            json.dumps({"action_id": f"{tag}-{i}", "params": {"to": f"{tag}-{i}@example.com"}})
            + "\n"
            for i in range(LINES)
        )
    )
    return src


def _sent(server: SimServer, ids: list[str]) -> dict[str, int]:
    return {aid: len(server.requests_for(aid)) for aid in ids}


@pytest.mark.slow
def test_bulk_dispatch_killed_at_every_point(
    server: SimServer, config: Path, tmp_path: Path
) -> None:
    cases = {(point, 1): n for point, n in ((p, 1) for p in CASES)}
    cases.update({(point, conc): conc for point, conc in POOLED.items()})
    runs: dict[tuple[str, int], tuple[str, Path, Path]] = {}
    procs: dict[tuple[str, int], subprocess.Popen[str]] = {}
    for point, conc in cases:
        tag = f"{point.replace(':', '_')}-c{conc}"
        db, src = tmp_path / f"{tag}.db", _file(tmp_path, tag)
        runs[(point, conc)] = (tag, db, src)
        procs[(point, conc)] = popen_cli(
            "--db",
            str(db),
            "dispatch",
            "sim",
            "send",
            "--from",
            str(src),
            "--concurrency",
            str(conc),
            "--json",
            crash_at=point,
        )
    for case, p in procs.items():
        out, err = p.communicate(timeout=90)
        assert p.returncode == -signal.SIGKILL, (case, p.returncode, err)
        assert "Traceback" not in err, (case, err)
        if case[0] != "after_group_outcome":
            assert out == "", case  # nothing is reported before its outcome is durable

    time.sleep(0.5)  # requests written just before a kill reach the server
    claimed: dict[tuple[str, int], set[str]] = {}
    for (point, conc), (tag, db, _src) in runs.items():
        ids = [f"{tag}-{i}" for i in range(LINES)]
        sent = _sent(server, ids)
        with Ledger.open(db) as ledger:
            assert ledger.integrity_check() == "ok"
            recs = {r.action_id: r for r in ledger.query()}
        in_flight = {a for a, r in recs.items() if r.status is Status.IN_FLIGHT}
        claimed[(point, conc)] = set(recs)
        # Nothing was sent for a line that was never recorded.
        assert all(sent[a] == 0 for a in ids if a not in recs), (point, conc)
        assert all(n <= 1 for n in sent.values()), (point, conc, sent)
        if conc == 1:
            _, left, reached = CASES[point]
            assert len(in_flight) == left, (point, sorted(in_flight))
            assert sum(sent.values()) == reached, (point, sent)
        else:
            assert 0 < len(in_flight) <= conc + GROUP, (point, conc, sorted(in_flight))

    # The same file again: claimed lines are reported and not sent; the rest go out.
    for (point, conc), (tag, db, src) in runs.items():
        ids = [f"{tag}-{i}" for i in range(LINES)]
        before = _sent(server, ids)
        again = run_cli("--db", str(db), "dispatch", "sim", "send", "--from", str(src), "--json")
        assert again.returncode in (3, 4), (point, again.returncode, again.stderr)
        after = _sent(server, ids)
        for aid in ids:
            expected = before[aid] if aid in claimed[(point, conc)] else 1
            assert after[aid] == expected, (point, conc, aid, before[aid], after[aid])

    time.sleep(LEASE_GRACE + 3 * TIMEOUT + 0.5)  # every lease taken by the killed runs lapsed
    with Registry(load(str(config)).providers, source=str(config)) as registry:
        for (point, _conc), (tag, db, _src) in runs.items():
            passed = run_cli("--db", str(db), "reconcile", "--due", "--concurrency", "2", "--json")
            assert passed.returncode == 0, passed.stderr
            ids = [f"{tag}-{i}" for i in range(LINES)]
            with Ledger.open(db) as ledger:
                settle(ledger, registry)
                check(ledger, _Only(server, ids), ids=ids, dedupes=False)
                for aid in ids:
                    kinds = [e.kind for e in ledger.events(aid)]
                    rec = ledger.get(aid)
                    if "lease_expired" in kinds:
                        # reconciled, never re-sent: what was sent shows, the rest is unknown
                        want = (
                            Status.CONFIRMED
                            if server.requests_for(aid)
                            else Status.DENIED_UNRESOLVED
                        )
                        assert rec.status is want, (point, aid, rec.status, rec.reason)
                    else:
                        assert rec.status is Status.CONFIRMED, (point, aid, rec.status)
            assert all(n in {0, 1} for n in _sent(server, ids).values())


class _Only:
    """A view of a SimServer's ground truth restricted to some actions."""

    def __init__(self, server: SimServer, ids: list[str]) -> None:
        self._server, self._ids = server, set(ids)

    def truth(self) -> dict[str, object]:
        t = self._server.truth()
        return {
            "requests": [r for r in t["requests"] if r["action_id"] in self._ids],
            "effects": {k: v for k, v in t["effects"].items() if k in self._ids},
        }
