"""What every framework integration shares: the operations chosen, one call's
arguments, a send, and an approval's three moves.

A framework asks a person in its own way (``needs_approval``, ``ApprovalRequired``,
``interrupt()``, a hook's ``ask``); settled's part is the same in each:

    ask       record the action (PENDING, nothing sent) and say what the person is asked
              about (``Pending``), or, when nothing would be sent (the intent is already
              recorded past PENDING), the record's result
    approved  send it once, through the same claim as ``settled confirm``, only when it
              is the very record the person was shown (bound to its params_hash); a call
              whose record did not exist yet is asked about anew
    declined  the refusal, recorded as an event on the PENDING record; nothing is sent

An operation that declares ``approval = "person"`` is never approved by a framework:
its record waits for ``settled confirm``, the API or the console.

Errors raised before anything could be sent are ``SettledError`` (the framework's
"tool error" convention carries them to the model). An unexpected error is answered
from the record: the claim is committed before a request leaves, so no record means
nothing was sent, and a record is the truth (never "failed" because the tool broke).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..errors import InvalidInput, LedgerError, NotFound, SettledError
from ..model import Status, params_hash
from ..toolbox import (
    CHECK_ACTION,
    Operation,
    Toolbox,
    ToolResult,
    check_action_id,
    check_arguments,
    check_params,
    one_line,
    question_text,
    result_for,
)

T = TypeVar("T")

CHECK_DESCRIPTION = (
    "The current status of an action, by its action_id (runs its verification check when "
    "one is due; sends nothing). Status: success (effect observed), accepted (not yet "
    "observed: check again later), uncertain (nobody can know now: a person or evidence "
    "must settle it), failed (provably not applied)."
)
CHECK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"action_id": {"type": "string", "minLength": 1, "maxLength": 200}},
    "required": ["action_id"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Pending:
    """An action recorded and waiting for a person's approval: what they are shown."""

    action_id: str
    provider: str
    operation: str
    tier: str
    params: Any
    params_hash: str
    question: str
    result: ToolResult  # what the model reads while it waits

    def payload(self) -> dict[str, Any]:
        """What a framework carries to the person (an interrupt's value, metadata)."""
        return {
            "settled": "approval",
            "action_id": self.action_id,
            "operation": f"{self.provider}.{self.operation}",
            "tier": self.tier,
            "params": self.params,
            "params_hash": self.params_hash,
            "question": self.question,
        }


class Kit:
    """The configured operations (``operations`` names some, as ``"mail.send"``) as
    one framework's tools see them, over a :class:`Toolbox` of their own."""

    def __init__(
        self,
        *,
        config: str | None = None,
        db: str | None = None,
        operations: Iterable[str] | None = None,
        wait: float = 0.0,
        actor: str = "agent",
    ) -> None:
        if not (isinstance(wait, int | float) and 0 <= wait < float("inf")):
            raise InvalidInput(f"wait {wait!r}: must be a finite number of seconds >= 0")
        self.toolbox = Toolbox(db=db, config_path=config, actor=actor)
        self.wait = float(wait)
        found = {f"{op.provider}.{op.operation}": op for op in self.toolbox.operations()}
        if operations is None:
            chosen = list(found.values())
        else:
            names = [operations] if isinstance(operations, str) else list(operations)
            unknown = [n for n in names if n not in found]
            if unknown:
                raise InvalidInput(
                    f"operations: {unknown[0]!r} is not configured (configured: "
                    f"{', '.join(sorted(found)) or 'none'})"
                )
            chosen = [found[n] for n in dict.fromkeys(names)]
        self.ops: dict[str, Operation] = {op.name: op for op in chosen}

    # ------------------------------------------------------------ a call's parts
    def parse(self, op: Operation, arguments: Any) -> tuple[str, dict[str, Any]]:
        """The action id and params of one call, checked as ``settled mcp`` checks them."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            raise InvalidInput(f"arguments must be an object, got {type(arguments).__name__}")
        check_arguments(arguments, op.arguments)
        if op.action_key is None:
            check_action_id(arguments.get("action_id"))
        params = check_params(op, arguments.get("params"))
        return op.action_id(arguments.get("action_id"), params), params

    def needs_asking(self, op: Operation) -> bool:
        """The framework asks a person for this operation's calls."""
        return op.needs_confirmation and not op.person_only

    # ------------------------------------------------------------ moves
    def send(self, op: Operation, arguments: Any) -> ToolResult:
        """A call with no approval of the framework's: sent when the operation needs
        none; recorded, awaiting ``settled confirm``, when it does."""
        aid, params = self.parse(op, arguments)
        return self.guarded(aid, lambda: self.finish(self.toolbox.submit(op, aid, params).result))

    def ask(self, op: Operation, arguments: Any) -> Pending | ToolResult:
        """Record the action for a person's approval (nothing sent)."""
        aid, params = self.parse(op, arguments)
        submitted = self.toolbox.submit(op, aid, params)
        rec = submitted.record
        if rec.status is not Status.PENDING or not self.needs_asking(op):
            return submitted.result
        return Pending(
            rec.action_id,
            rec.provider,
            rec.operation,
            str(rec.tier),
            rec.params,
            rec.params_hash,
            question_text(op, rec.action_id, rec.params),
            submitted.result,
        )

    def approved(
        self, op: Operation, arguments: Any, *, shown: str | None = None, by: str = ""
    ) -> Pending | ToolResult:
        """A person approved this call: send it once, when its record is the one they
        were shown (``shown``: the params_hash they saw, where the framework carries
        it). A call whose record did not exist yet, or whose params are not those
        shown, is asked about anew (a ``Pending``)."""
        aid, params = self.parse(op, arguments)
        if not self.needs_asking(op):
            return self.send(op, arguments)
        rec = self.toolbox.existing(op, aid, params)
        if rec is None or (shown is not None and shown != params_hash(params)):
            return self.ask(op, arguments)  # the person never saw these params
        if rec.status is not Status.PENDING:
            return self.toolbox.submit(op, aid, params).result  # sent before: the record
        bound = rec.params_hash
        return self.guarded(
            aid, lambda: self.finish(self.toolbox.confirm(aid, by=by, params_hash=bound))
        )

    def declined(self, op: Operation, arguments: Any, why: str, *, by: str = "") -> ToolResult:
        """A person refused this call: the refusal is an event; nothing is sent."""
        aid, params = self.parse(op, arguments)
        if not op.needs_confirmation:
            raise InvalidInput(
                f"{op.provider}.{op.operation} needs no approval: nothing to decline"
            )
        rec = self.toolbox.existing(op, aid, params)
        if rec is None:
            self.toolbox.submit(op, aid, params)  # recorded (not sent), so the refusal is too
        return self.toolbox.unconfirmed(aid, why, by=by)

    def check(self, arguments: Any) -> ToolResult:
        if not isinstance(arguments, Mapping):
            raise InvalidInput("arguments must be an object with action_id")
        check_arguments(arguments, {"action_id"})
        return self.toolbox.check(arguments.get("action_id"))

    def existing(self, op: Operation, arguments: Any) -> Any:
        aid, params = self.parse(op, arguments)
        return self.toolbox.existing(op, aid, params)

    # ------------------------------------------------------------ after a send
    def finish(self, result: ToolResult) -> ToolResult:
        """``wait`` seconds of verification after a call that sent."""
        if self.wait > 0 and result.status == "accepted" and result.settled_status != "PENDING":
            return self.toolbox.settle_after(result, self.wait)
        return result

    def guarded(self, action_id: str, fn: Callable[[], ToolResult]) -> ToolResult:
        """``fn()``; an unexpected error is answered from the record (the claim is
        committed before a request leaves: no record, nothing sent)."""
        try:
            return fn()
        except SettledError:
            raise
        except Exception as exc:  # a bug: the model must still read the record's truth
            why = one_line(f"{type(exc).__name__}: {exc}")[:300]
            try:
                found = self._find(action_id)
            except LedgerError:
                return ToolResult(
                    action_id,
                    "uncertain",
                    str(Status.IN_FLIGHT),
                    f"internal error ({why}); whether the request left is unknown",
                    None,
                    f"uncertain: {action_id} — internal error ({why}); whether the request "
                    "left is unknown: do not resend; `settled show` tells",
                )
            if found is None:
                raise
            return result_for(found, f"internal error after recording ({why})")

    def _find(self, action_id: str) -> Any:
        with self.toolbox.session() as s:
            return s.ledger().find(action_id)


def pending_text(p: Pending, how: str) -> str:
    """What the model reads while a person is asked (nothing sent yet)."""
    return replace(
        p.result, text=f"{p.result.text}; a person is asked {how}: nothing is sent before"
    ).text


def error_text(exc: SettledError) -> str:
    """A refusal the model can act on: nothing was recorded or sent by this call."""
    line = one_line(str(exc))[:1000]
    if isinstance(exc, NotFound):
        return f"error: {line}"
    return f"error: {line} (nothing was sent by this call)"


__all__ = [
    "CHECK_ACTION",
    "CHECK_DESCRIPTION",
    "CHECK_SCHEMA",
    "Kit",
    "Pending",
    "error_text",
    "pending_text",
]
