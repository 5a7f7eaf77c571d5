"""A person's verdict and what follows it: ``POST /actions/{id}/resolve`` (rule 14's check
first), ``/retry`` (a new attempt, only from FAILED) and ``/reconcile`` (a check now),
each as ``settled resolve``, ``retry`` and ``reconcile`` do it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...resolve import resolve as do_resolve
from ..auth import name_problem
from ..problems import Problem
from .endpoint import CONFLICT, NOT_FOUND, RECORD_ANSWER, Call, Endpoint, respond
from .openapi import Operation

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session


async def resolve(call: Call) -> Response:
    body = await call.json("ResolveRequest")
    aid = call.action_id
    assert aid is not None
    by = body.get("by") or ""
    if by and name_problem(by):  # the actor is the token's; `by` only names a person
        raise Problem(422, f"by: {name_problem(by)}", action_id=aid)
    recheck = not body.get("no_recheck", False)  # rule 14: weighed against the world first

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = do_resolve(
            ledger,
            aid,
            applied=body["applied"],
            reason=body["reason"],
            by=by,
            via=call.actor,
            now=ledger.clock().now(),
            evidence=body.get("evidence"),
            object_id=body.get("object_id"),
            registry=s.registry(),
            recheck=recheck,
        )
        return rec.to_json()

    return respond(await call.run(work))


async def retry(call: Call) -> Response:
    body = await call.json("RetryRequest")
    aid = call.action_id
    assert aid is not None
    recheck = not body.get("no_recheck", False)  # rule 14: weighed against the world first
    report = await call.run(lambda s: s.dispatcher(call.actor).retry(aid, recheck=recheck))
    return respond(report.to_json())


async def reconcile(call: Call) -> Response:
    await call.json("Empty")
    aid = call.action_id
    assert aid is not None

    def work(s: Session) -> dict[str, Any]:
        report = s.reconciler(actor=call.actor).run_ids([aid])
        data: dict[str, Any] = report.to_json()
        data["record"] = s.ledger().get(aid).to_json()
        return data

    return respond(await call.run(work))


ENDPOINTS = [
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/resolve",
            "resolve",
            "Settle an action by a person's verdict",
            "As `settled resolve ID`: from DENIED_UNRESOLVED, from AWAITING_VERIFICATION when only a "
            "person can verify it, or on a contradicted settled record. The event records "
            "operator:BY via api:TOKEN (operator:api:TOKEN without `by`), and keeps `by` apart "
            "as `person`: `by` names a person, never a surface.",
            ("operate",),
            {
                RECORD_ANSWER[0]: ("The record after the verdict.", "Record"),
                **NOT_FOUND,
                **CONFLICT,
            },
            request="ResolveRequest",
            body_required=True,
        ),
        resolve,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/retry",
            "retry",
            "Open a new attempt of a FAILED action",
            "As `settled retry`: only from FAILED (new idempotency key ID:N+1), then dispatched; 409 "
            "from any other status or while a late reply contradicts the failure. The body may be empty.",
            ("operate",),
            {200: ("What the new attempt did.", "Report"), **NOT_FOUND, **CONFLICT},
            request="RetryRequest",
        ),
        retry,
    ),
    Endpoint(
        Operation(
            "POST",
            "/actions/{id}/reconcile",
            "reconcile",
            "Check an action against the provider now",
            "As `settled reconcile ID --json`: queries the real effect now, whatever the schedule, and "
            "returns the check's report and the record afterwards. The body may be empty.",
            ("operate",),
            {200: ("The check's report and the record.", "Reconciled"), **NOT_FOUND},
            request="Empty",
        ),
        reconcile,
    ),
]
