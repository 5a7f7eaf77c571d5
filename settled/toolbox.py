"""The honest tool layer: what an agent's tool call does, and what reaches the model.

Every path an agent uses (the MCP server, ``settled.tool``, the JSON-schema specs)
goes through :class:`Toolbox`, whose calls each work in a
:class:`~settled.session.Session` of their own (from a pool, or opened for the call),
so that a tool call, a shell command and the daemon work on one ledger with one
claim. What the model reads is a :class:`ToolResult`, derived from the record
alone (``agent_status``):

    CONFIRMED                                   -> success    effect observed
    FAILED                                      -> failed     provably not applied
    DENIED_UNRESOLVED, or awaiting only a person -> uncertain  nobody can know now
    PENDING, IN_FLIGHT, AWAITING_VERIFICATION    -> accepted   not yet observed

No other path leads to ``success``: a 200 from the provider is ``accepted`` until some
layer observed the effect.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import intent
from .clock import from_text
from .errors import ConfigError, Conflict, InvalidInput, LedgerError, NotFound, OutcomeNotRecorded
from .model import MAX_ACTION_ID, ActionRecord, Status, Tier
from .model import check_action_id as model_check_action_id
from .session import Session
from .wait import only_a_person

if TYPE_CHECKING:
    from ..storage import Ledger

STATUSES = ("success", "accepted", "uncertain", "failed")
CHECK_ACTION = "check_action"
LIST_UNRESOLVED = "list_unresolved"

# What every result carries as structured content (docs/agents.md).
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action_id": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
        "settled_status": {"type": "string", "enum": [str(s) for s in Status]},
        "reason": {"type": "string"},
        "next_check_at": {"type": ["string", "null"]},
    },
    "required": ["action_id", "status", "settled_status", "reason", "next_check_at"],
}
QUEUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "actions": {"type": "array", "items": RESULT_SCHEMA},
    },
    "required": ["count", "actions"],
}
ACTION_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ACTION_ID,
    "description": (
        "Your id for this one intended action, e.g. 'order-42-receipt'. Calling again with "
        "the same id never sends twice: it returns the action's current status. Use a new "
        "id only for a new action, never to retry one that is accepted or uncertain."
    ),
}

_TIER_TEXT = {
    Tier.FULL: (
        "The provider's reply proves the effect{proof}: the result is 'success' only when that "
        "proof arrived. A lost or ambiguous reply gives 'uncertain' until reconciliation or a "
        "person settles it."
    ),
    Tier.RECONCILABLE: (
        "The reply only means accepted (queued), not done: the result says 'accepted' until "
        "settled observes the effect itself{verifies}, then 'success' ('failed' when it provably "
        "did not apply; 'uncertain' when verification runs out of time). Poll with check_action."
    ),
    Tier.PARTIAL: (
        "The provider's receipt proves delivery only, never the effect: the result says "
        "'accepted', then 'uncertain' until a person verifies it; it never becomes 'success' "
        "on its own."
    ),
    Tier.BLIND: (
        "Nothing can observe this effect (no receipt, no query): after sending, the result is "
        "'uncertain' until a person verifies it. It never becomes 'success' on its own."
    ),
}


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ToolResult:
    """What reaches the model: the five structured fields and one line of text.

    ``status`` is one of ``success`` (effect observed), ``accepted`` (not yet observed:
    check again later), ``uncertain`` (nobody can know now: a person or evidence must
    settle it) and ``failed`` (provably not applied)."""

    action_id: str
    status: str
    settled_status: str
    reason: str
    next_check_at: str | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "status": self.status,
            "settled_status": self.settled_status,
            "reason": self.reason,
            "next_check_at": self.next_check_at,
        }

    @property
    def done(self) -> bool:
        """True only when the effect was observed (the record is CONFIRMED)."""
        return self.status == "success"

    def __str__(self) -> str:
        return self.text


def agent_status(rec: ActionRecord) -> str:
    """success / accepted / uncertain / failed, from the record alone."""
    if rec.status is Status.CONFIRMED:
        return "success"
    if rec.status is Status.FAILED:
        return "failed"
    if rec.status is Status.DENIED_UNRESOLVED or only_a_person(rec):
        return "uncertain"
    return "accepted"


def result_for(rec: ActionRecord, note: str = "") -> ToolResult:
    """The result a model reads for ``rec``; ``note`` says what this call did."""
    status = agent_status(rec)
    when = f" (next automatic check at {rec.next_check_at})" if rec.next_check_at else ""
    if status == "success":
        reason = f"effect observed (confirmed by {rec.confirmed_by or 'verification'})"
        tail = reason
    elif status == "failed":
        reason = rec.reason or "provably not applied"
        tail = f"provably not applied: {reason}"
    elif status == "uncertain":
        reason = rec.reason or "outcome unknown"
        head = "" if reason.startswith("outcome unknown") else "outcome unknown: "
        tail = (
            f"{head}{reason}{when}; do not resend under a new action_id: a person or new "
            "evidence must settle it"
        )
    elif rec.status is Status.PENDING:
        reason = "awaiting a person's confirmation; nothing has been sent"
        if note:  # why it is still unsent belongs to the reason itself
            reason, note = f"{note}; it stays awaiting a person's confirmation", ""
        tail = f"{reason} (`settled confirm {rec.action_id}` sends it once)"
    elif rec.status is Status.IN_FLIGHT:
        reason = rec.reason or "being sent now"
        tail = f"being sent now; call check_action later{when}"
    else:
        reason = rec.reason or "accepted, not yet observed"
        after = f"after {rec.next_check_at}" if rec.next_check_at else "later"
        tail = f"{reason}; call check_action {after}"
    if note:
        tail = f"{note}; {tail}"
    text = one_line(f"{status}: {rec.provider}.{rec.operation} {rec.action_id} — {tail}")
    return ToolResult(
        rec.action_id, status, str(rec.status), one_line(reason), rec.next_check_at, text
    )


def one_line(text: str) -> str:
    """One line of plain text: whitespace runs become one space, and control or escape
    characters (from provider replies, say) are shown escaped, never interpreted."""
    flat = " ".join(text.split())
    if flat.isprintable():
        return flat
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in flat)


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Operation:
    """One configured operation as a tool."""

    name: str  # the tool's name: {provider}_{operation}
    provider: str
    operation: str
    spec: Any  # settled.providers.base.OperationSpec
    needs_confirmation: bool

    @property
    def tier(self) -> Tier:
        return Tier(self.spec.tier)

    @property
    def title(self) -> str:
        return str(getattr(self.spec, "title", "") or f"{self.provider}.{self.operation}")

    @property
    def destructive(self) -> bool:
        return bool(getattr(self.spec, "destructive", True))

    @property
    def params_schema(self) -> Mapping[str, Any] | None:
        schema = getattr(self.spec, "params_schema", None)
        return schema if isinstance(schema, Mapping) else None

    @property
    def action_key(self) -> str | None:
        """The intent key (rule 21): the action id is made from the params by it, and
        the tool takes no ``action_id``."""
        key = getattr(self.spec, "action_key", None)
        return key if isinstance(key, str) and key else None

    @property
    def person_only(self) -> bool:
        """Only a person may approve, through ``settled confirm``, the API or the
        console: no agent client or framework is asked (``approval = "person"``)."""
        return self.needs_confirmation and getattr(self.spec, "approval", "client") == "person"

    def action_id(self, given: Any, params: Mapping[str, Any]) -> str:
        """The action id of a call: made from ``params`` where the operation declares
        an action key (a ``given`` id must then be that one), else ``given``."""
        if self.action_key is None:
            return check_action_id(given)
        made = intent.intended_id(
            self.spec, params, None if given is None else check_action_id(given)
        )
        assert made is not None
        return made

    def description(self) -> str:
        """What the operation does (as declared) and what its tier can prove, in words."""
        own = str(getattr(self.spec, "description", "") or "").strip()
        head = own or f"Run {self.provider}.{self.operation} ({self.tier} tier)."
        proof = str(getattr(self.spec, "proof", "") or "")
        verifies = str(getattr(self.spec, "verifies", "") or "")
        tier = _TIER_TEXT[self.tier].format(
            proof=f" ({proof})" if proof else "",
            verifies=f" ({verifies})" if verifies else "",
        )
        parts = [head, tier]
        if self.person_only:
            parts.append(
                "A person must confirm each call through settled itself (`settled confirm`, "
                "its API or console) before anything is sent; no client can approve it: the "
                "result is 'accepted', awaiting that confirmation."
            )
        elif self.needs_confirmation:
            parts.append(
                "A person must confirm each call before anything is sent: the client is asked "
                "where it supports it; otherwise the result is 'accepted' awaiting confirmation."
            )
        if self.action_key:
            names = ", ".join(intent.required(intent.compiled(self.action_key)))
            parts.append(
                f"The action is named by its business arguments ({names}; action key "
                f"{self.action_key!r}): calling again with the same ones never sends twice, "
                "from any turn or agent; it returns the action's current status."
            )
        else:
            parts.append("The same action_id never sends twice.")
        parts.append(
            "Every result has status success | accepted | uncertain | failed; only 'success' "
            "means the effect was observed."
        )
        return " ".join(parts)

    def params_input_schema(self) -> dict[str, Any]:
        """The params' JSON schema as a tool shows it: the operation's own (or any
        object), with the params an action key is made from required."""
        params: dict[str, Any] = dict(self.params_schema or {"type": "object"})
        params.setdefault("description", f"Parameters of {self.provider}.{self.operation}.")
        if self.action_key:
            keyed = intent.required(intent.compiled(self.action_key))
            params["required"] = list(dict.fromkeys([*params.get("required", []), *keyed]))
        return params

    @property
    def arguments(self) -> set[str]:
        """The names a call of this tool may give."""
        return {"params"} if self.action_key else {"action_id", "params"}

    def input_schema(self) -> dict[str, Any]:
        """``{action_id, params}``; ``{params}`` alone where an action key names the
        action. Nothing in it can approve an action: approval is a person's."""
        params = self.params_input_schema()
        if self.action_key:
            return {
                "type": "object",
                "properties": {"params": params},
                "required": ["params"],
                "additionalProperties": False,
            }
        required = ["action_id"]
        if params.get("required"):
            required.append("params")
        return {
            "type": "object",
            "properties": {"action_id": ACTION_ID_SCHEMA, "params": params},
            "required": required,
            "additionalProperties": False,
        }


def needs_confirmation(spec: Any) -> bool:
    """Whether the operation declares that a person confirms each action before it is
    sent (``OperationSpec.needs_confirmation``; false when not declared)."""
    return bool(getattr(spec, "needs_confirmation", False))


_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(provider: str, operation: str) -> str:
    """``{provider}_{operation}``, in the characters every tool-calling API accepts."""
    return _NAME_BAD.sub("_", f"{provider}_{operation}")[:64]


def check_action_id(action_id: Any) -> str:
    return model_check_action_id(action_id, "action_id")


def check_arguments(args: Mapping[str, Any], allowed: set[str]) -> None:
    """A tool call names only its own arguments (models sometimes flatten params)."""
    extra = sorted(set(args) - allowed)
    if extra:
        hint = ' (operation parameters go inside "params")' if "params" in allowed else ""
        raise InvalidInput(f"unexpected argument {extra[0]!r}{hint}")


def check_params(op: Operation, params: Any) -> dict[str, Any]:
    """Params as a JSON object, checked against the operation's schema when it declares one."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidInput(f"params must be a JSON object, got {type(params).__name__}")
    from .dispatch import check_params_json

    check_params_json(params)  # strict JSON (no lone surrogate, NaN) and not too deep
    schema = op.params_schema
    if schema:
        try:
            from jsonschema import exceptions, validators
        except ImportError:
            raise InvalidInput(
                f"{op.provider}.{op.operation} declares a params schema; checking it needs "
                "jsonschema: pip install 'settled[mcp]'"
            ) from None
        cls = validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except exceptions.SchemaError as exc:
            raise ConfigError(
                f"providers.{op.provider}.operations.{op.operation}: params_schema is not a "
                f"valid JSON schema: {one_line(exc.message)[:300]}"
            ) from None
        try:
            error = exceptions.best_match(cls(schema).iter_errors(params))
        except RecursionError:
            raise InvalidInput(
                "params are nested too deeply to check against their schema"
            ) from None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            at = f" (at params/{where})" if where else ""
            raise InvalidInput(
                f"params do not match {op.provider}.{op.operation}'s schema: "
                f"{one_line(error.message)[:300]}{at}"
            )
    return params


# --------------------------------------------------------------------------- the toolbox


@dataclass(frozen=True)
class Submitted:
    result: ToolResult
    record: ActionRecord
    repeated: bool  # the action id was already recorded: this call sent nothing

    @property
    def awaiting_confirmation(self) -> bool:
        """The record is PENDING: a person must confirm it before anything is sent."""
        return self.record.status is Status.PENDING


class Toolbox:
    """The operations configured for this ledger, as tools.

    ``db`` and ``config_path`` are those of :class:`~settled.session.Session` (default:
    ``SETTLED_DB`` / ``SETTLED_CONFIG`` / ``./settled.toml``, like the CLI). ``confirm``
    names operations (``"provider.operation"``) that need a person's confirmation in
    addition to those whose declaration says so. ``migrate`` is the session's:
    ``False`` (``settled mcp``, ``settled serve``) refuses an older ledger with "run
    `settled migrate`" instead of migrating it as it opens.

    Each call works in a session of its own. With ``pool`` > 0, up to that many
    sessions are kept open (``prepare`` opens them all) and calls from several threads
    run side by side; with ``pool=0`` each call opens a session and closes it after.
    ``close`` closes the pool. A ledger that threads may share (PostgreSQL) is opened
    once and shared by the pool's sessions: the process holds the connections of one
    ledger (``[postgres] pool_max``), however many sessions run at once."""

    def __init__(
        self,
        *,
        db: str | None = None,
        config_path: str | None = None,
        actor: str = "agent",
        confirm: Iterable[str] = (),
        pool: int = 0,
        migrate: bool = True,
    ) -> None:
        self.db = db
        self.config_path = config_path
        self.migrate = migrate
        self.actor = actor
        self.confirm_ops = frozenset(confirm)
        self.pool = pool
        self._lock = threading.Condition()
        self._idle: list[Session] = []
        self._open = 0
        self._closed = False
        self._shared: Ledger | None = None  # the ledger the pool's sessions share

    def _new(self, create: bool) -> Session:
        s = Session(db=self.db, config_path=self.config_path, migrate=self.migrate)
        try:
            shared = self._shared
            if shared is not None:
                s.share(shared)
            elif s.ledger(create=create).thread_safe and self.pool > 0:
                with self._lock:
                    if self._shared is None:  # from now on the toolbox closes it, last
                        self._shared = s.hand_over()
        except BaseException:
            s.close()
            raise
        return s

    def shared_ledger(self) -> Ledger | None:
        """The ledger the pool's sessions share, once one is open (None: each has its
        own, as a SQLite session does)."""
        return self._shared

    def _take(self, create: bool) -> Session:
        if self.pool <= 0:
            return self._new(create)
        with self._lock:
            self._lock.wait_for(lambda: bool(self._idle) or self._open < self.pool)
            if self._idle:
                return self._idle.pop()
            self._open += 1
        try:
            return self._new(create=True)  # a pooled session serves writes as well
        except BaseException:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            raise

    def _give(self, s: Session) -> None:
        if self.pool <= 0:
            s.close()
            return
        with self._lock:
            if not self._closed:
                self._idle.append(s)
                self._lock.notify()
                return
            self._open -= 1
        s.close()

    @contextmanager
    def session(self, *, create: bool = False) -> Iterator[Session]:
        """A session with its ledger open (``create``: make the ledger when missing)."""
        s = self._take(create)
        try:
            yield s
        finally:
            self._give(s)

    @contextmanager
    def _declarations(self) -> Iterator[Session]:
        """Config and providers only: no ledger is opened."""
        with Session(db=self.db, config_path=self.config_path) as s:
            yield s

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for s in idle:
            s.close()
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.close()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ declarations
    def operations(self) -> list[Operation]:
        """Every configured operation, by tool name; a name two operations would share
        (or a read-only tool's name) is a config error."""
        out: dict[str, Operation] = {}
        with self._declarations() as s:
            reg = s.registry()
            for provider in reg.names():
                for operation, spec in sorted(reg.provider(provider).operations().items()):
                    name = tool_name(provider, operation)
                    other = out.get(name)
                    if other is not None or name in (CHECK_ACTION, LIST_UNRESOLVED):
                        taken = (
                            f"{other.provider}.{other.operation}" if other else "a read-only tool"
                        )
                        raise ConfigError(
                            f"{s.config().source or 'config'}: providers.{provider}: operation "
                            f"{operation!r} would be the tool {name!r}, like {taken}; rename one"
                        )
                    confirm = (
                        needs_confirmation(spec) or f"{provider}.{operation}" in self.confirm_ops
                    )
                    out[name] = Operation(name, provider, operation, spec, confirm)
        return list(out.values())

    def operation(self, provider: str, operation: str) -> Operation:
        with self._declarations() as s:
            spec = s.registry().operation(provider, operation)
        confirm = needs_confirmation(spec) or f"{provider}.{operation}" in self.confirm_ops
        return Operation(tool_name(provider, operation), provider, operation, spec, confirm)

    def prepare(self) -> str:
        """Create the ledger when missing and open the pool; return where the ledger is."""
        held = []
        try:
            for _ in range(max(1, self.pool)):
                held.append(self._take(create=True))
            return held[0].ledger_location()
        finally:
            for s in held:
                self._give(s)

    # ------------------------------------------------------------ acting
    def submit(self, op: Operation, action_id: Any, params: Any) -> Submitted:
        """Record the action and, unless a person must confirm it first, dispatch it
        (the claim makes a repeated id a no-op). A record left ``PENDING`` (this
        operation needs confirmation, or ``settled dispatch --needs-confirmation``
        recorded it) comes back with ``awaiting_confirmation``."""
        from .dispatch import Outcome

        if op.action_key is None:
            check_action_id(action_id)
        values = check_params(op, params)
        aid = op.action_id(action_id, values)
        with self.session(create=True) as s:
            try:
                report = s.dispatcher(self.actor).submit(
                    op.provider,
                    op.operation,
                    values,
                    action_id=aid,
                    needs_confirmation=op.needs_confirmation,
                )
            except Conflict:
                if op.action_key:  # the dispatcher's message names the intent
                    raise
                # the CLI's message names its flag; a model needs the field
                raise Conflict(
                    f"action_id {aid!r} is already used with different params; nothing was "
                    "sent. Use a new action_id only for a different action"
                ) from None
            except OutcomeNotRecorded as exc:  # sent: the answer is the record's
                held = _as_it_stands(s, exc)
                return Submitted(unrecorded_result(held, exc), held, False)
        rec = report.record
        assert rec is not None  # submit always returns the record it made or found
        # A new action was dispatched or recorded; any other outcome found an existing one.
        repeated = report.outcome not in (Outcome.DISPATCHED, Outcome.RECORDED)
        note = ""
        if repeated:
            what = "intent" if op.action_key else "action_id"
            note = f"repeated {what}: nothing sent again"
        result = result_for(rec, note)
        if op.person_only and rec.status is Status.PENDING:
            result = replace(result, text=f"{result.text}; {PERSON_ONLY_NOTE}")
        if op.action_key and rec.status is Status.FAILED:  # no new id can make a new try
            again = f"`settled retry {rec.action_id}` opens a new attempt of this intent"
            result = replace(result, text=f"{result.text}; {again}")
        return Submitted(result, rec, repeated)

    def existing(self, op: Operation, action_id: Any, params: Any) -> ActionRecord | None:
        """The record a call with these arguments would reach, if it exists already
        (nothing is recorded or sent); bad arguments raise as ``submit`` would."""
        values = check_params(op, params)
        aid = op.action_id(action_id, values)
        with self.session(create=True) as s:
            found: ActionRecord | None = s.ledger().find(aid)
        return found

    def confirm(
        self, action_id: str, *, by: str = "", params_hash: str | None = None
    ) -> ToolResult:
        """A person approved: the same atomic claim as ``settled confirm``; whoever
        loses the race sends nothing (rule 8 in docs/rules.md). ``params_hash`` binds
        the approval to the params the person was shown: other params need a new one."""
        from .dispatch import Outcome

        aid = check_action_id(action_id)
        with self.session() as s:
            try:
                report = s.dispatcher(by or f"{self.actor}-confirmation").confirm(
                    aid, params_hash=params_hash
                )
            except OutcomeNotRecorded as exc:  # sent: the answer is the record's
                return unrecorded_result(_as_it_stands(s, exc), exc, "confirmed and sent once")
        if report.record is None:
            raise NotFound(f"no action {aid!r}")
        notes = {
            Outcome.DISPATCHED: "confirmed and sent once",
            Outcome.IN_PROGRESS: "confirmed, but another caller had already claimed it: sent once",
            Outcome.ALREADY_COMPLETED: "already settled before this confirmation",
            Outcome.BLOCKED: "confirmation blocked: the prior dispatch is unresolved",
        }
        return result_for(report.record, notes.get(report.outcome, ""))

    def question(self, op: Operation, action_id: str) -> str:
        """What a person is asked before a recorded action is sent: the params as
        recorded (what will be sent), every character that is invisible or reorders
        text (control, bidi, zero-width, C1) written as its escape, and a note saying
        so; a person must read what is sent, not what it makes a screen show."""
        with self.session() as s:
            rec = _get(s.ledger(), check_action_id(action_id))
        return question_text(op, rec.action_id, rec.params)

    def settle(self, action_id: str, timeout: float) -> ToolResult:
        """Run verification in this process (``settled.wait``) until the action is
        settled, only a person can settle it, or ``timeout`` seconds have passed."""
        from .wait import wait_for

        with self.session() as s:
            rec = wait_for(s.reconciler(actor=f"{self.actor}-wait"), action_id, timeout)
        return result_for(rec)

    def settle_after(self, result: ToolResult, timeout: float) -> ToolResult:
        """``settle`` after a call that sent: a ledger that cannot be read or written
        now leaves ``result`` as it was (the daemon verifies later), never an error
        that would read as "not sent"."""
        try:
            return self.settle(result.action_id, timeout)
        except LedgerError as exc:
            why = one_line(str(exc).split("; ")[0])
            return replace(result, text=f"{result.text}; waiting stopped: {why}")

    def unconfirmed(self, action_id: str, why: str, *, by: str = "") -> ToolResult:
        """The record after a person did not approve it: the refusal is recorded (an
        event on the PENDING record) and nothing is sent."""
        with self.session() as s:
            _get(s.ledger(), check_action_id(action_id))
            report = s.dispatcher(by or f"{self.actor}-confirmation").decline(action_id, why)
        rec = report.record
        assert rec is not None
        if rec.status is not Status.PENDING:
            return result_for(rec, f"{why}, but another caller had already confirmed it")
        return result_for(rec, f"{why}: nothing was sent")

    # ------------------------------------------------------------ reading
    def check(self, action_id: Any) -> ToolResult:
        """The action's status now, after running its verification check when one is
        due: never sooner or more often than the record's schedule."""
        aid = check_action_id(action_id)
        with self.session() as s:
            ledger = s.ledger()
            rec = _get(ledger, aid)
            if _due(rec, ledger.clock().now()):
                s.reconciler(actor=f"{self.actor}-check").run_ids([aid])
                rec = ledger.get(aid)
        return result_for(rec)

    def unresolved(self, limit: int = 100) -> list[ToolResult]:
        """The queue: DENIED_UNRESOLVED actions, oldest first."""
        with self.session() as s:
            recs = s.ledger().query(statuses=[str(Status.DENIED_UNRESOLVED)], limit=limit)
        return [result_for(r) for r in recs]

    def queue_json(self, limit: int = 500) -> list[dict[str, Any]]:
        with self.session() as s:
            recs = s.ledger().query(statuses=[str(Status.DENIED_UNRESOLVED)], limit=limit)
        return [{**r.to_json(), "agent_status": agent_status(r)} for r in recs]

    def timeline(self, action_id: str) -> dict[str, Any]:
        """The record, its agent status and its events, oldest first."""
        aid = check_action_id(action_id)
        with self.session() as s:
            ledger = s.ledger()
            rec = _get(ledger, aid)
            events = ledger.events(aid)
        data = rec.to_json()
        data["agent_status"] = agent_status(rec)
        data["events"] = [e.to_json() for e in events]
        return data


def unrecorded_result(rec: ActionRecord, exc: OutcomeNotRecorded, note: str = "") -> ToolResult:
    """The result of a call whose request left but whose outcome could not be written:
    the record's, never "refused, nothing sent". The record stays IN_FLIGHT until its
    lease lapses; then reconciliation settles it (``accepted``: call check_action
    after ``next_check_at``), or, where no query can, a person (``uncertain``)."""
    cause = str(exc).split(": ", 1)[-1]  # without the leading "action ID: "
    if rec.status is not Status.IN_FLIGHT:  # another caller or a late write moved it on
        return result_for(rec, note)
    automatic = rec.declared is not None and rec.declared.queryable
    automatic = automatic and not rec.requires_manual_verification
    when = rec.lease_expires_at
    if automatic:
        status = "accepted"
        tail = f"call check_action after {when}" if when else "call check_action later"
    else:
        status = "uncertain"
        tail = (
            "nothing can observe the effect: a person or new evidence must settle it; "
            "do not resend under a new action_id"
        )
    reason = one_line(cause)
    text = one_line(
        f"{status}: {rec.provider}.{rec.operation} {rec.action_id} — "
        + (f"{note}; " if note else "")
        + f"{reason}; {tail}"
    )
    return ToolResult(rec.action_id, status, str(rec.status), reason, when, text)


def _as_it_stands(s: Session, exc: OutcomeNotRecorded) -> ActionRecord:
    """The record now, when the ledger can still be read; else as it was claimed."""
    try:
        found: ActionRecord | None = s.ledger().find(exc.action_id)
    except LedgerError:
        found = None
    rec = found or exc.record
    if rec is None:
        raise exc
    return rec


def _get(ledger: Any, action_id: str) -> ActionRecord:
    rec: ActionRecord | None = ledger.find(action_id)
    if rec is None:
        raise NotFound(f"no action {action_id!r} in this ledger")
    return rec


def _due(rec: ActionRecord, now: datetime) -> bool:
    """A check is due ``now`` (the ledger's clock): a lost dispatcher's lease, or a
    scheduled verification."""
    if rec.status not in (
        Status.IN_FLIGHT,
        Status.AWAITING_VERIFICATION,
        Status.DENIED_UNRESOLVED,
    ):
        return False
    due = from_text(rec.next_check_at)
    return due is not None and due <= now


def dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)


PERSON_ONLY_NOTE = (
    "only a person can approve it, through `settled confirm`, the API or the console; "
    "no client or tool input can"
)
QUESTION_PARAMS = 600  # characters of params a question shows
HIDDEN_NOTE = "(contains hidden control characters, shown escaped)"


def question_text(op: Operation, action_id: str, params: Any) -> str:
    """``Send {what} once, as action {id}? Params: {json}``, safe to show a person."""
    what = f"{op.provider}.{op.operation}"
    if op.title != what:
        what = f"{op.title} ({what})"
    shown = visible(dumps(params))
    if len(shown) > QUESTION_PARAMS:
        cut = re.sub(r"\\(u[0-9a-fA-F]{0,3})?$", "", shown[:QUESTION_PARAMS])
        shown = f"{cut}… ({len(shown) - len(cut)} more characters not shown)"
    texts = [what, action_id, *_strings(params)]
    note = f" {HIDDEN_NOTE}" if any(hidden(t) for t in texts) else ""
    return f"Send {visible(what)} once, as action {visible(action_id)}? Params: {shown}{note}"


def hidden(text: str) -> bool:
    """Whether ``text`` holds a character a person cannot see as itself: a control
    character (C0, DEL, C1), a bidi override or isolate, a zero-width or other format
    character, a line or paragraph separator."""
    return any(not ch.isprintable() and ch != " " for ch in text)


def visible(text: str) -> str:
    """``text`` with every hidden character written as a JSON escape (``\\u202e``;
    surrogate pairs beyond the BMP), so JSON text keeps its value and no character
    reorders or hides what is around it."""
    if not hidden(text):
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
            continue
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


__all__ = [
    "CHECK_ACTION",
    "LIST_UNRESOLVED",
    "QUEUE_SCHEMA",
    "RESULT_SCHEMA",
    "STATUSES",
    "Operation",
    "Submitted",
    "ToolResult",
    "Toolbox",
    "agent_status",
    "check_action_id",
    "check_arguments",
    "check_params",
    "hidden",
    "needs_confirmation",
    "one_line",
    "question_text",
    "result_for",
    "tool_name",
    "visible",
]
