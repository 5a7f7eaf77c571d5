"""What a provider is: a small object with declared operations, ``execute`` and,
where the tier allows, ``query``.

Providers report what happened *on the wire*; they never decide what it means for
the action and never retry. The dispatcher classifies (rule 3 in docs/rules.md) and owns
the one retry budget.

The wire's data types (``Request``, ``WireResult``, ``Wire``, ``QueryTarget``,
``Observation``, ``Seen``) are the model's vocabulary (``settled.model``), which the pure
policy reads; they are re-exported here because a provider plugin imports them with
``BaseProvider`` and ``OperationSpec``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..model import (
    DEFAULT_CONSISTENCY_WINDOW,
    DEFAULT_MIN_CHECKS,
    Observation,
    QueryTarget,
    Request,
    Seen,
    Tier,
    Wire,
    WireResult,
)


@dataclass(frozen=True)
class OperationSpec:
    """One operation's declarations. ``attempts`` is the whole retry budget for one
    attempt number; ``dedupes_keys`` says the provider deduplicates the idempotency
    key, which is the only case where an ambiguous send may be repeated."""

    name: str
    tier: Tier
    consistency_window: float = DEFAULT_CONSISTENCY_WINDOW
    attempts: int = 1
    dedupes_keys: bool = False
    timeout: float = 5.0
    verify_interval: float = 2.0
    verify_deadline: float = 300.0
    # Checks made, each verify_interval after the last, before the budget may be given up.
    verify_min_checks: int = DEFAULT_MIN_CHECKS
    queryable: bool = False  # has a query that reads the real effect
    carries_key: bool = False  # the request carries the reconciliation key
    snapshots: bool = False  # takes a pre-dispatch snapshot for attribution
    verifies: str = ""  # what observes the effect, in words (for `settled providers`)
    proof: str = ""  # full tier: what in the reply proves the effect, in words
    query_by_object_id: bool = False  # the query needs the id from the reply (lost with it)
    # s before the first repeat within the retry budget (doubles, capped); None = the
    # dispatcher's default.
    backoff: float | None = None
    # HTTP statuses that mean "this key may already be applied" (a conditional-write
    # conflict); the provider reports them as ``WireResult.conflict``, never as proof.
    conflict_statuses: tuple[int, ...] = ()
    destructive: bool = True  # MCP destructiveHint
    title: str = ""  # a human title
    description: str = ""  # what the operation does, in words
    params_schema: Mapping[str, Any] | None = None  # JSON schema of params, where declared
    # A person confirms each action before it is sent (agents ask through MCP
    # elicitation; elsewhere `settled confirm` sends it).
    needs_confirmation: bool = False
    # Who may give that confirmation: "client" (the agent's client or framework may ask
    # the person: MCP elicitation, an SDK's approval) or "person" (only `settled
    # confirm`, the API or the console; never anything an agent's client reports).
    approval: str = "client"
    # Rule 21: the action id is made from the business arguments by this template
    # (``settled.intent``), e.g. "receipt-{order_id}"; None: the caller names the action.
    action_key: str | None = None
    # The query can prove absence (a declared 404 or ``not_applied`` status). It counts
    # only after the record's landing time (rule 9 in docs/rules.md), which the core enforces.
    absence_proof: bool = False
    # The query proves the effect through an explicit predicate (a status in
    # ``applied``, or a match on the key). False: it only checks that one addressed
    # resource exists, which ``providers audit`` reports as debt (rule 10 in docs/rules.md).
    predicate: bool = False
    # The reconciliation key is this param's value (a business id such as an order
    # number), the same for every attempt, instead of a generated ``stl-…`` key.
    key_param: str | None = None
    # "hex": the generated reconciliation key is 32 lowercase hex characters instead of
    # ``stl-…``, for a provider that takes it as a client-chosen id of its own format.
    key_format: str | None = None
    # What proves the effect, what proves it absent, and what is taken as neither
    # (unknown), in words: `settled providers` and `providers audit` show them (rules
    # 19 and 20 in docs/rules.md).
    effect: str = ""
    absence: str = ""
    neither: str = ""

    @property
    def window(self) -> float:
        """The consistency window that applies: a full operation's reply is the proof,
        so it has none (its query, when any, runs at once)."""
        return 0.0 if self.tier is Tier.FULL else self.consistency_window

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.name,
            "tier": str(self.tier),
            "consistency_window": self.window,
            "attempts": self.attempts,
            "timeout": self.timeout,
            "dedupes_keys": self.dedupes_keys,
            "queryable": self.queryable,
            "verify_interval": self.verify_interval,
            "verify_deadline": self.verify_deadline,
            "verify_min_checks": self.verify_min_checks,
            "verifies": self.verifies,
            "proof": self.proof,
            "backoff": self.backoff,
            "predicate": self.predicate,
            "absence_proof": self.absence_proof,
            "key_param": self.key_param,
            "key_format": self.key_format,
            "proves_effect": self.effect,
            "proves_absence": self.absence,
            "proves_neither": self.neither,
            "needs_confirmation": self.needs_confirmation,
            "approval": self.approval if self.needs_confirmation else None,
            "action_key": self.action_key,
            "destructive": self.destructive,
        }


@runtime_checkable
class Provider(Protocol):
    name: str

    def operations(self) -> Mapping[str, OperationSpec]: ...

    def execute(self, request: Request) -> WireResult: ...

    def query(self, target: QueryTarget) -> Observation: ...

    def snapshot(self, operation: str, params: Any) -> Any: ...

    def close(self) -> None: ...


class Providers(Protocol):
    """What the core asks of a registry of providers (``settled.providers.Registry``)."""

    def operation(self, provider: str, operation: str) -> OperationSpec: ...

    def provider(self, name: str) -> Provider: ...

    def check_params(self, provider: str, operation: str, params: Any) -> None: ...


class BaseProvider(ABC):
    """Convenience base: subclasses declare their operations and implement
    ``execute``; by default there is no query, no snapshot and nothing to close."""

    name = "base"

    @abstractmethod
    def operations(self) -> Mapping[str, OperationSpec]:
        """Every operation's declarations, by name."""

    @abstractmethod
    def execute(self, request: Request) -> WireResult:
        """One try on the wire; report what happened, decide nothing, never retry."""

    def query(self, target: QueryTarget) -> Observation:
        return Observation(Seen.UNKNOWN, detail=f"{self.name}.{target.operation} has no query")

    def snapshot(self, operation: str, params: Any) -> Any:
        return None

    def close(self) -> None:
        return None


__all__ = [
    "BaseProvider",
    "Observation",
    "OperationSpec",
    "Provider",
    "Providers",
    "QueryTarget",
    "Request",
    "Seen",
    "Wire",
    "WireResult",
]
