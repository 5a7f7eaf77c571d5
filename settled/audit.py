"""The audit behind ``settled providers audit``: which operations would lie, and which
declared windows their own history contradicts.

Two parts per operation:

1. **Five questions** (docs/providers.md), answered from the operation's
   declaration and from what settled itself enforces:

   - ``q1`` Does the return value tell queued from applied?
   - ``q2`` If the effect is asynchronous, is there a way to reach a terminal state?
   - ``q3`` Is verification enforced before success?
   - ``q4`` Does a verification timeout surface as unresolved?
   - ``q5`` Is there one retry budget?

   An answer of ``no`` that matters for the tier is *completion-ownership debt*.
   ``manual`` means a person verifies, as declared (partial and blind tiers): honest,
   not debt, but said out loud. ``partly`` means it works except in a case named.

2. **Figures from the ledger** (aggregate SQL only; no record is loaded), and the
   contradictions between them and the declaration. What is counted:

   - ``first_seen``: seconds from dispatch to the first observation, for records
     confirmed by reconciliation (``dispatched_at`` → ``confirmed_at``); p50/p95 by
     nearest rank; ``late`` = those that needed more than one check, i.e. the effect
     was not visible when the consistency window ended.
   - ``unproven_replies``: 2xx replies to a ``full`` operation that did not prove the
     effect (outcome verdict ``accepted``): the tier's claim did not hold for them.
   - ``accepted_then_absent``: replies that accepted a request whose effect
     reconciliation later proved absent (same attempt).
   - ``budget_spent``: verifications that ran out of budget having seen nothing final.
   - ``found_by_person``: actions a person resolved as applied after the query had
     checked and not seen them: the query missed a real effect, or gave up too soon.

   settled never re-checks a ``CONFIRMED`` record, so a ``full`` reply that proved an
   effect which later vanished cannot be seen here; the contradictions above are the
   ones a ledger can show.

Nothing here imports the CLI; ``settled.cli.providers_cmd`` renders the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .model import Tier
from .providers.base import OperationSpec
from .storage import Figures, Ledger

if TYPE_CHECKING:
    from .callbacks.settings import CallbackConfig
    from .storage.ledger import CallbackFigures

MIN_EVIDENCE = 5  # records needed before history overrules a declaration
LATE_SHARE = 0.05  # share of late observations that makes a window too short
QUESTIONS = {
    "q1": "Does the return value tell queued from applied?",
    "q2": "If async, is there a way to reach a terminal state?",
    "q3": "Is verification enforced before success?",
    "q4": "Does a verification timeout surface as unresolved?",
    "q5": "Is there one retry budget?",
}


@dataclass
class Answer:
    question: str
    answer: str  # yes | no | partly | manual | n/a
    why: str
    debt: bool = False


@dataclass
class OperationAudit:
    provider: str
    operation: str
    spec: OperationSpec | None
    figures: Figures
    answers: list[Answer] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    callbacks: str | None = None  # how signed callbacks settle it (rule 16), in words

    @property
    def debt(self) -> bool:
        """Completion-ownership debt: an answer that matters for the tier is no, or the
        ledger holds terminal records that later evidence contradicts."""
        return any(a.debt for a in self.answers) or self.figures.contradictions > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "operation": self.operation,
            "declared": self.spec.to_json() if self.spec else None,
            "debt": self.debt,
            "answers": [
                {
                    "question": a.question,
                    "text": QUESTIONS[a.question],
                    "answer": a.answer,
                    "why": a.why,
                    "debt": a.debt,
                }
                for a in self.answers
            ],
            "figures": self.figures.to_json(),
            "suggestions": self.suggestions,
            "callbacks": self.callbacks,
        }


@dataclass
class AuditReport:
    operations: list[OperationAudit]
    # per provider with callbacks: the scheme, whether it is weaker (the body unsigned), and
    # the kept callbacks by state (pending ones name no record yet)
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def debt(self) -> list[str]:
        return [f"{o.provider}.{o.operation}" for o in self.operations if o.debt]

    def to_json(self) -> dict[str, Any]:
        return {
            "operations": [o.to_json() for o in self.operations],
            "debt": self.debt,
            "callbacks": self.callbacks,
        }


def settled_by_callbacks(spec: OperationSpec, cb: CallbackConfig) -> tuple[bool, str]:
    """Whether ``cb``'s callbacks can name this operation's actions, and how, in words."""
    how = cb.describe()
    if cb.names == "reconciliation_key" and not (spec.carries_key or spec.key_param):
        return False, (
            f"callbacks name reconciliation_key, but {spec.name} carries none: they can "
            f"never settle it ({how})"
        )
    if cb.names == "provider_object_id":
        return True, (
            f"settled by signed callbacks once its reply's object id is recorded; a lost "
            f"reply's callbacks wait (pending) ({how})"
        )
    return True, f"settled by signed callbacks ({how})"


def _with_callbacks(op: OperationAudit, cb: CallbackConfig) -> None:
    """What callbacks change in the answers: a manual tier's terminal state can be
    reached without a person when the provider reports it, signed."""
    assert op.spec is not None
    can, op.callbacks = settled_by_callbacks(op.spec, cb)
    if not can:
        op.suggestions.append(op.callbacks)
        return
    q2 = next(a for a in op.answers if a.question == "q2")
    if op.spec.tier in (Tier.PARTIAL, Tier.BLIND) or q2.answer in ("no", "partly"):
        weak = cb.weaker
        q2.answer, q2.debt = ("partly" if weak else "yes"), False
        q2.why = (
            f"a {cb.scheme} callback reports the terminal state ("
            + ("nothing signs the body: weaker" if weak else "signed, fresh, matched")
            + f"); {q2.why}"
        )
    if cb.weaker:
        op.suggestions.append(
            f"{op.provider}'s callbacks use the {cb.scheme} scheme (weaker): {cb.weakness}"
        )


# -- the questions -------------------------------------------------------------------------


def answer(spec: OperationSpec) -> list[Answer]:
    """The five answers a declaration gives, before any history."""
    tier = spec.tier
    if tier is Tier.FULL:
        q1 = (
            Answer("q1", "yes", f"the reply proves the effect only when: {spec.proof}")
            if spec.proof
            else Answer(
                "q1",
                "partly",
                "declared full, but the provider does not say what in its reply proves it",
            )
        )
        q2 = (
            Answer("q2", "yes", f"a lost or ambiguous reply is reconciled by: {spec.verifies}")
            if spec.queryable and (spec.carries_key or not spec.query_by_object_id)
            else Answer(
                "q2",
                "partly",
                "a lost or ambiguous reply can only be settled by a person (no query by key)",
            )
        )
        q3 = Answer(
            "q3", "yes", "CONFIRMED only on a reply that proves the effect, or an observation"
        )
    elif tier is Tier.RECONCILABLE:
        q1 = Answer("q1", "yes", "settled reads every reply as accepted only, never as applied")
        if not spec.queryable:
            q2 = Answer(
                "q2",
                "no",
                "declared reconcilable but has no query: nothing can reach a terminal state",
                True,
            )
        elif spec.query_by_object_id:
            q2 = Answer(
                "q2",
                "partly",
                "the query needs the id from the reply; a lost reply leaves it to a person",
            )
        else:
            q2 = Answer("q2", "yes", f"the verifier queries the real effect: {spec.verifies}")
        q3 = Answer("q3", "yes", "CONFIRMED only after the query observes the effect")
    elif tier is Tier.PARTIAL:
        q1 = Answer(
            "q1",
            "manual",
            "the reply proves delivery only (declared partial); settled never reads it as applied",
        )
        q2 = Answer(
            "q2", "manual", "past the window a person verifies (settled resolve); declared honestly"
        )
        q3 = Answer("q3", "manual", "a person attests before CONFIRMED; never automatic")
    else:
        q1 = Answer("q1", "manual", "nothing comes back (declared blind)")
        q2 = Answer(
            "q2", "manual", "no query: a person verifies (settled resolve); declared honestly"
        )
        q3 = Answer("q3", "manual", "a person attests before CONFIRMED; never automatic")
    if spec.queryable and tier in (Tier.FULL, Tier.RECONCILABLE) and not spec.predicate:
        # A ruler must measure the effect (rule 10): a query that only checks that a
        # resource exists confirms whatever answers 200 there.
        q3 = Answer(
            "q3",
            "partly",
            "the query has no predicate: any 2xx at its path counts as the effect; declare "
            "status/applied or a match so that only the effect itself confirms",
            True,
        )
    if tier in (Tier.FULL, Tier.RECONCILABLE) and spec.queryable:
        q4 = Answer(
            "q4",
            "yes",
            f"after verify deadline ({spec.verify_deadline:g} s) it becomes DENIED_UNRESOLVED, never CONFIRMED",
        )
    elif tier is Tier.BLIND:
        q4 = Answer("q4", "yes", "unresolved at once, until a person settles it")
    else:
        q4 = Answer(
            "q4", "yes", "whatever the reply leaves open becomes DENIED_UNRESOLVED for a person"
        )
    if spec.attempts <= 1:
        q5 = Answer("q5", "yes", "one try, in the dispatcher; nothing repeats")
    elif spec.dedupes_keys:
        q5 = Answer(
            "q5",
            "yes",
            f"{spec.attempts} tries in the dispatcher; ambiguous sends repeat with the same key, "
            "which the provider deduplicates",
        )
    else:
        q5 = Answer(
            "q5",
            "yes",
            f"{spec.attempts} tries in the dispatcher, only for sends that never connected (no key dedupe)",
        )
    return [q1, q2, q3, q4, q5]


def judge(op: OperationAudit) -> None:
    """Let history overrule the declaration where it contradicts it, and suggest."""
    spec, f = op.spec, op.figures
    if spec is None:
        op.suggestions.append(
            "not configured here: its records cannot be verified or audited against a declaration"
        )
        return
    q = {a.question: a for a in op.answers}
    manual = spec.tier in (Tier.PARTIAL, Tier.BLIND)
    if manual:
        op.suggestions.append(
            f"manual verification: every {spec.tier} action waits for a person (declared honestly)"
        )
    if spec.queryable and not manual and f.checked >= MIN_EVIDENCE and f.observed == 0:
        q["q2"].answer, q["q2"].debt = "no", True
        q["q2"].why = f"the query ran for {f.checked} action(s) and never observed anything final"
        op.suggestions.append(
            f"declared {spec.tier} but 0 of {f.checked} ever observed: is the query pointing at the real effect?"
        )
    replies = f.proven_replies + f.unproven_replies
    if (
        spec.tier is Tier.FULL
        and f.unproven_replies >= MIN_EVIDENCE
        and f.unproven_replies * 2 >= replies
    ):
        q["q1"].answer = "partly"
        q["q1"].why = f"{f.unproven_replies} of {replies} 2xx replies proved nothing"
        op.suggestions.append(
            f"declared full but {f.unproven_replies} of {replies} 2xx replies proved nothing: "
            "it behaves as reconcilable; declare it so, with a query"
        )
    if f.first_seen_p95 is not None and f.first_seen_n >= MIN_EVIDENCE:
        window = spec.consistency_window
        if f.first_seen_p95 > window and f.late >= max(1, LATE_SHARE * f.first_seen_n):
            op.suggestions.append(
                f"window {window:g} s but p95 visibility {f.first_seen_p95:.0f} s "
                f"({f.late} of {f.first_seen_n} not visible at the first check): raise "
                f"consistency_window to about {math.ceil(f.first_seen_p95)} s"
            )
        if f.first_seen_p95 > 0.8 * (window + spec.verify_deadline):
            op.suggestions.append(
                f"p95 visibility {f.first_seen_p95:.0f} s is close to the whole budget "
                f"(window {window:g} s + verify deadline {spec.verify_deadline:g} s): raise verify.deadline"
            )
    if f.budget_spent and spec.queryable:
        op.suggestions.append(
            f"{f.budget_spent} verification(s) ran out of budget ({spec.verify_deadline:g} s) seeing "
            "nothing final: raise verify.deadline, or check the query"
        )
    if f.found_by_person:
        op.suggestions.append(
            f"a person found {f.found_by_person} effect(s) applied that the query had not seen: "
            "check the query reads the real effect, or give it a longer budget"
        )
    if f.contradictions:
        op.suggestions.append(
            f"{f.contradictions} settled record(s) contradicted by a reply that came later: "
            "`settled queue --status all` shows them flagged; `settled resolve` each with what "
            "the provider holds (retry is blocked until then)"
        )
    if f.accepted_then_absent:
        op.suggestions.append(
            f"{f.accepted_then_absent} accepted request(s) never took effect: an acceptance is not success"
        )
    rate = f.unresolved_rate
    if not manual and rate is not None and f.total >= MIN_EVIDENCE and rate >= 0.2:
        hint = (
            "; the provider does not deduplicate keys, so ambiguous sends are never repeated: "
            "declare an idempotency header if it supports one"
            if not spec.dedupes_keys and f.ambiguous_sends
            else ""
        )
        op.suggestions.append(f"{rate:.0%} of actions are unresolved{hint}")


def audit(
    ledger: Ledger,
    specs: dict[tuple[str, str], OperationSpec],
    callbacks: Mapping[str, CallbackConfig] | None = None,
) -> AuditReport:
    """Audit every declared operation, and every operation the ledger has records of;
    ``callbacks`` (``Config.callbacks``) says which providers' callbacks settle them."""
    figs = ledger.figures()
    callbacks = callbacks or {}
    ops = []
    for key in sorted(set(specs) | set(figs)):
        spec = specs.get(key)
        op = OperationAudit(key[0], key[1], spec, figs.get(key, Figures()))
        if spec is not None:
            op.answers = answer(spec)
            if spec.tier is not Tier.FULL:
                op.figures.unproven_replies = 0  # "accepted" is all a non-full reply can say
        judge(op)
        if spec is not None and key[0] in callbacks:
            _with_callbacks(op, callbacks[key[0]])
        ops.append(op)
    return AuditReport(ops, _kept(ledger.callback_figures(), callbacks))


_NONE_KEPT = {"matched": 0, "pending": 0, "expired": 0, "oldest_pending": None}


def _kept(
    figures: Mapping[str, CallbackFigures], callbacks: Mapping[str, CallbackConfig]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for provider in sorted(set(figures) | set(callbacks)):
        cb = callbacks.get(provider)
        f = figures.get(provider)
        out[provider] = {
            "scheme": cb.scheme if cb else None,
            "weaker": cb.weaker if cb else False,
            **(f.to_json() if f else _NONE_KEPT),
        }
    return out


__all__ = [
    "QUESTIONS",
    "Answer",
    "AuditReport",
    "Figures",
    "OperationAudit",
    "audit",
    "settled_by_callbacks",
]
