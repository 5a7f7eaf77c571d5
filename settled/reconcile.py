"""The verifier: settles what dispatch left open, by evidence.

One pass takes the records due when it starts (``next_check_at <= start``) in bounded
batches, each at most once. Claiming a batch is one write transaction that moves each
row's ``next_check_at`` forward by the reconciler's lease and stamps ``lease_owner``:
another reconciler's due scan no longer sees the row, so two reconcilers never query
the same row for the same due time. The result of each check is written under that
lease; a reconciler that dies leaves rows that fall due again when the lease ends.

The results of a batch are committed together (group commit): one durable transaction
per batch instead of one per row, at the end of the batch, or before the next check
once the oldest unwritten result is ``flush_after`` seconds old (so slow queries do
not hold results back). Each write is still guarded by status and lease owner, and a
result lost to a crash before its commit only means the row is checked again when
the reconciler's lease runs out.

- ``IN_FLIGHT`` past its lease: the dispatcher was lost → ``DENIED_UNRESOLVED``.
- ``AWAITING_VERIFICATION``, partial tier: past the window, a person must verify.
- queryable records: the query reads the real effect. Applied → ``CONFIRMED``;
  provably not applied → ``FAILED``; nothing yet or not attributable → check again
  at now + interval, until the verification budget (rule 4) is spent →
  ``DENIED_UNRESOLVED`` with the evidence gathered. Never ``CONFIRMED`` on a budget.
  Before ``eligible_at`` an absence is not proof: ``not_applied`` counts as not yet.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import faults
from .clock import Clock, from_text, plus, to_text
from .errors import SettledError, UnknownProvider
from .ledger import Ledger
from .model import Acceptance, ActionRecord, Delivery, Status, Tier
from .providers.base import Observation, OperationSpec, QueryTarget, Seen

DEFAULT_BATCH = 200
DEFAULT_LEASE = 60.0  # s a reconciler holds a row; at least 2 × the query timeout
DEFAULT_FLUSH_AFTER = 0.2  # s an observed result may wait for its batch's commit


@dataclass
class Change:
    """One thing a pass did to one record (a line of the daemon's log)."""

    action_id: str
    from_status: str
    to_status: str
    kind: str
    reason: str
    next_check_at: str | None = None
    at: str | None = None
    provider: str = ""
    operation: str = ""
    seen: str | None = None  # what the check observed (a Seen value), when a query ran

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "action_id": self.action_id,
            "from": self.from_status,
            "to": self.to_status,
            "kind": self.kind,
            "reason": self.reason,
            "next_check_at": self.next_check_at,
        }


@dataclass
class PassReport:
    examined: int = 0
    changes: list[Change] = field(default_factory=list)
    skipped: list[Change] = field(default_factory=list)
    stopped: bool = False  # stop_requested() ended the pass early; the rest was handed back

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ch in self.changes:
            out[ch.to_status] = out.get(ch.to_status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "examined": self.examined,
            "changes": [c.to_json() for c in self.changes],
            "skipped": [c.to_json() for c in self.skipped],
            "counts": self.counts(),
            "stopped": self.stopped,
        }


# Statuses a due scan may take: a lost dispatcher, or a record waiting for evidence.
DUE_STATUSES = (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED)


@dataclass
class Reconciler:
    ledger: Ledger
    registry: Any
    clock: Clock = field(default_factory=Clock)
    actor: str = "reconciler"
    batch: int = DEFAULT_BATCH
    lease: float = DEFAULT_LEASE
    on_change: Callable[[Change], None] | None = None  # every status move, after its commit
    on_check: Callable[[Change], None] | None = None  # every check that moved nothing, after its commit
    stop_requested: Callable[[], bool] = lambda: False
    flush_after: float = DEFAULT_FLUSH_AFTER
    _queued: list[Callable[[sqlite3.Connection], None]] = field(
        default_factory=list, init=False, repr=False
    )
    _queued_since: float = field(default=0.0, init=False, repr=False)
    _grouping: bool = field(default=False, init=False, repr=False)
    _announce: list[tuple[Callable[[Change], None], Change]] = field(
        default_factory=list, init=False, repr=False
    )
    _specs: dict[tuple[str, str], tuple[OperationSpec | None, str]] = field(
        default_factory=dict, init=False, repr=False
    )

    # ------------------------------------------------------------ passes
    def run_due(self, limit: int | None = None) -> PassReport:
        """Settle the records due when the pass starts (at most ``limit``), batch by
        batch. A record is checked at most once per pass: a check that finds nothing
        schedules the next one after the pass's start, so a pass always ends. An
        expired ``IN_FLIGHT`` lease becomes ``DENIED_UNRESOLVED`` and, when it can be
        queried, is checked later in the same pass.

        ``stop_requested()`` is asked before each record: the check in hand is
        finished, and the rest of the batch is handed back (lease released, due time
        unchanged) so that another reconciler takes it at once."""
        report = PassReport()
        self._specs.clear()  # looked up once per operation and pass
        cutoff = to_text(self.clock.now())
        assert cutoff is not None
        while limit is None or report.examined < limit:
            if self.stop_requested():
                report.stopped = True
                break
            size = self.batch if limit is None else min(self.batch, limit - report.examined)
            selected, claimed = self._claim_batch(size, cutoff, report)
            if not selected:
                break
            self._grouping = True
            try:
                for i, (rec, owner) in enumerate(claimed):
                    if self.stop_requested():
                        report.stopped = True
                        self._flush()
                        self._hand_back(claimed[i:])
                        break
                    if self._queued and time.monotonic() - self._queued_since >= self.flush_after:
                        self._flush()
                    report.examined += 1
                    self._check(rec, owner, report)
            except BaseException:
                self._grouping = False
                self._flush()
                raise
            # The batch's results stay queued: the next batch's lease commits them.
            self._grouping = False
            if report.stopped:
                break
        self._flush()
        return report

    def run_ids(self, action_ids: Iterable[str]) -> PassReport:
        """Check these records now, whatever their schedule. Unknown ids raise
        ``NotFound`` before anything is checked."""
        ids = list(dict.fromkeys(action_ids))
        records = [self.ledger.get(aid) for aid in ids]
        report = PassReport()
        self._specs.clear()
        for rec in records:
            if self.stop_requested():
                report.stopped = True
                break
            report.examined += 1
            self._check_one(rec.action_id, report)
        return report

    def _check_one(self, aid: str, report: PassReport) -> None:
        rec = self.ledger.get(aid)
        now = self.clock.now()
        if rec.status is Status.IN_FLIGHT:
            expires = from_text(rec.lease_expires_at)
            if expires is not None and expires > now:
                report.skipped.append(
                    Change(aid, rec.status, rec.status, "skipped",
                           f"dispatch in progress; lease until {rec.lease_expires_at}")
                )
                return
            with self._tx() as c:
                self._expire(c, rec, now, report)
            rec = self.ledger.get(aid)
            due = from_text(rec.next_check_at)
            if rec.status is not Status.DENIED_UNRESOLVED or due is None or due > now:
                return
        if rec.status not in (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED):
            report.skipped.append(
                Change(aid, rec.status, rec.status, "skipped", f"nothing to reconcile: {rec.status}")
            )
            return
        if rec.requires_manual_verification:
            eligible = from_text(rec.eligible_at)
            if rec.status is Status.DENIED_UNRESOLVED:
                report.skipped.append(Change(aid, rec.status, rec.status, "skipped",
                                             "needs a person: `settled resolve`"))
                return
            if eligible is not None and eligible > now:
                report.skipped.append(Change(
                    aid, rec.status, rec.status, "skipped",
                    f"partial tier: a person verifies it; it joins the queue at {rec.eligible_at}",
                    rec.next_check_at))
                return
        owner = "r-" + uuid.uuid4().hex
        held = self._lease_one(rec, owner, now)
        if held is None:
            report.skipped.append(
                Change(aid, rec.status, rec.status, "skipped", "another reconciler holds it")
            )
            return
        self._check(held, owner, report)

    # ------------------------------------------------------------ claiming
    def _claim_batch(
        self, size: int, cutoff: str, report: PassReport
    ) -> tuple[int, list[tuple[ActionRecord, str]]]:
        """Lease up to ``size`` rows due at ``cutoff`` in one write transaction.
        Returns how many rows were selected and the leased ones."""
        now = self.clock.now()
        until = to_text(plus(now, self.lease))
        owner = "r-" + uuid.uuid4().hex
        out: list[tuple[ActionRecord, str]] = []
        marks = ", ".join("?" * len(DUE_STATUSES))
        with self._tx() as c:
            self._run_queued(c)  # the previous batch's results: one commit for both
            # "+status": filter on status, never search by it. Without statistics
            # SQLite may otherwise pick the status index, read every row waiting for
            # verification and sort them, once per batch (≈ 150 ms at 100k due rows).
            cur = c.execute(
                "SELECT * FROM actions WHERE next_check_at IS NOT NULL AND next_check_at <= ?"
                f" AND +status IN ({marks}) ORDER BY next_check_at LIMIT ?",
                (cutoff, *map(str, DUE_STATUSES), size),
            )
            names = [d[0] for d in cur.description]
            rows = [ActionRecord.from_row(dict(zip(names, r, strict=True))) for r in cur.fetchall()]
            for rec in rows:
                if rec.status is Status.IN_FLIGHT:
                    expires = from_text(rec.lease_expires_at)
                    if expires is not None and expires > now:  # not lost: fix its schedule
                        c.execute("UPDATE actions SET next_check_at = ? WHERE action_id = ?",
                                  (rec.lease_expires_at, rec.action_id))
                        continue
                    report.examined += 1
                    self._expire(c, rec, now, report)
                    continue
                rec.lease_owner = owner  # rec.next_check_at keeps the due time, for _hand_back
                out.append((rec, owner))
            c.executemany(  # one statement for the batch's leases
                "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?",
                [(owner, until, rec.action_id) for rec, _ in out],
            )
        return len(rows), out

    def _hand_back(self, held: list[tuple[ActionRecord, str]]) -> None:
        """Release rows this pass leased but will not check: due again at once."""
        with self._tx() as c:
            for rec, owner in held:
                c.execute(
                    "UPDATE actions SET lease_owner = NULL, next_check_at = ?"
                    " WHERE action_id = ? AND lease_owner = ?",
                    (rec.next_check_at, rec.action_id, owner),
                )

    def _lease_one(self, rec: ActionRecord, owner: str, now: datetime) -> ActionRecord | None:
        until = to_text(plus(now, self.lease))
        with self._tx() as c:
            cur = c.execute(
                "UPDATE actions SET lease_owner = ?, next_check_at = ? WHERE action_id = ?"
                " AND status = ? AND (lease_owner IS NULL OR next_check_at IS NULL"
                " OR next_check_at <= ?)",
                (owner, until, rec.action_id, str(rec.status), to_text(now)),
            )
            if cur.rowcount != 1:
                return None
        rec.lease_owner = owner
        return rec

    def _expire(self, c: Any, rec: ActionRecord, now: datetime, report: PassReport) -> None:
        """A dispatcher that held the claim is gone: its request may or may not have
        left. Never re-send; the record becomes unresolved and, when the operation can
        be queried, reconciliation starts now (rule 4: the budget starts here, and the
        first check is due at once, or at ``eligible_at`` when that is later)."""
        spec, problem = self._spec(rec)
        at = to_text(now)
        reason = (
            f"dispatcher lost: its lease expired at {rec.lease_expires_at} before an outcome "
            "was recorded; the request may have been sent"
        )
        values: dict[str, Any] = {
            "delivery": str(Delivery.UNKNOWN),
            "lease_owner": None,
            "lease_expires_at": None,
            "next_check_at": None,
        }
        if spec is not None and _auto_checkable(spec, rec):
            eligible = from_text(rec.eligible_at) or now
            start = max(now, eligible)
            values["verify_started_at"] = to_text(start)
            values["verify_deadline_at"] = to_text(plus(start, spec.verify_deadline))
            expired = from_text(rec.lease_expires_at) or now
            values["next_check_at"] = to_text(eligible if eligible > now else max(expired, eligible))
            reason += "; reconciliation will query the provider"
        elif spec is None and not rec.requires_manual_verification:
            # Whether it can be queried is for a reconciler that has the provider to say;
            # its budget starts at its first check.
            values["next_check_at"] = to_text(plus(now, self.lease))
            reason += f"; {problem}: a reconciler that has it will check it"
        else:
            reason += "; needs a person"
        values["reason"] = reason
        moved = self.ledger.move(
            c,
            rec.action_id,
            Status.IN_FLIGHT,
            Status.DENIED_UNRESOLVED,
            actor=self.actor,
            kind="lease_expired",
            at=at,
            detail={"lease_owner": rec.lease_owner, "lease_expires_at": rec.lease_expires_at,
                    "reason": reason},
            values=values,
            owner=rec.lease_owner,
        )
        if moved:
            self._note(report, Change(rec.action_id, "IN_FLIGHT", "DENIED_UNRESOLVED",
                                      "lease_expired", reason, values["next_check_at"], at,
                                      rec.provider, rec.operation))

    # ------------------------------------------------------------ checking
    def _spec(self, rec: ActionRecord) -> tuple[OperationSpec | None, str]:
        """The operation's declarations, or None and why (not configured here, or its
        provider section is wrong): such a record waits, it is never guessed about."""
        key = (rec.provider, rec.operation)
        found = self._specs.get(key)
        if found is None:
            found = self._specs[key] = self._lookup(rec)
        return found

    def _lookup(self, rec: ActionRecord) -> tuple[OperationSpec | None, str]:
        try:
            spec = self.registry.operation(rec.provider, rec.operation)
        except UnknownProvider:
            return None, f"provider {rec.provider}.{rec.operation} is not configured here"
        except SettledError as exc:
            return None, f"provider {rec.provider} cannot be used: {exc}"
        return spec, ""

    def _check(self, rec: ActionRecord, owner: str, report: PassReport) -> None:
        now = self.clock.now()
        if rec.requires_manual_verification:
            why = (
                "past its consistency window; only a person can verify acceptance (partial tier)"
                if rec.tier is Tier.PARTIAL
                else "no query can observe this effect; needs a person"
            )
            self._to_unresolved(rec, owner, now, why, {}, report)
            return
        spec, problem = self._spec(rec)
        if spec is None:
            self._release(rec, owner, now, None, problem, report, keep_schedule=True)
            return
        if not spec.queryable:
            self._to_unresolved(rec, owner, now, "no query can observe this effect; needs a person",
                                {}, report)
            return
        faults.point("before_check")
        obs = self.registry.provider(rec.provider).query(
            QueryTarget(
                action_id=rec.action_id,
                operation=rec.operation,
                params=rec.params,
                reconciliation_key=rec.reconciliation_key,
                provider_object_id=rec.provider_object_id,
                snapshot=rec.snapshot,
                attempt=rec.attempt,
            )
        )
        now = self.clock.now()
        eligible = from_text(rec.eligible_at)
        if obs.seen is Seen.NOT_APPLIED and eligible is not None and now < eligible:
            # Inside the consistency window an absence proves nothing: the effect may
            # not be visible yet. Only a check at or after eligible_at may fail it.
            obs = Observation(
                Seen.NOT_YET, obs.object_id,
                f"{obs.detail or 'not applied'} — before the consistency window ends "
                f"({rec.eligible_at}); not taken as proof", obs.evidence,
            )
        if obs.seen is Seen.APPLIED and spec.snapshots and not spec.carries_key:
            # Attributed by snapshot diff alone: another action asking for the same
            # change could have made it, and the diff cannot tell which one did.
            rivals = self.ledger.rivals(rec)
            if rivals:
                obs = Observation(
                    Seen.AMBIGUOUS, obs.object_id,
                    f"the change is there, but {', '.join(rivals)} asked for the same change; "
                    "a snapshot diff cannot tell which action made it", obs.evidence,
                )
        evidence = {"seen": str(obs.seen), "detail": obs.detail[:300], "check": rec.checks + 1,
                    **dict(obs.evidence)}
        if obs.seen is Seen.APPLIED:
            self._settle(rec, owner, now, Status.CONFIRMED, obs, evidence, report)
        elif obs.seen is Seen.NOT_APPLIED:
            self._settle(rec, owner, now, Status.FAILED, obs, evidence, report)
        else:
            deadline = from_text(rec.verify_deadline_at)
            budget: dict[str, Any] = {}
            if deadline is None and rec.checks == 0:  # expired where the provider was unknown
                deadline = plus(now, spec.verify_deadline)
                budget = {"verify_started_at": to_text(now), "verify_deadline_at": to_text(deadline)}
            if deadline is None or now >= deadline:
                why = (
                    f"verification budget spent after {rec.checks + 1} check(s); last: "
                    f"{obs.seen}" + (f" ({obs.detail[:200]})" if obs.detail else "")
                )
                self._to_unresolved(rec, owner, now, why, evidence, report)
            else:
                nxt = min(plus(now, spec.verify_interval), deadline)
                if eligible is not None and nxt < eligible:
                    nxt = eligible  # an early (forced) check: the scheduled one still runs
                reason = f"checked: {obs.seen}" + (f" ({obs.detail[:200]})" if obs.detail else "")
                self._release(rec, owner, now, nxt, reason, report, extra=budget,
                              seen=str(obs.seen))

    def _settle(self, rec: ActionRecord, owner: str, now: datetime, to: Status,
                obs: Observation, evidence: dict[str, Any], report: PassReport) -> None:
        at = to_text(now)
        values: dict[str, Any] = {
            "lease_owner": None,
            "next_check_at": None,
            "checks": rec.checks + 1,
        }
        if to is Status.CONFIRMED:
            values.update(
                acceptance=str(Acceptance.ACCEPTED),
                delivery=str(Delivery.DELIVERED),
                confirmed_at=at,
                confirmed_by="reconciliation",
                reason=None,
            )
            reason = "effect observed by reconciliation" + (f": {obs.detail[:200]}" if obs.detail else "")
        else:
            values.update(acceptance=str(Acceptance.REJECTED))
            reason = "reconciliation proved the effect absent" + (f": {obs.detail[:200]}" if obs.detail else "")
            values["reason"] = reason
        if obs.object_id:
            values["provider_object_id"] = obs.object_id

        def write(c: sqlite3.Connection) -> None:
            moved = self.ledger.move(
                c, rec.action_id, rec.status, to, actor=self.actor, kind="reconciled", at=at,
                detail={**evidence, "reason": reason}, values=values, owner=owner,
            )
            if moved:
                self._note(report, Change(rec.action_id, str(rec.status), str(to), "reconciled",
                                          reason, None, at, rec.provider, rec.operation,
                                          str(obs.seen)))

        self._write(write)

    def _to_unresolved(self, rec: ActionRecord, owner: str, now: datetime, why: str,
                       evidence: dict[str, Any], report: PassReport) -> None:
        def write(c: sqlite3.Connection) -> None:
            moved = self.ledger.move(
                c, rec.action_id, rec.status, Status.DENIED_UNRESOLVED, actor=self.actor,
                kind="unresolved", at=to_text(now), detail={**evidence, "reason": why},
                values={"lease_owner": None, "next_check_at": None, "reason": why,
                        "checks": rec.checks + (1 if evidence else 0)},
                owner=owner,
            )
            if moved:
                self._note(report, Change(rec.action_id, str(rec.status), "DENIED_UNRESOLVED",
                                          "unresolved", why, None, to_text(now), rec.provider,
                                          rec.operation, evidence.get("seen")))

        self._write(write)

    def _release(self, rec: ActionRecord, owner: str, now: datetime, nxt: datetime | None,
                 reason: str, report: PassReport, keep_schedule: bool = False,
                 extra: dict[str, Any] | None = None, seen: str | None = None) -> None:
        values: dict[str, Any] = {"lease_owner": None, "reason": reason, **(extra or {})}
        if keep_schedule:
            values["next_check_at"] = to_text(plus(now, self.lease))
        else:
            values["next_check_at"] = to_text(nxt)
            values["checks"] = rec.checks + 1
        def write(c: sqlite3.Connection) -> None:
            self.ledger.apply_schedule(c, rec.action_id, frm=rec.status, owner=owner,
                                       values=values, at=to_text(now))
            change = Change(rec.action_id, str(rec.status), str(rec.status), "waiting", reason,
                            values["next_check_at"], to_text(now), rec.provider, rec.operation,
                            seen)
            report.skipped.append(change)
            if self.on_check is not None:
                self._announce.append((self.on_check, change))

        self._write(write)

    # ------------------------------------------------------------ group commit
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; the hooks hear of its changes only once it committed."""
        try:
            with self.ledger.write() as c:
                yield c
        except BaseException:
            self._announce.clear()  # rolled back: nothing to announce
            raise
        announce, self._announce = self._announce, []
        for hook, change in announce:
            hook(change)

    def _write(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """Run one guarded write now (``run_ids``), or queue it for the batch's commit."""
        if not self._grouping:
            with self._tx() as c:
                fn(c)
            return
        if not self._queued:
            self._queued_since = time.monotonic()
        self._queued.append(fn)

    def _flush(self) -> None:
        """Commit every queued write in one transaction."""
        if not self._queued:
            return
        with self._tx() as c:
            self._run_queued(c)

    def _run_queued(self, c: sqlite3.Connection) -> None:
        """Run the queued writes inside a transaction the caller holds."""
        queued, self._queued = self._queued, []
        for fn in queued:
            fn(c)

    def _note(self, report: PassReport, change: Change) -> None:
        if change.at is None:
            change.at = to_text(self.clock.now())
        report.changes.append(change)
        if self.on_change is not None:
            self._announce.append((self.on_change, change))


def _auto_checkable(spec: OperationSpec, rec: ActionRecord) -> bool:
    return spec.queryable and not rec.requires_manual_verification


__all__ = ["DUE_STATUSES", "Change", "PassReport", "Reconciler"]
