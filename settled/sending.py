"""The words of a send, shared by the one-at-a-time path (``settled.dispatch``) and the
bulk path (``settled.bulk``): the dispatcher's settings, one claimed attempt on its way
(``Attempt``), what a call reports (``Report``: its ``Outcome`` and ``Result``), rule 8's
answers for a record this caller did not send (``as_found``), and the checks made before
anything is recorded or reopened. ``settled.dispatch`` re-exports the public ones; both
paths import them from here, so neither imports the other to share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from . import policy
from .errors import InvalidInput
from .model import ActionRecord, Declared, Move, Status, WireResult, canonical_json
from .policy import ReplyProof

DEFAULT_LEASE_GRACE = 30.0
DEFAULT_BACKOFF = 0.05  # s before the first repeat; doubles, capped at 2 s


class Outcome(StrEnum):
    """What a dispatch/confirm call did (rule 8 in docs/rules.md)."""

    DISPATCHED = "dispatched"
    RECORDED = "recorded"  # dispatch --needs-confirmation: waiting for confirm
    ALREADY_COMPLETED = "already_completed"
    IN_PROGRESS = "in_progress"
    BLOCKED = "blocked"
    NOT_FOUND = "not_found"


class Result(StrEnum):
    """The real result of a call this process made."""

    SUCCEEDED = "succeeded"  # CONFIRMED: the effect was observed
    ACCEPTED = "accepted"  # AWAITING_VERIFICATION: taken by the provider, not yet observed
    FAILED = "failed"  # FAILED: provably not applied
    UNRESOLVED = "unresolved"  # DENIED_UNRESOLVED: nobody knows yet


RESULT_BY_STATUS = {
    Status.CONFIRMED: Result.SUCCEEDED,
    Status.AWAITING_VERIFICATION: Result.ACCEPTED,
    Status.FAILED: Result.FAILED,
    Status.DENIED_UNRESOLVED: Result.UNRESOLVED,
}
EXISTS = "action already exists with the same params; nothing sent"


@dataclass
class Report:
    """A call's answer: the record as it now stands, what happened, and why."""

    outcome: Outcome
    record: ActionRecord | None
    result: Result | None = None
    message: str = ""
    action_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = (
            self.record.to_json() if self.record else {"action_id": self.action_id}
        )
        data["outcome"] = str(self.outcome)
        data["result"] = str(self.result) if self.result else None
        data["message"] = self.message
        return data


@dataclass
class Attempt:
    """One claimed attempt on its way: what its tries saw, for its outcome."""

    claimed: ActionRecord
    declared: Declared
    taken: policy.Claim
    verdicts: list[ReplyProof] = field(default_factory=list)
    tries: list[dict[str, Any]] = field(default_factory=list)
    wire: WireResult | None = None
    late_send: bool = False
    lapsed: bool = False
    held: bool = False  # a provider's Retry-After outlasted the lease: never started

    @property
    def verdict(self) -> ReplyProof:
        return policy.settle_verdict(self.verdicts)


@dataclass
class DispatchSettings:
    lease_grace: float = DEFAULT_LEASE_GRACE
    backoff: float = DEFAULT_BACKOFF
    group: int | None = None  # bulk: actions per claim transaction (None: settled.bulk's)
    # Providers whose callbacks are received (rule 16): once an outcome is written, the
    # callbacks kept for it meanwhile are matched at once (else by the next pass).
    callbacks: frozenset[str] = frozenset()


def retry_problem(record: ActionRecord) -> str:
    """Why ``record`` cannot be retried now (rule 6), or "" when it can."""
    aid = record.action_id
    if record.status is Status.DENIED_UNRESOLVED:
        return (
            f"action {aid} is DENIED_UNRESOLVED: the last attempt may have applied; "
            "run `settled reconcile` or `settled resolve` first"
        )
    if record.status is not Status.FAILED:
        return f"action {aid} is {record.status}; retry is allowed only from FAILED"
    if record.contradiction:
        return (
            f"action {aid} is FAILED, but later evidence contradicts it "
            f"({record.contradiction}); `settled resolve` it first"
        )
    return ""


def with_reason(move: Move, reason: str) -> Move:
    """``move`` with ``reason`` as the record's reason and in its event's detail."""
    values = {**move.values, "reason": reason}
    return replace(move, values=values, detail={**move.detail, "reason": reason})


def as_found(record: ActionRecord, msg: str) -> Report:
    """Rule 8's answers for a record this caller did not send."""
    if record.terminal:
        return Report(Outcome.ALREADY_COMPLETED, record, RESULT_BY_STATUS[record.status], msg)
    if record.status is Status.DENIED_UNRESOLVED:
        return Report(Outcome.BLOCKED, record, Result.UNRESOLVED, msg)
    return Report(Outcome.IN_PROGRESS, record, None, msg)


def check_params_json(params: Any) -> str:
    """Params as stored and sent: strict JSON (no NaN/Infinity, valid UTF-8), checked
    before anything is recorded, so that a request can never fail to encode after
    its claim."""
    try:
        text = canonical_json(params)
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidInput(f"params are not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("params are nested too deeply") from None
    return text


__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_LEASE_GRACE",
    "EXISTS",
    "RESULT_BY_STATUS",
    "Attempt",
    "DispatchSettings",
    "Outcome",
    "Report",
    "Result",
    "as_found",
    "check_params_json",
    "retry_problem",
    "with_reason",
]
