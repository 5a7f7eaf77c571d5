"""Bulk dispatch: many actions of one operation, from JSON lines, in groups.

Each group's records and claims are committed in ONE durable transaction before any
request of the group leaves (``Ledger.record_and_claim_many``); the requests then go
out from a pool of threads, each action within its own lease and the operation's one
retry budget (``Dispatcher.send_claimed``, the same tries as a single dispatch); their
outcomes are committed in groups too, and each action is reported only after the
commit that made its outcome durable. All writes happen on the thread that iterates
``run``; the pool threads only talk to the provider.

What a crash leaves: at most the claimed, unsettled actions of the groups in hand,
``IN_FLIGHT`` with their leases. Each lapses and is reconciled like any lost
dispatcher's, never re-sent; running the same file again reports them and sends
only the lines that were never claimed.

A claimed action may wait in the pool's queue before its first try, so its lease
also covers that wait (one request budget per round of the pool ahead of it): the
request still never starts after the lease, and the lease's end is still the last
moment it can land.

Lines are independent: a bad line is reported with its number and nothing is
recorded for it; an id that already holds the same action is reported and not sent;
an id that holds another action is a conflict for that line; the others go on.

This module and ``settled.dispatch`` are one component: a bulk run sends through the
dispatcher's public seam (``Sender``, which ``Dispatcher`` provides) and shares its words
(``settled.sending``); it never imports ``settled.dispatch``, which reaches it only
through ``Dispatcher.submit_many`` and ``retry_many``.
"""

from __future__ import annotations

import json
import queue
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, islice
from typing import IO, TYPE_CHECKING, Any, Protocol

from . import policy
from .clock import freeze_start_up, from_text, nap
from .errors import Conflict, InvalidInput, LedgerError
from .model import ActionRecord, Declared, Move, action_id_problem
from .sending import (
    EXISTS,
    Attempt,
    DispatchSettings,
    Outcome,
    Report,
    as_found,
    check_params_json,
    retry_problem,
    with_reason,
)
from .storage.columns import after_move
from .storage.ledger import same_action
from .throttle import Gate

if TYPE_CHECKING:
    from .clock import Clock
    from .crashpoints import Probe
    from .errors import OutcomeNotRecorded
    from .providers.base import Provider, Providers
    from .storage import Ledger

DEFAULT_GROUP = 64  # actions per claim transaction (see docs/performance.md)
DEFAULT_FLUSH_AFTER = 0.2  # s an outcome may wait for its group's commit
POLL = 0.1  # s the writing thread waits for an outcome before it looks for a stop again
MAX_LINE = 1024 * 1024  # bytes in one input line; a longer one is a bad line, never read whole


class Sender(Protocol):
    """What a bulk run needs of its dispatcher (``settled.dispatch.Dispatcher``): its
    ledger, providers, clock, settings, actor and crash probe, and the steps of a
    single send that the bulk path reuses rather than copies."""

    ledger: Ledger
    registry: Providers
    clock: Clock
    settings: DispatchSettings
    actor: str
    probe: Probe

    def submit(  # the record-only path of an operation that needs confirmation
        self,
        provider: str,
        operation: str,
        params: Any,
        *,
        action_id: str | None = None,
        needs_confirmation: bool = False,
    ) -> Report: ...

    def declared_for(self, record: ActionRecord) -> Declared:
        """The declarations that govern ``record`` (rule 11)."""
        ...

    def send_claimed(
        self,
        claimed: ActionRecord,
        declared: Declared,
        provider: Provider,
        taken: policy.Claim,
        gate: Gate | None = None,
    ) -> Attempt:
        """One claimed attempt's tries, within its retry budget and lease; no writes."""
        ...

    def outcome_move(self, sent: Attempt) -> Move:
        """Where the attempt's tries put the record, not written."""
        ...

    def finish(self, sent: Attempt, move: Move, written: ActionRecord | None) -> Report:
        """The report once ``move`` was written (``written``) or its guard failed (None)."""
        ...

    def not_recorded(self, sent: Attempt, move: Move, exc: LedgerError) -> OutcomeNotRecorded:
        """What a ledger failure after the claim means for the attempt."""
        ...


@dataclass(frozen=True)
class Line:
    """One input line: an action, or (``problem``) why it is not one."""

    number: int
    action_id: str | None = None
    params: Any = None
    problem: str = ""


@dataclass
class Settled:
    """What became of one line. ``report`` is None when nothing was sent for it: a
    bad line (``problem``), a conflict (``conflict``), a retry refused (``refused``:
    not FAILED, or the check made first refused it, rule 14; ``record`` is the record
    as it then stands) or an id the ledger does not hold (``missing``)."""

    line: int
    action_id: str | None
    report: Report | None = None
    problem: str = ""
    conflict: bool = False
    refused: bool = False
    missing: bool = False
    record: ActionRecord | None = None

    @property
    def outcome(self) -> str:
        if self.report is not None:
            return str(self.report.outcome)
        if self.missing:
            return "not_found"
        if self.refused:
            return "refused"
        return "conflict" if self.conflict else "invalid"

    def to_json(self) -> dict[str, Any]:
        if self.report is not None:
            data = self.report.to_json()
        else:
            data = (
                self.record.to_json() if self.record is not None else {"action_id": self.action_id}
            )
            data.update(outcome=self.outcome, result=None, message=self.problem)
        return {"line": self.line, **data}


def id_problem(action_id: object) -> str:
    """Why ``action_id`` cannot name an action ("" when it can)."""
    return action_id_problem(action_id, "action_id")


def read_lines(stream: IO[bytes]) -> Iterator[Line]:
    """Parse JSON lines ``{"action_id": ..., "params": {...}}`` one at a time (never the
    whole input). Blank lines are skipped; every other line yields a ``Line``."""
    number = 0
    while True:
        raw = _read(stream, MAX_LINE + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of it, a chunk at a time
                raw = _read(stream, MAX_LINE)
            yield Line(number, problem=f"line longer than {MAX_LINE} bytes")
            continue
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except UnicodeDecodeError:
            yield Line(number, problem="not UTF-8 text")
            continue
        except ValueError as exc:
            yield Line(number, problem=f"not valid JSON ({exc})")
            continue
        except RecursionError:
            yield Line(number, problem="nested too deeply")
            continue
        yield _line(number, value, check_params_json)


def _read(stream: IO[bytes], limit: int) -> bytes:
    try:
        return stream.readline(limit)
    except OSError as exc:
        raise InvalidInput(f"cannot read the input: {exc.strerror or exc}") from None


def _line(number: int, value: Any, check: Callable[[Any], str]) -> Line:
    if not isinstance(value, dict):
        return Line(number, problem=f"must be a JSON object, got {type(value).__name__}")
    extra = sorted(set(value) - {"action_id", "params"})
    if extra:
        return Line(number, problem=f"unknown key {extra[0]!r} (a line has action_id and params)")
    aid = value.get("action_id")
    if aid is None:
        return Line(number, problem="action_id is required (a rerun must not send twice)")
    problem = id_problem(aid)
    if problem:
        return Line(number, problem=problem)
    params = value.get("params", {})
    if not isinstance(params, dict):
        return Line(
            number, aid, problem=f"params must be a JSON object, got {type(params).__name__}"
        )
    try:
        check(params)
    except InvalidInput as exc:
        return Line(number, aid, problem=str(exc))
    return Line(number, aid, params)


@dataclass
class _Claimed:
    line: int
    record: ActionRecord
    taken: policy.Claim
    first: bool  # the first request of its group
    declared: Declared  # what governs it (rule 11)


@dataclass
class _Done:
    item: _Claimed
    attempt: Attempt | None = None
    move: Move | None = None
    error: BaseException | None = None
    at: float = field(default_factory=time.monotonic)


class _BulkSend(ABC):
    """The engine of a bulk run to one provider: groups of claims committed before
    their requests leave (``_claim``, each kind of run its own), sends from a pool,
    outcomes committed in groups, each line reported after its commit."""

    def __init__(
        self,
        dispatcher: Sender,
        provider: str,
        *,
        concurrency: int = 1,
        group: int = DEFAULT_GROUP,
        gate: Gate | None = None,
        flush_after: float = DEFAULT_FLUSH_AFTER,
        stop_requested: Callable[[], bool] | None = None,
    ) -> None:
        if concurrency < 1 or group < 1:
            raise InvalidInput("concurrency and group size must be at least 1")
        self.d = dispatcher
        self.provider_name = provider
        self.concurrency = concurrency
        self.group = group
        self.gate = gate if gate is not None else Gate(concurrency)
        self.flush_after = flush_after
        self.provider = dispatcher.registry.provider(provider)  # a config error: nothing done
        self._done: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._inflight = 0
        self._queued: list[tuple[_Claimed, Future[None]]] = []  # handed to the pool
        self._stopping = False
        self._stop_requested = stop_requested or (lambda: False)
        self._lease_end: datetime | None = None  # the last lease of the claims sent so far
        # In this thread (concurrency 1) the next group waits for the last one's outcomes;
        # with a pool, it is claimed as soon as no request waits in the pool's queue.
        self._refill = 1 if concurrency == 1 else concurrency + 1

    # ------------------------------------------------------------------ the loop
    def run(self, lines: Iterable[Line]) -> Iterator[Settled]:
        """Dispatch every line; yield each line's result once it is durable."""
        freeze_start_up()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="settled-send")
        source = iter(lines)
        finished: list[_Done] = []
        exhausted = False
        completed = False
        failure: BaseException | None = None
        forced = False
        try:
            while True:
                if not self._stopping and self._stop_requested():
                    self._stop()  # read and start nothing more; report the rest
                if finished and (
                    len(finished) >= self.group
                    or self._inflight == 0
                    or time.monotonic() - finished[0].at >= self.flush_after
                ):
                    batch_done, finished = finished, []
                    yield from self._commit(batch_done)
                # The next group is claimed once the pool has no queue left to work on.
                if (
                    not exhausted
                    and failure is None
                    and not self._stopping
                    and self._inflight < self._refill
                ):
                    wait = self.gate.closed_for()
                    if wait <= 0:
                        batch = list(islice(source, self.group))
                        exhausted = len(batch) < self.group
                        if batch:
                            yield from self._claim(batch, pool)
                        continue
                    if self._inflight == 0:
                        ahead = next(source, None)  # is there anything left to wait for?
                        if ahead is None:
                            exhausted = True
                            continue
                        source = chain([ahead], source)
                        nap(min(wait, 1.0))  # the provider asked for a pause
                        continue
                if self._inflight == 0:
                    break
                for got in self._next(finished):
                    if got.error is not None:
                        failure = failure or got.error
                    else:
                        finished.append(got)
            completed = True
        except KeyboardInterrupt:
            forced = True  # a second Ctrl-C: wait for nothing more
            raise
        finally:
            self._wind_down(pool, finished, completed=completed, wait=not forced)
        if failure is not None:
            raise failure

    def _stop(self) -> None:
        """Start nothing more: what waits in the pool's queue is never sent."""
        self._stopping = True
        for item, future in self._queued:
            if future.cancel():  # never started: provably never sent
                self._unsent(item)
        self._queued = []

    def _wind_down(
        self, pool: ThreadPoolExecutor, finished: list[_Done], *, completed: bool, wait: bool
    ) -> None:
        """However the loop ended, every request that left gets its outcome recorded
        (``wait``: within the last lease of those in flight, after which no try of
        theirs can still be under way); if it ended early, nothing more starts and what
        never started is unsent. Without ``wait`` (a second Ctrl-C) only the outcomes
        already in are written: the actions still in flight stay IN_FLIGHT until their
        lease lapses, then reconciliation settles them (never a second send)."""
        if not completed:  # abandoned, interrupted or failed: start nothing more
            self._stop()
        deadline = self._last_lease()
        while self._inflight:
            left = deadline - time.monotonic() if wait else 0.0
            try:
                got = (
                    self._done.get(timeout=max(left, 0.0)) if left > 0 else self._done.get_nowait()
                )
            except queue.Empty:
                break  # honestly IN_FLIGHT: their leases lapse, reconciliation settles them
            self._inflight -= 1
            if got.error is None:
                finished.append(got)
        if finished:
            for _ in self._commit(finished):
                pass
        pool.shutdown(wait=wait, cancel_futures=True)

    def _last_lease(self) -> float:
        """The monotonic time by which every claimed action's lease has lapsed."""
        if self._lease_end is None:
            return time.monotonic()
        left = (self._lease_end - self.d.clock.now()).total_seconds()
        return time.monotonic() + max(left, 0.0) + 1.0

    def _next(self, finished: list[_Done]) -> list[_Done]:
        """Every finished send there is, waiting for one at most until the oldest
        outcome in hand is due for its commit."""
        got: list[_Done] = []
        timeout = POLL  # then the loop looks for a stop request again
        if finished:
            timeout = min(timeout, max(0.0, finished[0].at + self.flush_after - time.monotonic()))
        while self._inflight:
            try:
                one = self._done.get(timeout=timeout) if not got else self._done.get_nowait()
            except queue.Empty:
                break
            self._inflight -= 1
            got.append(one)
        return got

    @abstractmethod
    def _claim(self, batch: list[Line], pool: ThreadPoolExecutor) -> Iterator[Settled]:
        """Claim a group (one durable transaction) and hand what it claimed to ``_send``;
        yield what could not be claimed."""

    def _lease_grace(self, declared: Declared, ahead: int) -> float:
        """A claimed request may wait in the pool's queue behind ``ahead`` others: its
        lease covers one request budget per round of the pool ahead of it."""
        rounds = (self._inflight + ahead) // self.concurrency
        budget = policy.request_budget(declared, self.d.settings.backoff)
        return self.d.settings.lease_grace + rounds * budget

    # ------------------------------------------------------------------ sending
    def _send(self, claimed: list[_Claimed], pool: ThreadPoolExecutor) -> None:
        self._queued = [x for x in self._queued if not x[1].done()]
        for item in claimed:
            lease = from_text(item.record.lease_expires_at)
            if lease is not None and (self._lease_end is None or lease > self._lease_end):
                self._lease_end = lease
            if self.concurrency == 1:
                self._inflight += 1
                self._work(item)  # in this thread: no hand-over cost when nothing overlaps
            else:
                future = pool.submit(self._work, item)
                self._inflight += 1  # counted once handed over: an outcome will come
                self._queued.append((item, future))

    def _work(self, item: _Claimed) -> None:
        """One claimed action's tries (a pool thread); its outcome move, not written."""
        if self._stopping:  # the run stopped while this one waited in the pool's queue
            self._unsent(item)
            return
        try:
            if not item.first:
                self.d.probe("between_requests")
            attempt = self.d.send_claimed(
                item.record, item.declared, self.provider, item.taken, self.gate
            )
            self._done.put(_Done(item, attempt, self.d.outcome_move(attempt)))
        except BaseException as exc:  # handed to the writing thread, which raises it
            self._stopping = True  # what has not started yet never will
            self._done.put(_Done(item, error=exc))

    def _unsent(self, item: _Claimed) -> None:
        """A claimed action whose request never started (the run stopped first): its
        outcome says so (``FAILED``, never sent), and ``settled retry`` may send it."""
        why = "never sent: the bulk run stopped before this request started"
        attempt = Attempt(item.record, item.declared, item.taken, lapsed=True)
        move = with_reason(self.d.outcome_move(attempt), why)
        attempt.tries[-1]["detail"] = why  # the same list the outcome event carries
        self._done.put(_Done(item, attempt, move))

    # ------------------------------------------------------------------ outcomes
    def _commit(self, done: list[_Done]) -> Iterator[Settled]:
        """Commit a group of outcomes in one transaction; report each after it."""
        d = self.d
        moves = [x.move for x in done if x.move is not None]
        try:
            held = d.ledger.commit(moves)
        except LedgerError as exc:
            cause = str(exc).split("; ")[0]
            for x in done:
                rec = x.item.record
                msg = (
                    f"sent, but its outcome could not be recorded ({cause}); it stays "
                    f"IN_FLIGHT until its lease lapses at {rec.lease_expires_at}, then "
                    "reconciliation settles it"
                )
                yield Settled(
                    x.item.line, rec.action_id, Report(Outcome.DISPATCHED, rec, None, msg)
                )
            return
        d.probe("after_group_outcome")
        for x, ok in zip(done, held, strict=True):
            assert x.attempt is not None and x.move is not None
            written = after_move(x.item.record, x.move) if ok else None
            rec = x.item.record
            try:
                report = d.finish(x.attempt, x.move, written)
            except LedgerError as exc:  # a late reply's note could not be written
                lost = d.not_recorded(x.attempt, x.move, exc)
                report = Report(Outcome.DISPATCHED, rec, None, str(lost))
            yield Settled(x.item.line, rec.action_id, report)


class BulkDispatch(_BulkSend):
    """One bulk run of ``provider.operation`` through ``dispatcher``."""

    def __init__(  # noqa: PLR0913  (submit_many's options, passed through)
        self,
        dispatcher: Sender,
        provider: str,
        operation: str,
        *,
        concurrency: int = 1,
        group: int = DEFAULT_GROUP,
        gate: Gate | None = None,
        flush_after: float = DEFAULT_FLUSH_AFTER,
        stop_requested: Callable[[], bool] | None = None,
    ) -> None:
        spec = dispatcher.registry.operation(provider, operation)  # UnknownProvider: nothing done
        super().__init__(
            dispatcher,
            provider,
            concurrency=concurrency,
            group=group,
            gate=gate,
            flush_after=flush_after,
            stop_requested=stop_requested,
        )
        self.operation = operation
        self.declared = Declared.of(spec)
        self.needs_confirmation = bool(getattr(spec, "needs_confirmation", False))

    def run(self, lines: Iterable[Line]) -> Iterator[Settled]:
        if self.needs_confirmation:
            yield from self._record_only(lines)
        else:
            yield from super().run(lines)

    def _record_only(self, lines: Iterable[Line]) -> Iterator[Settled]:
        """An operation that declares it needs confirmation: each line is recorded
        (``PENDING``), never sent, exactly as a single dispatch would record it."""
        for line in lines:
            if self._stop_requested():
                return
            if line.problem or line.action_id is None:
                yield Settled(line.number, line.action_id, problem=line.problem or "no action_id")
                continue
            try:
                report = self.d.submit(
                    self.provider_name,
                    self.operation,
                    line.params,
                    action_id=line.action_id,
                    needs_confirmation=True,
                )
            except Conflict as exc:
                yield Settled(line.number, line.action_id, problem=str(exc), conflict=True)
            except InvalidInput as exc:
                yield Settled(line.number, line.action_id, problem=str(exc))
            else:
                yield Settled(line.number, line.action_id, report)

    # ------------------------------------------------------------------ claiming
    def _claim(self, batch: list[Line], pool: ThreadPoolExecutor) -> Iterator[Settled]:
        d = self.d
        pairs: list[tuple[ActionRecord, policy.Claim]] = []
        lines: list[int] = []
        now = d.clock.now()
        for line in batch:
            if line.problem or line.action_id is None:
                yield Settled(line.number, line.action_id, problem=line.problem or "no action_id")
                continue
            try:
                d.registry.check_params(self.provider_name, self.operation, line.params)
            except InvalidInput as exc:
                yield Settled(line.number, line.action_id, problem=str(exc))
                continue
            rec = policy.new_record(
                action_id=line.action_id,
                provider=self.provider_name,
                operation=self.operation,
                params=line.params,
                declared=self.declared,
                now=now,
            )
            snapshot = None
            if self.declared.snapshots:
                # A snapshot is a query: never spend one on an id that already exists.
                if d.ledger.find(rec.action_id) is None:
                    snapshot = self.provider.snapshot(rec.operation, rec.params)
            taken = policy.claim(
                rec,
                self.declared,
                now,
                actor=d.actor,
                grace=self._lease_grace(self.declared, len(pairs)),
                default_backoff=d.settings.backoff,
                snapshot=snapshot,
            )
            pairs.append((rec, taken))
            lines.append(line.number)
        if not pairs:
            return
        d.probe("before_claim")
        results = d.ledger.record_and_claim_many(
            [(rec, taken.move) for rec, taken in pairs], actor=d.actor
        )
        d.probe("after_group_claim")
        claimed: list[_Claimed] = []
        found: list[Settled] = []  # reported once every claim is on its way
        for number, (rec, taken), (stored, created) in zip(lines, pairs, results, strict=True):
            if created:
                claimed.append(_Claimed(number, stored, taken, not claimed, self.declared))
                continue
            try:
                same_action(stored, rec)
            except Conflict as exc:
                found.append(Settled(number, rec.action_id, problem=str(exc), conflict=True))
                continue
            found.append(Settled(number, rec.action_id, as_found(stored, EXISTS)))
        self._send(claimed, pool)
        yield from found


class BulkRetry(_BulkSend):
    """A bulk retry of FAILED records of one provider (``Dispatcher.retry_many``). For
    each group: the check of rule 14 for every record (queried from the pool, judged
    here; one whose effect is visible is corrected to CONFIRMED and refused, one that
    cannot be checked is refused), then the reopens and claims of the others in ONE
    durable transaction (``Ledger.claim_retries``) before any of their requests
    leaves; sends and outcomes as a bulk dispatch's. Each record keeps the
    declarations it was recorded with (rule 11)."""

    def __init__(
        self,
        dispatcher: Sender,
        provider: str,
        *,
        recheck: bool = True,
        concurrency: int = 1,
        group: int = DEFAULT_GROUP,
        gate: Gate | None = None,
        flush_after: float = DEFAULT_FLUSH_AFTER,
    ) -> None:
        super().__init__(
            dispatcher,
            provider,
            concurrency=concurrency,
            group=group,
            gate=gate,
            flush_after=flush_after,
        )
        self.recheck = recheck
        from .reconcile import Reconciler

        self.checker = Reconciler(
            dispatcher.ledger,
            dispatcher.registry,
            clock=dispatcher.clock,
            actor="recheck",
            probe=dispatcher.probe,
        )

    def _claim(self, batch: list[Line], pool: ThreadPoolExecutor) -> Iterator[Settled]:
        from .reconcile import Recheck
        from .resolve import NO_RECHECK

        d = self.d
        now = d.clock.now()
        wanted: list[tuple[int, ActionRecord]] = []
        for line in batch:
            aid = line.action_id or ""
            rec = d.ledger.find(aid)
            if rec is None:
                yield Settled(line.number, aid, problem=f"no action {aid!r}", missing=True)
                continue
            problem = retry_problem(rec)
            if problem:
                yield Settled(line.number, aid, problem=problem, refused=True, record=rec)
                continue
            wanted.append((line.number, rec))
        if self.recheck:
            asked = f"{d.actor} (retry)"
            seen = self.checker.recheck_many([r for _, r in wanted], now, asked=asked, pool=pool)
        else:
            seen = [Recheck("skipped", NO_RECHECK, r) for _, r in wanted]
        pairs: list[tuple[Move, policy.Claim, Declared]] = []
        lines: list[int] = []
        for (number, rec), check in zip(wanted, seen, strict=True):
            if check.refuses:
                yield Settled(
                    number,
                    rec.action_id,
                    problem=str(check.refusal("the retry")),
                    refused=True,
                    record=check.record,
                )
                continue
            declared = d.declared_for(rec)
            reopen = policy.reopen(rec, declared, now, actor=d.actor, recheck=check.note)
            fresh = after_move(rec, reopen)
            snapshot = (
                self.provider.snapshot(rec.operation, rec.params) if declared.snapshots else None
            )
            taken = policy.claim(
                fresh,
                declared,
                now,
                actor=d.actor,
                grace=self._lease_grace(declared, len(pairs)),
                default_backoff=d.settings.backoff,
                snapshot=snapshot,
            )
            pairs.append((reopen, taken, declared))
            lines.append(number)
        if not pairs:
            return
        d.probe("before_claim")
        stored = d.ledger.claim_retries([(reopen, taken.move) for reopen, taken, _ in pairs])
        d.probe("after_group_claim")
        claimed: list[_Claimed] = []
        lost: list[Settled] = []  # reported once every claim is on its way
        for number, (reopen, taken, declared), rec in zip(lines, pairs, stored, strict=True):
            if rec is not None:
                claimed.append(_Claimed(number, rec, taken, not claimed, declared))
                continue
            now_is = d.ledger.get(reopen.action_id)
            lost.append(
                Settled(
                    number,
                    reopen.action_id,
                    refused=True,
                    record=now_is,
                    problem=f"action {reopen.action_id} changed to {now_is.status} "
                    "before it could be retried (retried elsewhere?)",
                )
            )
        self._send(claimed, pool)
        yield from lost


def summary(results: Iterable[Settled]) -> dict[str, int]:
    """Lines by what became of them: a status, ``invalid`` or ``conflict``."""
    out: dict[str, int] = {}
    for r in results:
        key = _key(r)
        out[key] = out.get(key, 0) + 1
    return out


def _key(r: Settled) -> str:
    if r.report is not None and r.report.record is not None:
        return str(r.report.record.status)
    return "conflict" if r.conflict else "invalid"


__all__ = [
    "DEFAULT_GROUP",
    "BulkDispatch",
    "BulkRetry",
    "Line",
    "Settled",
    "id_problem",
    "read_lines",
    "summary",
]
