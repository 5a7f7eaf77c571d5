"""The domain: capability tiers, statuses on three axes, the dispatch strategy,
the action record, the one table of allowed status moves, the wire's data types (what
a provider is handed for one try and what it reports), and the ``Move`` that is the
one way a record changes.

Nothing here touches storage or the network; the pure policy (``settled.policy``)
speaks only in these words.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from .clock import plus
from .errors import InvalidInput, TransitionNotAllowed

DEFAULT_CONSISTENCY_WINDOW = 30.0
DEFAULT_MIN_CHECKS = 3  # checks made before a verification budget may be given up (rule 15)


class Tier(StrEnum):
    """What a provider operation can prove, declared at registration."""

    FULL = "full"  # delivery and acceptance, in the response
    RECONCILABLE = "reconcilable"  # nothing directly; state can be queried afterwards
    PARTIAL = "partial"  # delivery only; a person verifies acceptance
    BLIND = "blind"  # nothing: no receipt, no query


class Status(StrEnum):
    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    AWAITING_VERIFICATION = "AWAITING_VERIFICATION"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    DENIED_UNRESOLVED = "DENIED_UNRESOLVED"


class Delivery(StrEnum):
    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"  # provably not delivered
    UNKNOWN = "UNKNOWN"  # sent, no answer


class Acceptance(StrEnum):
    """Whether the effect happened. The stored and JSON values are the contract's
    (``ACCEPTED``/``REJECTED``); the names say what they mean, because "accepted"
    elsewhere means "taken by the provider, not yet observed"."""

    UNKNOWN = "UNKNOWN"
    APPLIED = "ACCEPTED"  # the effect was observed (or attested by a person)
    NOT_APPLIED = "REJECTED"  # provably not applied


class EventKind(StrEnum):
    """What an event in the append-only log records."""

    RECORDED = "recorded"  # the action was recorded (PENDING)
    CLAIMED = "claimed"  # the atomic claim: PENDING → IN_FLIGHT, committed before sending
    OUTCOME = "outcome"  # the dispatcher's classified reply
    LATE_OUTCOME = "late_outcome"  # a reply that came after the lease had lapsed
    LEASE_EXPIRED = "lease_expired"  # a dispatcher was lost: IN_FLIGHT → DENIED_UNRESOLVED
    RECONCILED = "reconciled"  # a query settled it
    UNRESOLVED = "unresolved"  # verification ended without proof, or only a person can tell
    RESOLVED = "resolved"  # a person's attested verdict
    RETRY = "retry"  # FAILED → PENDING: attempt N+1
    NOTE = "note"  # evidence that changes no status (a late reply to a settled record)
    CALLBACK = "callback"  # a provider's signed callback (rule 16); it may leave the status as is
    REDACTED = "redacted"  # a settled record's params values erased (a person's request)

    @property
    def changes_nothing(self) -> bool:
        """An event that records evidence without moving the record."""
        return self is EventKind.NOTE

    @property
    def may_stay(self) -> bool:
        """An event that may record evidence on a record whose status stays, a terminal
        one included, without being a move of the transition table."""
        return self is EventKind.CALLBACK


TERMINAL = frozenset({Status.CONFIRMED, Status.FAILED})
# What an erased value reads as, in params and wherever the evidence repeated it.
REDACTED = "[redacted]"
# The one table of allowed moves. A move to the same status records new evidence
# (a check that found nothing yet) without changing what people read.
TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.PENDING, Status.IN_FLIGHT),  # the atomic claim
        (Status.IN_FLIGHT, Status.CONFIRMED),  # full tier, the reply proves the effect
        (Status.IN_FLIGHT, Status.AWAITING_VERIFICATION),  # delivered/accepted, verify later
        (Status.IN_FLIGHT, Status.FAILED),  # rejected, or never sent within the budget
        (Status.IN_FLIGHT, Status.DENIED_UNRESOLVED),  # ambiguous outcome, blind, lost lease
        (Status.AWAITING_VERIFICATION, Status.AWAITING_VERIFICATION),
        (Status.AWAITING_VERIFICATION, Status.CONFIRMED),
        (Status.AWAITING_VERIFICATION, Status.FAILED),
        (Status.AWAITING_VERIFICATION, Status.DENIED_UNRESOLVED),
        (Status.DENIED_UNRESOLVED, Status.DENIED_UNRESOLVED),
        (Status.DENIED_UNRESOLVED, Status.CONFIRMED),
        (Status.DENIED_UNRESOLVED, Status.FAILED),
        (Status.FAILED, Status.PENDING),  # retry: attempt N+1, new idempotency key
    }
)


# A person's verdict may correct a terminal status that later evidence contradicts
# (a reply that proves the effect arrived after the record was FAILED): only by
# ``resolve``, and only on a record flagged with that contradiction.
CORRECTIONS: frozenset[tuple[Status, Status]] = frozenset(
    {(Status.FAILED, Status.CONFIRMED), (Status.CONFIRMED, Status.FAILED)}
)

# Evidence may correct a FAILED record the other way: a query that observes the effect
# of the attempt that FAILED (the check made before a person's "not applied" verdict is
# acted on, rule 14) outweighs the verdict. Only a ``reconciled`` event makes it, only
# on the same attempt, and never the reverse: an absence never undoes an observation.
EVIDENCE_CORRECTIONS: frozenset[tuple[Status, Status]] = frozenset(
    {(Status.FAILED, Status.CONFIRMED)}
)


def check_transition(
    frm: Status, to: Status, *, correction: bool = False, by_evidence: bool = False
) -> None:
    if (frm, to) in TRANSITIONS or (correction and (frm, to) in CORRECTIONS):
        return
    if by_evidence and (frm, to) in EVIDENCE_CORRECTIONS:
        return
    raise TransitionNotAllowed(f"{frm} → {to} is not an allowed move")


def new_reconciliation_key(key_format: str | None = None) -> str:
    """A new reconciliation key: ``stl-`` and 32 hex characters; only the 32 lowercase
    hex characters for an operation whose provider takes the key as an id of its own
    format (``key_format = "hex"``: Google Calendar's event ids are base32hex)."""
    return uuid.uuid4().hex if key_format == "hex" else "stl-" + uuid.uuid4().hex


@dataclass(frozen=True)
class DispatchStrategy:
    """Fixed and stored before any request leaves."""

    tier: Tier
    reconciliation_key: str | None
    eligible_at: datetime | None  # None: never eligible for automatic checks
    requires_manual_verification: bool


def build_strategy(
    tier: Tier | str,
    now: datetime,
    window: float = DEFAULT_CONSISTENCY_WINDOW,
    *,
    carries_key: bool = False,
    key: str | None = None,
    key_format: str | None = None,
) -> DispatchStrategy:
    """The strategy each tier gets (docs/rules.md), with one addition: a ``full`` operation that can carry a key
    (``carries_key``, e.g. a CalDAV UID) gets one, so that a reply lost on the wire can
    still be reconciled instead of waiting for a person."""
    tier = Tier(tier)
    if window < 0:
        raise ValueError("consistency window must be >= 0")
    if tier is Tier.FULL:
        k = (key or new_reconciliation_key(key_format)) if carries_key else None
        return DispatchStrategy(tier, k, now, False)
    if tier is Tier.RECONCILABLE:
        k = key or new_reconciliation_key(key_format)
        return DispatchStrategy(tier, k, plus(now, window), False)
    if tier is Tier.PARTIAL:
        k = key or new_reconciliation_key(key_format)
        return DispatchStrategy(tier, k, plus(now, window), True)
    return DispatchStrategy(tier, None, None, True)


MAX_ACTION_ID = 200  # characters


def action_id_problem(action_id: object, what: str = "action id") -> str:
    """Why ``action_id`` cannot name an action ("" when it can): a string of 1-200
    printable characters without surrounding spaces (it is shown, logged, put in an
    idempotency key and typed back by people)."""
    if (
        not isinstance(action_id, str)
        or not action_id
        or len(action_id) > MAX_ACTION_ID
        or not action_id.isprintable()
        or action_id != action_id.strip()
    ):
        return (
            f"{what} must be a string of 1-{MAX_ACTION_ID} printable characters without "
            "surrounding spaces"
        )
    return ""


def check_action_id(action_id: object, what: str = "action id") -> str:
    """``action_id``, or ``InvalidInput`` saying why it cannot name an action."""
    problem = action_id_problem(action_id, what)
    if problem:
        raise InvalidInput(problem)
    assert isinstance(action_id, str)
    return action_id


def idempotency_key(action_id: str, attempt: int) -> str:
    return f"{action_id}:{attempt}"


@dataclass(frozen=True)
class Declared:
    """What an operation declared when an action was recorded: its tier and every
    setting that decides how the action is sent and verified. Stored with the action,
    it governs the action for life; a later config change affects new actions only.

    ``backoff`` is None when the operation left it to the dispatcher's default."""

    tier: Tier
    consistency_window: float = DEFAULT_CONSISTENCY_WINDOW
    attempts: int = 1
    timeout: float = 5.0
    dedupes_keys: bool = False
    backoff: float | None = None
    verify_interval: float = 2.0
    verify_deadline: float = 300.0
    # Rule 15: given up only after this many checks, each at least verify_interval after
    # the one before. Records stored before it existed read as the default.
    verify_min_checks: int = DEFAULT_MIN_CHECKS
    queryable: bool = False
    carries_key: bool = False
    snapshots: bool = False
    query_by_object_id: bool = False
    key_param: str | None = None  # the reconciliation key is this param's value
    key_format: str | None = None  # "hex": generated keys without the ``stl-`` prefix

    @classmethod
    def of(cls, spec: Any) -> Declared:
        """The declarations of an operation spec (``providers.base.OperationSpec``)."""
        return cls(
            tier=Tier(spec.tier),
            consistency_window=float(spec.consistency_window),
            attempts=int(spec.attempts),
            timeout=float(spec.timeout),
            dedupes_keys=bool(spec.dedupes_keys),
            backoff=getattr(spec, "backoff", None),
            verify_interval=float(spec.verify_interval),
            verify_deadline=float(spec.verify_deadline),
            verify_min_checks=int(getattr(spec, "verify_min_checks", DEFAULT_MIN_CHECKS)),
            queryable=bool(spec.queryable),
            carries_key=bool(spec.carries_key),
            snapshots=bool(spec.snapshots),
            query_by_object_id=bool(spec.query_by_object_id),
            key_param=getattr(spec, "key_param", None),
            key_format=getattr(spec, "key_format", None),
        )

    def to_json(self) -> dict[str, Any]:
        # Every field is a scalar: no deep copy (``asdict``), which cost ≈ 50 µs per record.
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), StrEnum) else v)
            for f in fields(self)
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Declared:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "tier": Tier(known["tier"])})

    def differences(self, other: Declared) -> list[str]:
        """``key: stored → now`` for every declaration that differs from ``other``."""
        mine, theirs = self.to_json(), other.to_json()
        return [f"{k}: {mine[k]} → {theirs[k]}" for k in mine if mine[k] != theirs[k]]


# A record field that the ledger keeps but that is no part of its public JSON.
_INTERNAL = {"internal": True}


@dataclass
class ActionRecord:
    """One action as the ledger holds it. Times are stored text (``clock.to_text``).

    ``lands_by`` is the last moment this attempt's request could reach the provider
    (its claim plus the whole request budget plus grace: the dispatcher never starts
    a request after its lease lapses); an absence observed before it proves nothing.
    ``contradiction`` says why later evidence disagrees with a terminal status; it
    blocks ``retry`` until a person resolves it. ``declared`` is the operation's
    declarations when the action was recorded (None on records older than that).

    ``checks`` counts every attempt to check the record; ``counted_checks`` those that
    spend its verification budget (rule 15: each at least ``verify_interval`` after the
    one before, so an early forced check does not count). ``check_error`` says why the
    last attempt could not check anything (the provider unreachable or unusable); a
    check that got an answer clears it."""

    action_id: str
    provider: str
    operation: str
    params: Any
    params_hash: str
    tier: Tier
    reconciliation_key: str | None
    eligible_at: str | None
    requires_manual_verification: bool
    attempt: int
    idempotency_key: str
    dispatch_id: str | None
    provider_object_id: str | None
    status: Status
    delivery: Delivery
    acceptance: Acceptance
    dispatched_at: str | None
    confirmed_at: str | None
    confirmed_by: str | None
    created_at: str
    updated_at: str
    lease_owner: str | None = None
    lease_expires_at: str | None = None
    next_check_at: str | None = None
    verify_started_at: str | None = field(default=None, repr=False, metadata=_INTERNAL)
    verify_deadline_at: str | None = None
    checks: int = 0
    reason: str | None = None
    snapshot: Any = field(default=None, repr=False, metadata=_INTERNAL)
    lands_by: str | None = None
    contradiction: str | None = None
    declared: Declared | None = None
    counted_checks: int = 0
    check_error: str | None = None
    # Why the record's outcome is open, as a stable code (``settled.cause``), set at the
    # attempt's first unknown outcome and kept through every later check.
    cause: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in RECORD_FIELDS}
        d["declared"] = self.declared.to_json() if self.declared is not None else None
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in d.items()}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


# Public JSON fields of a record, in the contract's order: the fields of ``ActionRecord``
# (whose order is also the ledger's column order, ``storage.columns``), less the internal.
RECORD_FIELDS = tuple(f.name for f in fields(ActionRecord) if not f.metadata.get("internal"))


MAX_NAME = 100  # characters of a person's name: typed at login, from a proxy, --by, `by`
VIA = " via "  # separates the person from the surface that vouched: operator:NAME via api:TOKEN


def name_problem(name: str) -> str:
    """Why ``name`` cannot name a person in the ledger ("" when it can): the CLI's
    ``--by`` (or ``SETTLED_OPERATOR``), the console's login name, a trusted proxy's user
    header and the API's ``by`` alike. A person's name stands before `` via `` in an
    event's actor, so it can never hold that separator (``alice via ui:token:reader:…``
    would read as another surface's session), nor a control, format or other invisible
    character."""
    if not name or name != name.strip() or len(name) > MAX_NAME or not name.isprintable():
        return f"a name is 1-{MAX_NAME} printable characters without surrounding spaces"
    if VIA in name:
        return "a name must not contain ' via ' (it separates the person from the session)"
    return ""


@dataclass(frozen=True)
class Event:
    id: int
    action_id: str
    at: str
    actor: str
    kind: str
    from_status: str | None
    to_status: str
    attempt: int
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Reported(StrEnum):
    """What a provider's callback reports, by the predicates its config declares
    (``applied``, ``not_applied``, ``delivered``); fixed when the callback is received."""

    APPLIED = "applied"  # the provider reports the effect
    NOT_APPLIED = "not_applied"  # the provider reports the effect did not happen
    DELIVERED = "delivered"  # delivery only: it proves nothing about acceptance
    OTHER = "other"  # none holds (queued, a temporary failure), or two disagree: evidence only


# Record fields a callback may name its action by (``[providers.NAME.callbacks] names``).
CALLBACK_NAMES = ("provider_object_id", "reconciliation_key", "action_id")


@dataclass(frozen=True)
class Callback:
    """One verified callback event, as the ledger keeps it (rule 16). ``names`` is the
    record field the callback names its action by and ``key`` the value it gives;
    ``status`` the reported value as text and ``reported`` what it means. Neither the
    secret nor the body is kept: only the body's sha256 (``digest``) and, for a batch,
    the event's index in it (``item``)."""

    provider: str
    event_id: str
    scheme: str
    names: str
    key: str
    status: str
    reported: Reported
    digest: str
    received_at: str
    expires_at: str
    item: int | None = None

    def detail(self) -> dict[str, Any]:
        """The evidence an event on the record carries."""
        return {
            "scheme": self.scheme,
            "event_id": self.event_id,
            "names": self.names,
            "key": self.key,
            "status": self.status,
            "reported": str(self.reported),
            "body_sha256": self.digest,
            "item": self.item,
        }


@dataclass(frozen=True)
class PendingCallback:
    """A kept callback that has not been matched yet: ``action_id`` and ``attempt``
    are set once it is bound to a record that was in flight when it came."""

    callback: Callback
    action_id: str | None = None
    attempt: int | None = None
    tries: int = 0


# JSON encoders made once: ``json.dumps`` with any keyword argument builds a new
# encoder on every call, and an action's params are encoded several times on its way.
_HASHED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, allow_nan=False)


def params_hash(params: Any) -> str:
    import hashlib  # here, not at the top: OpenSSL's import is a read command's 5 ms

    return hashlib.sha256(_HASHED.encode(params).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """``value`` as strict JSON text with sorted keys (no NaN or Infinity: ValueError):
    the params as they are stored and sent."""
    return _CANONICAL.encode(value)


# ------------------------------------------------------------------ the wire's vocabulary
# What a provider is handed for one try and what it reports back: plain data the policy
# reads. Providers (``settled.providers.base``) re-export these names for plugins.


@dataclass(frozen=True)
class Request:
    """Everything a provider may put on the wire for one try."""

    action_id: str
    operation: str
    params: Any
    idempotency_key: str
    reconciliation_key: str | None
    attempt: int
    # The TOTAL deadline of this try in seconds: connect, write and read together.
    timeout: float
    # A ``settled.clock.steady()`` instant after which the request must not start to
    # be written (the dispatcher's lease lapses then); None = no limit. The steady
    # clock counts time suspended: a machine that slept past the lease sends nothing.
    send_by: float | None = None


class Wire(StrEnum):
    NOT_CONNECTED = "not_connected"  # nothing left this machine (refused, DNS)
    NO_ANSWER = "no_answer"  # sent (or maybe sent), no answer: timeout, reset, drop
    ANSWERED = "answered"  # a status line came back


@dataclass(frozen=True)
class WireResult:
    """What happened on the wire. ``applied`` is the provider's reading of the body:
    True when the reply itself proves the effect (a booking id), False when the body
    says it was not applied, None when the body proves nothing. A conflict (``conflict``)
    is never proof: it says an earlier try *may* have applied, and the query decides."""

    wire: Wire
    status_code: int | None = None
    object_id: str | None = None
    applied: bool | None = None
    detail: str = ""
    # A declared conditional-write conflict (409/412 on a create with the same key):
    # "an earlier try may have applied this"; never proof, the query must verify it.
    conflict: bool = False
    # ``settled.clock.steady()`` when the request started to be written; None = nothing was.
    written_at: float | None = None
    # Seconds from a ``Retry-After`` header on a 429 or 503 reply.
    retry_after: float | None = None
    # The reply is an error the operation declared may come after the effect (Slack's
    # ``internal_error``): it proves neither the effect nor its absence (rule 20).
    maybe_applied: bool = False


class Seen(StrEnum):
    APPLIED = "applied"  # the effect is there and attributable to this action
    NOT_APPLIED = "not_applied"  # proof it is not and will not be (bounce, 404 = absent)
    NOT_YET = "not_yet"  # nothing visible yet
    AMBIGUOUS = "ambiguous"  # something changed but it cannot be attributed
    UNKNOWN = "unknown"  # the query itself failed


@dataclass(frozen=True)
class QueryTarget:
    action_id: str
    operation: str
    params: Any
    reconciliation_key: str | None
    provider_object_id: str | None
    snapshot: Any
    attempt: int


@dataclass(frozen=True)
class Observation:
    seen: Seen
    object_id: str | None = None
    detail: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    by_absence: bool = False  # NOT_APPLIED concluded from absence (404, no match), not a status


# ------------------------------------------------------------------ the one way a record changes


# Fields fixed when a record is written: no ``Move`` may set them (``updated_at`` is set
# by every move itself, from its time).
FIXED = frozenset(
    {
        "action_id",
        "provider",
        "operation",
        "params",
        "params_hash",
        "tier",
        "requires_manual_verification",
        "created_at",
        "updated_at",
        "declared",
    }
)
# Columns a move may set: every other field of the record. Names never come from user
# input, and this set keeps it so.
WRITABLE = frozenset(f.name for f in fields(ActionRecord)) - FIXED


@dataclass(frozen=True)
class Move:
    """A guarded change to one record, and the event that records it.

    It applies only while the record is in ``frm`` (and, when given, leased to
    ``owner`` and at ``attempt``). ``kind`` None is a change of schedule only (``to``
    must equal ``frm``): no event. A ``NOTE`` appends evidence without moving the
    record. ``correction`` marks a person's verdict on a contradicted terminal
    record (``CORRECTIONS``); ``by_evidence`` an observation that outweighs a
    FAILED status (``EVIDENCE_CORRECTIONS``, guarded on the attempt)."""

    action_id: str
    frm: Status
    to: Status
    at: str
    actor: str
    kind: EventKind | None
    values: Mapping[str, Any] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)
    owner: str | None = None
    attempt: int | None = None
    correction: bool = False
    by_evidence: bool = False
    amends: bool = False  # a correction of a person's own verdict: guarded on the attempt

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind.may_stay and self.frm is self.to:
            pass  # evidence on a record that stays where it is (a terminal one included)
        elif self.kind is None or self.kind.changes_nothing:
            if self.frm is not self.to:
                raise ValueError(
                    f"{self.kind or 'a schedule change'} cannot move {self.frm} → {self.to}"
                )
        else:
            check_transition(
                self.frm, self.to, correction=self.correction, by_evidence=self.by_evidence
            )
            if self.amends and (not self.correction or self.attempt is None):
                raise ValueError("an amendment is a correction guarded on one attempt")
            if self.by_evidence and (self.kind is not EventKind.RECONCILED or self.attempt is None):
                raise ValueError("a correction by evidence is a reconciled move on one attempt")
        bad = set(self.values) - WRITABLE
        if bad:
            raise ValueError(f"not writable: {sorted(bad)}")
