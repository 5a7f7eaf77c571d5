"""Bulk dispatch (``Dispatcher.submit_many``, ``settled dispatch --from``) and concurrent
verification, in process against the real sim provider: what each line becomes, that
claims are durable before requests leave, that results come only after their commit,
and that a provider's limits and Retry-After are honoured."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from invariants import check, settle
from support import run_cli, sim_conf, write_config

from settled import Ledger
from settled.bulk import Line, read_lines, summary
from settled.clock import Clock, to_text
from settled.dispatch import Dispatcher, DispatchSettings
from settled.model import Status
from settled.providers import Registry
from settled.providers.base import Observation, QueryTarget, Request, Seen, Wire, WireResult
from settled.providers.sim_server import SimServer
from settled.reconcile import Reconciler
from settled.storage import Selection
from settled.throttle import Gate


def jsonl(*rows: Any) -> io.BytesIO:
    return io.BytesIO(
        b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)
    )


def lines(n: int, prefix: str = "a") -> list[dict[str, Any]]:
    return [
        {"action_id": f"{prefix}{i}", "params": {"to": f"{prefix}{i}@example.com"}}
        for i in range(n)
    ]


# ------------------------------------------------------------------ reading lines


def test_read_lines_reports_every_bad_line_with_its_number() -> None:
    got = list(
        read_lines(
            jsonl(
                {"action_id": "ok", "params": {"a": 1}},
                b"not json",
                b"",
                [1, 2],
                {"params": {}},
                {"action_id": " padded", "params": {}},
                {"action_id": "p", "params": [1]},
                {"action_id": "x", "params": {}, "extra": 1},
                b'{"action_id": "nan", "params": {"v": NaN}}',
                b"\xff\xfe",
            )
        )
    )
    assert got[0] == Line(1, "ok", {"a": 1})
    bad = {line.number: line.problem for line in got[1:]}
    assert set(bad) == {2, 4, 5, 6, 7, 8, 9, 10}  # line 3 is blank: skipped
    assert all(bad.values())
    assert "action_id is required" in bad[5]


def test_a_line_too_long_is_bad_and_never_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import settled.bulk

    monkeypatch.setattr(settled.bulk, "MAX_LINE", 64)
    got = list(
        read_lines(
            jsonl(
                {"action_id": "big", "params": {"p": "x" * 500}},
                {"action_id": "next", "params": {}},
            )
        )
    )
    assert got[0].number == 1 and "longer than" in got[0].problem
    assert got[1] == Line(2, "next", {})


def test_lines_are_read_as_the_work_goes(registry: Registry, ledger: Ledger) -> None:
    """Nothing reads ahead of the group in hand (100k lines never sit in memory)."""
    taken = 0

    def source() -> Iterator[Line]:
        nonlocal taken
        for i in range(50):
            taken += 1
            yield Line(i + 1, f"s{i}", {})

    d = Dispatcher(ledger, registry, settings=DispatchSettings(group=10))
    results = d.submit_many("sim", "book", source())
    first = next(results)
    assert first.report is not None and taken <= 20
    assert len(list(results)) == 49


# ------------------------------------------------------------------ what each line becomes


@pytest.mark.parametrize("concurrency", [1, 4])
def test_every_line_settles_once_and_keeps_every_invariant(
    sim: SimServer, registry: Registry, ledger: Ledger, concurrency: int
) -> None:
    rows = lines(40)
    d = Dispatcher(ledger, registry, settings=DispatchSettings(group=8))
    results = list(d.submit_many("sim", "book", read_lines(jsonl(*rows)), concurrency=concurrency))
    assert sorted(r.line for r in results) == list(range(1, 41))
    assert summary(results) == {"CONFIRMED": 40}
    assert all(r.report and r.report.record == ledger.get(r.action_id or "") for r in results)
    check(ledger, sim, ids=[r["action_id"] for r in rows])
    assert all(len(sim.requests_for(r["action_id"])) == 1 for r in rows)


def test_repeats_conflicts_and_bad_lines_go_their_own_way(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    d = Dispatcher(ledger, registry)
    d.submit("sim", "book", {"to": "a0@example.com"}, action_id="a0")
    src = jsonl(
        {"action_id": "a0", "params": {"to": "a0@example.com"}},  # exists, same: not sent
        {"action_id": "a1", "params": {"to": "a1@example.com"}},
        {"action_id": "a1", "params": {"to": "other"}},  # the line above holds a1: conflict
        b"{broken",
        {"action_id": "a2", "params": {"to": "a2@example.com"}},
    )
    results = {r.line: r for r in d.submit_many("sim", "book", read_lines(src))}
    assert results[1].report is not None and str(results[1].report.outcome) == "already_completed"
    assert results[3].conflict and results[3].report is None
    assert results[4].problem and results[4].report is None
    assert {results[n].report.record.status for n in (2, 5)} == {Status.CONFIRMED}  # type: ignore[union-attr]
    assert len(sim.requests_for("a0")) == 1 and len(sim.requests_for("a1")) == 1
    check(ledger, sim, ids=["a0", "a1", "a2"])
    assert ledger.get("a1").params == {"to": "a1@example.com"}


def test_a_group_is_claimed_durably_before_any_of_its_requests_leaves(
    sim: SimServer, registry: Registry, db_path: Path
) -> None:
    """At the moment each request reaches the provider, its whole group is already
    IN_FLIGHT in the file, as another connection sees it."""
    seen: list[list[str]] = []

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner, self.name = inner, inner.name

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def execute(self, request: Request) -> WireResult:
            with Ledger.open(db_path) as other:
                seen.append(
                    sorted(
                        str(r.status)
                        for r in other.records(Selection(ids=[f"g{i}" for i in range(6)]))
                    )
                )
            return self.inner.execute(request)  # type: ignore[no-any-return]

    reg = Registry({}, source="test")
    reg.add(Spy(registry.provider("sim")))
    with Ledger.open(db_path) as ledger:
        d = Dispatcher(ledger, reg, settings=DispatchSettings(group=3))
        list(d.submit_many("sim", "book", read_lines(jsonl(*lines(6, "g")))))
    # group 1 = g0..g2, group 2 = g3..g5: the first request of each sees its group claimed
    assert seen[0] == ["IN_FLIGHT"] * 3
    assert seen[3].count("IN_FLIGHT") == 3 and seen[3].count("CONFIRMED") == 3


def test_results_are_reported_only_after_their_commit(registry: Registry, db_path: Path) -> None:
    with Ledger.open(db_path) as ledger:
        d = Dispatcher(ledger, registry, settings=DispatchSettings(group=4))
        for r in d.submit_many("sim", "send", read_lines(jsonl(*lines(12))), concurrency=3):
            with Ledger.open(db_path) as other:
                stored = other.get(r.action_id or "")
            assert r.report is not None and r.report.record is not None
            assert stored.status is r.report.record.status is Status.AWAITING_VERIFICATION
            assert r.report.record == stored  # what is reported is what the ledger holds


# ------------------------------------------------------------------ provider limits


class Counting:
    """A provider wrapper that counts how many calls are inside it at once. With
    ``overlap`` (for a test that asserts two calls overlapped), until two have, each call
    waits (bounded) for a second one, so that overlap happens whenever the pool allows
    it, however slowly the machine starts threads. Without it nothing waits: a test
    whose pool stops, or sends one at a time, would otherwise wait out the bound."""

    def __init__(self, inner: Any, respond: Any = None, *, overlap: bool = False) -> None:
        self.inner, self.name = inner, inner.name
        self.respond, self.overlap = respond, overlap
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.calls = 0
        self.arrived = threading.Condition(self.lock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _enter(self) -> int:
        with self.lock:
            self.inside += 1
            self.calls += 1
            n = self.calls
            self.most = max(self.most, self.inside)
            self.arrived.notify_all()
            if self.overlap and self.most < 2:  # the event, not a guess at its time
                self.arrived.wait_for(lambda: self.inside >= 2, timeout=30)
            return n

    def _leave(self) -> None:
        with self.lock:
            self.inside -= 1

    def _through(self, arg: Any, inner: Any) -> Any:
        """One counted call: ``respond``'s answer when it gives one, else the inner one."""
        n = self._enter()
        try:
            got = self.respond(n, arg) if self.respond is not None else None
            return got if got is not None else inner(arg)
        finally:
            self._leave()

    def execute(self, request: Request) -> WireResult:
        return self._through(request, self.inner.execute)  # type: ignore[no-any-return]

    def query(self, target: QueryTarget) -> Observation:
        return self._through(target, self.inner.query)  # type: ignore[no-any-return]


def test_bulk_sends_overlap_but_never_beyond_the_providers_limit(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    spy = Counting(registry.provider("sim"), overlap=True)
    reg = Registry({}, source="test")
    reg.add(spy)
    d = Dispatcher(ledger, reg, settings=DispatchSettings(group=8))
    results = list(
        d.submit_many("sim", "book", read_lines(jsonl(*lines(24))), concurrency=8, gate=Gate(3))
    )
    assert summary(results) == {"CONFIRMED": 24}
    assert 2 <= spy.most <= 3
    check(ledger, sim)


def test_a_retry_after_longer_than_the_lease_sends_nothing_more(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    """The provider answers the first request 429 with Retry-After 300: that action is
    ambiguous (it may have applied); the others of its group never start (FAILED,
    provably not sent), and no new group is claimed."""

    def throttle(n: int, request: Request) -> WireResult | None:
        if n == 1:
            return WireResult(
                Wire.ANSWERED, 429, detail="HTTP 429", retry_after=300.0, written_at=0.0
            )
        return None

    spy = Counting(registry.provider("sim"), throttle)
    reg = Registry({}, source="test")
    reg.add(spy)
    d = Dispatcher(ledger, reg, settings=DispatchSettings(group=5, lease_grace=0.5))
    results = list(d.submit_many("sim", "book", read_lines(jsonl(*lines(5)))))
    assert spy.calls == 1
    assert summary(results) == {"DENIED_UNRESOLVED": 1, "FAILED": 4}
    for i in range(1, 5):
        rec = ledger.get(f"a{i}")
        assert rec.status is Status.FAILED and "Retry-After" in (rec.reason or "")
    check(ledger, sim, final=False)


def test_a_short_retry_after_holds_the_others_then_they_go(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    def throttle(n: int, request: Request) -> WireResult | None:
        if n == 1:
            return WireResult(Wire.ANSWERED, 503, detail="HTTP 503", retry_after=0.05)
        return None

    spy = Counting(registry.provider("sim"), throttle)
    reg = Registry({}, source="test")
    reg.add(spy)
    d = Dispatcher(ledger, reg, settings=DispatchSettings(group=4))
    results = list(d.submit_many("sim", "book", read_lines(jsonl(*lines(8))), concurrency=2))
    counts = summary(results)
    assert counts["CONFIRMED"] >= 6 and sum(counts.values()) == 8
    check(ledger, sim, final=False)


# ------------------------------------------------------------------ concurrent verification


def _awaiting(ledger: Ledger, registry: Registry, n: int) -> list[str]:
    d = Dispatcher(ledger, registry)
    results = list(d.submit_many("sim", "send", read_lines(jsonl(*lines(n, "v")))))
    assert summary(results) == {"AWAITING_VERIFICATION": n}
    return [f"v{i}" for i in range(n)]


@pytest.mark.parametrize(("concurrency", "limit"), [(4, None), (8, 2)])
def test_concurrent_checks_settle_like_checks_in_turn(
    sim: SimServer, patient: Registry, ledger: Ledger, concurrency: int, limit: int | None
) -> None:
    ids = _awaiting(ledger, patient, 30)
    spy = Counting(patient.provider("sim"), overlap=True)
    reg = Registry({}, source="test")
    reg.add(spy)
    seen: list[str] = []
    r = Reconciler(
        ledger,
        reg,
        clock=Clock(),
        batch=7,
        concurrency=concurrency,
        limits={"sim": limit} if limit else None,
        on_change=lambda ch: seen.append(ch.action_id),
    )
    report = r.run_due()
    assert report.counts() == {"CONFIRMED": 30} and sorted(seen) == sorted(ids)
    assert 2 <= spy.most <= (limit or concurrency)
    assert all(sim.queries_for(ledger.get(a).reconciliation_key or "") == 1 for a in ids)
    check(ledger, sim, ids=ids)


def test_changes_are_reported_only_after_their_commit(patient: Registry, db_path: Path) -> None:
    with Ledger.open(db_path) as ledger:
        _awaiting(ledger, patient, 12)
        durable: list[bool] = []

        def on_change(ch: Any) -> None:
            with Ledger.open(db_path) as other:
                durable.append(str(other.get(ch.action_id).status) == ch.to_status)

        Reconciler(
            ledger, patient, clock=Clock(), batch=5, concurrency=4, on_change=on_change
        ).run_due()
    assert durable == [True] * 12


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_throttled_provider_is_left_alone_and_no_budget_is_spent(
    sim: SimServer, patient: Registry, ledger: Ledger, concurrency: int
) -> None:
    """The first query is answered 429: the rows of the batch still waiting are put
    back to after the pause, unchecked, their budget unspent. Queries already in flight
    when the 429 came back finish (here they are held until the pause is taken, so that
    none can finish first and start another on a loaded machine); none starts after."""
    ids = _awaiting(ledger, patient, 10)
    held: list[Any] = []

    def throttle(n: int, target: Any) -> Observation | None:
        if n == 1:
            return Observation(
                Seen.UNKNOWN, detail="unexpected reply HTTP 429", evidence={"status_code": 429}
            )
        deadline = time.monotonic() + 5
        while held[0].closed_for() <= 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        return None

    spy = Counting(patient.provider("sim"), throttle)
    reg = Registry({}, source="test")
    reg.add(spy)
    start = to_text(Clock().now())
    reconciler = Reconciler(ledger, reg, clock=Clock(), concurrency=concurrency)
    held.append(reconciler.gates["sim"])
    report = reconciler.run_due()
    assert spy.calls <= concurrency
    assert report.counts().get("CONFIRMED", 0) <= concurrency - 1
    put_back = [ledger.get(a) for a in ids if ledger.get(a).status is Status.AWAITING_VERIFICATION]
    assert len(put_back) >= 10 - concurrency
    unchecked = [r for r in put_back if r.checks == 0]
    assert len(unchecked) >= 10 - concurrency
    assert all((r.next_check_at or "") > start and "pause" in (r.reason or "") for r in unchecked)
    settle(ledger, patient)
    check(ledger, sim, ids=ids)


# ------------------------------------------------------------------ config and the command


def test_max_in_flight_is_settleds_key_and_defaults_follow_the_provider_type(
    tmp_path: Path, sim: SimServer
) -> None:
    from settled.config import load
    from settled.errors import ConfigError

    path = write_config(
        tmp_path / "c.toml",
        {
            "sim": sim_conf(sim, max_in_flight=3),
            "api": {"type": "http", "base_url": "http://127.0.0.1:9"},
        },
        reconcile={"concurrency": 6},
    )
    cfg = load(str(path))
    assert "max_in_flight" not in cfg.providers["sim"]
    assert cfg.in_flight("sim") == 3 and cfg.in_flight("api") == 16
    assert cfg.concurrency(None, ["sim", "api"]) == (16, {"sim": 3, "api": 16})
    assert cfg.concurrency(6, ["sim", "api"]) == (6, {"sim": 3, "api": 6})
    assert cfg.reconcile_concurrency == 6
    Registry(cfg.providers, source=str(path)).provider("sim")  # the sim never sees the key
    bad = write_config(tmp_path / "b.toml", {"sim": sim_conf(sim, max_in_flight=0)})
    with pytest.raises(ConfigError, match="max_in_flight"):
        load(str(bad))


def test_dispatch_from_prints_a_line_per_action_then_a_summary(
    sim: SimServer, sim_config: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(*lines(5), b"oops", {"action_id": "a1", "params": {"x": 1}}).read())
    done = run_cli("dispatch", "sim", "book", "--from", str(src), "--concurrency", "2", "--json")
    assert done.returncode == 7, done.stderr  # the highest code among the lines: a conflict
    out = [json.loads(x) for x in done.stdout.splitlines()]
    assert out[-1] == {
        "summary": {"CONFIRMED": 5, "conflict": 1, "invalid": 1},
        "lines": 7,
        "exit_code": 7,
    }
    by_line = {o["line"]: o for o in out[:-1]}
    assert by_line[6]["outcome"] == "invalid" and by_line[7]["outcome"] == "conflict"
    assert all(by_line[n]["status"] == "CONFIRMED" for n in range(1, 6))
    again = run_cli("dispatch", "sim", "book", "--from", "-", input=json.dumps(lines(5)[0]) + "\n")
    assert again.returncode == 0 and again.stdout.startswith("1 line(s): 1 CONFIRMED")
    assert len(sim.requests_for("a0")) == 1
    bad = run_cli("dispatch", "sim", "book", "--from", str(src), "--action-id", "x")
    assert bad.returncode == 2 and "--action-id" in bad.stderr
    missing = run_cli("dispatch", "sim", "book", "--from", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_reconcile_due_with_concurrency(sim: SimServer, sim_config: Path) -> None:
    src = "".join(json.dumps(x) + "\n" for x in lines(6))
    assert run_cli("dispatch", "sim", "send", "--from", "-", input=src).returncode == 3
    done = run_cli("reconcile", "--due", "--concurrency", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"] == {"CONFIRMED": 6}
    # Named ids take --concurrency too (their checks run as a pass's do): a0 is CONFIRMED.
    assert run_cli("reconcile", "a0", "--concurrency", "2").returncode == 0


def test_daemon_once_with_concurrency_settles_what_is_due(sim: SimServer, sim_config: Path) -> None:
    src = "".join(json.dumps(x) + "\n" for x in lines(5))
    assert run_cli("dispatch", "sim", "send", "--from", "-", input=src).returncode == 3
    done = run_cli("daemon", "--once", "--concurrency", "3")
    assert done.returncode == 0, done.stderr
    shown = [json.loads(run_cli("show", f"a{i}", "--json").stdout)["status"] for i in range(5)]
    assert shown == ["CONFIRMED"] * 5


def test_bad_concurrency_and_group_settings_are_config_errors(tmp_path: Path) -> None:
    from settled.config import load
    from settled.errors import ConfigError

    for section in ({"reconcile": {"concurrency": 0}}, {"dispatch": {"group": 0}}):
        path = write_config(tmp_path / "c.toml", {}, **section)
        with pytest.raises(ConfigError, match="whole number"):
            load(str(path))


class Interrupted(BaseException):
    """Ctrl-C, or anything else that stops a run (not an Exception: nothing may catch it)."""


def test_a_stopped_run_sends_nothing_more_and_says_so(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    """The second send is interrupted: the first action settles, the interrupted one
    stays IN_FLIGHT for reconciliation (its request may have left), the rest of its
    group is FAILED as never sent, and no further group is claimed."""

    def stop(n: int, request: Request) -> WireResult | None:
        if n == 2:
            raise Interrupted
        return None

    spy = Counting(registry.provider("sim"), stop)
    reg = Registry({}, source="test")
    reg.add(spy)
    d = Dispatcher(ledger, reg, settings=DispatchSettings(group=5))
    with pytest.raises(Interrupted):
        list(d.submit_many("sim", "book", read_lines(jsonl(*lines(10)))))
    status = {r.action_id: r.status for r in ledger.query()}
    assert status == {
        "a0": Status.CONFIRMED,
        "a1": Status.IN_FLIGHT,
        "a2": Status.FAILED,
        "a3": Status.FAILED,
        "a4": Status.FAILED,
    }
    assert spy.calls == 2 and sim.requests_for("a2") == []
    assert "bulk run stopped" in (ledger.get("a3").reason or "")
    check(ledger, sim, final=False)


def test_a_stopped_pool_starts_nothing_that_waited_in_its_queue(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    def stop(n: int, request: Request) -> WireResult | None:
        if n == 2:
            raise Interrupted
        return None

    spy = Counting(registry.provider("sim"), stop)
    reg = Registry({}, source="test")
    reg.add(spy)
    d = Dispatcher(ledger, reg, settings=DispatchSettings(group=6))
    with pytest.raises(Interrupted):
        list(d.submit_many("sim", "book", read_lines(jsonl(*lines(12))), concurrency=3))
    recs = ledger.query()
    assert [r.status for r in recs].count(Status.IN_FLIGHT) == 1  # the interrupted send
    for r in recs:
        sent = len(sim.requests_for(r.action_id))
        if r.status is Status.FAILED:
            assert sent == 0 and "bulk run stopped" in (r.reason or "")
        elif r.status is Status.CONFIRMED:
            assert sent == 1
    check(ledger, sim, final=False)


def test_an_operation_that_needs_confirmation_is_recorded_never_sent(
    sim: SimServer, registry: Registry, ledger: Ledger
) -> None:
    from dataclasses import replace

    inner = registry.provider("sim")

    class Confirming(Counting):
        def operations(self) -> Any:
            return {k: replace(v, needs_confirmation=True) for k, v in inner.operations().items()}

    reg = Registry({}, source="test")
    reg.add(Confirming(inner))
    d = Dispatcher(ledger, reg)
    results = list(d.submit_many("sim", "book", read_lines(jsonl(*lines(3))), concurrency=4))
    assert [str(r.report.outcome) for r in results if r.report] == ["recorded"] * 3
    assert summary(results) == {"PENDING": 3}
    assert sim.truth()["requests"] == []
