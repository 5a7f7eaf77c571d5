"""What comes next for a record, and what a verdict or a retry would do to it, in
words every surface shows alike (the CLI's ``queue``/``show``, the console, the
service's API): the next step (``next_step``), whether a query can still settle it
(``queryable``), and the core's own rules asked without writing anything
(``resolvable``, ``retryable``), with what each previewed record becomes."""

from __future__ import annotations

import shlex
from typing import Any

from .display import ago, iso
from .selection import Target

RESOLVE_FLAGS = "--applied|--not-applied --reason …"


def next_step(rec: Any, now: Any = None) -> str:
    """What settles this record next, in words: an automatic check, or the command a
    person runs (ids shell-quoted, so the hint can be pasted).

    Without ``now``: the long form with ISO-8601 times and whole commands (JSON
    ``next``, ``show``). With ``now``: the short form for a table, with ages
    ('auto-check in 2m') and the command's name."""

    def at(t: str | None) -> str:
        if now is None:
            return f"at {iso(t)}"
        rel = ago(t, now)
        return rel if rel.startswith("in ") else "due"

    short = now is not None
    aid = shlex.quote(str(rec.action_id))
    resolve = f"settled resolve {aid} {RESOLVE_FLAGS}"
    if getattr(rec, "contradiction", None):
        return "needs a person" if short else f"needs a person: contradicted ({resolve})"
    if rec.status == "CONFIRMED":
        return "settled"
    if rec.status == "FAILED":
        return "settled retry" if short else f"settled retry {aid}"
    if rec.status == "PENDING":
        return "confirm/dispatch" if short else "waiting for confirm/dispatch"
    if rec.status == "IN_FLIGHT":
        if short:
            return f"dispatching (lease {at(rec.lease_expires_at)})"
        return f"dispatch in progress (lease until {iso(rec.lease_expires_at)})"
    if rec.requires_manual_verification:
        if rec.status == "AWAITING_VERIFICATION" and rec.eligible_at:
            if short:
                return f"needs a person {at(rec.eligible_at)}".replace(" due", "")
            return f"needs a person from {iso(rec.eligible_at)} ({resolve})"
        return "needs a person" if short else f"needs a person: {resolve}"
    if rec.next_check_at:
        if rec.lease_owner:
            return (
                "being checked"
                if short
                else f"being checked (lease until {iso(rec.next_check_at)})"
            )
        return f"auto-check {at(rec.next_check_at)}"
    if queryable(rec):  # its checks are over, but a query can still settle it
        return "settled reconcile" if short else f"settled reconcile {aid}"
    return "needs a person" if short else f"needs a person: {resolve}"


def queryable(rec: Any) -> bool:
    """Whether a query can observe the record's effect, by what it was recorded with
    (records stored before declarations were: a reconcilable tier has a query)."""
    declared = getattr(rec, "declared", None)
    if getattr(rec, "requires_manual_verification", False):
        return False
    if declared is not None:
        return bool(declared.queryable)
    return str(rec.tier) == "reconcilable"


def resolvable(rec: Any, applied: bool, now: Any) -> str:
    """Why a verdict cannot be recorded on this record now, or '' when it can: the
    core's own rule (``policy.resolution``), asked without writing anything."""
    from .policy import resolution

    if resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None:
        return ""
    if str(rec.status) == "AWAITING_VERIFICATION":
        return "verified automatically; wait or run `settled reconcile`"
    return f"{rec.status}: resolve applies to unresolved actions only"


def verdict_becomes(applied: bool, recheck: bool) -> Any:
    """The preview's "becomes" cell: the verdict's status, and whether a check of the
    provider comes first (rule 14: a not-applied verdict on a queryable operation)."""
    from .policy import recheck_needed

    verdict = "CONFIRMED" if applied else "FAILED"

    def cell(t: Target) -> str:
        rec = t.record
        if applied or not recheck or recheck_needed(rec, rec.declared):
            return verdict
        return f"{verdict} unless a check sees it"

    return cell


def retryable(rec: Any) -> str:
    """Why ``rec`` cannot be retried (the dispatcher's own rule), or ''."""
    from .dispatch import retry_problem

    problem: str = retry_problem(rec)
    return problem.removeprefix(f"action {rec.action_id} is ")


def next_attempt(recheck: bool) -> Any:
    from .policy import recheck_needed

    def cell(t: Target) -> str:
        rec = t.record
        attempt = f"attempt {rec.attempt + 1}"
        if not recheck or recheck_needed(rec, rec.declared):
            return attempt
        return f"{attempt} unless a check sees it"

    return cell


def allowed(rec: Any, now: Any) -> dict[str, Any]:
    """The verdicts the core would take on this record now (none is taken here), as
    the console's action page offers them."""
    from .dispatch import retry_problem
    from .policy import recheck_needed, resolution
    from .reconcile import why_unchecked

    def may_resolve(applied: bool) -> bool:
        return resolution(rec, applied=applied, reason="preview", by="preview", now=now) is not None

    return {
        "resolve_applied": may_resolve(True),
        "resolve_not_applied": may_resolve(False),
        "recheck_first": not recheck_needed(rec, rec.declared),
        "confirm": str(rec.status) == "PENDING",
        "retry": not retry_problem(rec),
        "retry_why": retry_problem(rec),
        "reconcile": queryable(rec) and not why_unchecked(rec, now),
    }
