"""A verdict on everything a filter selects, as ``settled resolve``/``retry``/``reconcile``
by selectors do it: a preview of exactly which records change (the CLI's plan: each
record with why it is left alone, and what each becomes), then, once the person typed
their number, one checked move per record. The preview is sealed (an HMAC of its ids
in order, bound to the session): when the selection changed meanwhile, nothing is done
and the new preview is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .console import Refused, Visit, form_of
from .console_views import Filter
from .sessions import Person

if TYPE_CHECKING:
    from starlette.responses import Response

    from ..session import Session

MAX_BULK = 10_000  # records one bulk verdict may change: narrow the filter for more
DOS = {
    "resolve_applied": "Resolve as applied",
    "resolve_not_applied": "Resolve as not applied",
    "retry": "Retry (new attempt)",
    "reconcile": "Check with the provider now",
}


# ------------------------------------------------------------------ bulk


@dataclass
class Bulk:
    """A verdict on everything a filter selects: the targets and what each becomes."""

    do: str
    recheck: bool
    targets: list[Any]
    becomes: dict[str, str]
    total: int

    @property
    def ids(self) -> list[str]:
        return [t.action_id for t in self.targets if not t.skip]


def plan_bulk(s: Session, filt: Filter, do: str, recheck: bool) -> Bulk:
    """The CLI's plan for this verdict on the filter's selection (``select.plan``'s
    rules: each record with why it is left alone, oldest first)."""
    from ..cli.select import Target
    from ..cli.verdicts import next_attempt, resolvable, retryable, verdict_becomes
    from ..reconcile import why_unchecked

    if do not in DOS:
        raise Refused(422, f"choose what to do: {', '.join(DOS)}")
    ledger = s.ledger()
    now = ledger.clock(anchor=False).now()
    sel = filt.selection(s, now)
    rows = ledger.records(replace(sel, limit=MAX_BULK + 1))
    if len(rows) > MAX_BULK:
        raise Refused(422, f"the filter selects more than {MAX_BULK} actions: narrow it")
    why: Callable[[Any], str]
    becomes: Callable[[Any], str]
    if do.startswith("resolve"):
        applied = do == "resolve_applied"
        why, becomes = (lambda r: resolvable(r, applied, now)), verdict_becomes(applied, recheck)
    elif do == "retry":
        why, becomes = retryable, next_attempt(recheck)
    else:
        why, becomes = (lambda r: str(why_unchecked(r, now))), (lambda t: "checked now")
    targets = [Target(r.action_id, r, why(r)) for r in rows]
    return Bulk(
        do, recheck, targets, {t.action_id: becomes(t) for t in targets if not t.skip}, len(rows)
    )


async def bulk(visit: Visit) -> Response:
    if visit.request.method == "GET":
        return await _bulk_preview(
            visit,
            Filter.of(visit.request.query_params),
            visit.request.query_params.get("do", ""),
            visit.request.query_params.get("no_recheck") != "1",
        )
    return await _bulk_run(visit)


async def _bulk_preview(
    visit: Visit,
    filt: Filter,
    do: str,
    recheck: bool,
    status: int = 200,
    error: str = "",
    form: dict[str, str] | None = None,
) -> Response:
    assert visit.person is not None
    sessions = visit.service.sessions
    assert sessions is not None
    plan = await visit.run(
        lambda s: (plan_bulk(s, filt, do, recheck), s.ledger().clock(anchor=False).now())
    )
    b, now = plan
    return visit.page(
        "bulk.html",
        status,
        nav="queue",
        filter=filt,
        bulk=b,
        now=now,
        dos=DOS,
        error=error,
        digest=sessions.preview_digest(visit.person, b.ids),
        form=form or {},
        writable=visit.person.may("operate"),
    )


async def _bulk_run(visit: Visit) -> Response:
    form = await form_of(visit, "operate")
    person, sessions = visit.person, visit.service.sessions
    assert person is not None and sessions is not None
    filt = Filter.of(form)
    do, recheck = form.get("do", ""), form.get("no_recheck") != "1"
    reason = form.get("reason", "").strip()
    if do.startswith("resolve") and not reason:
        return await _bulk_preview(
            visit, filt, do, recheck, 422, "A reason is required: say how you know.", form
        )

    def work(s: Session) -> Any:
        b = plan_bulk(s, filt, do, recheck)
        if sessions.preview_digest(person, b.ids) != form.get("digest"):
            return b, None
        if form.get("typed", "").strip() != str(len(b.ids)):
            return b, "typed"
        return b, _act(s, b, person, form)

    b, results = await visit.run(work)
    if results is None:
        return await _bulk_preview(
            visit,
            filt,
            do,
            recheck,
            409,
            "The selection changed since your preview: nothing was done. Review it again.",
            form,
        )
    if results == "typed":
        return await _bulk_preview(
            visit,
            filt,
            do,
            recheck,
            422,
            f"Type {len(b.ids)} (the number of actions) to confirm: nothing was done.",
            form,
        )
    visit.service.emit("bulk", actor=person.actor, do=do, count=len(b.ids))
    return visit.page("bulk_done.html", nav="queue", bulk=b, results=results, filter=filt, dos=DOS)


def _act(s: Session, b: Bulk, person: Person, form: dict[str, str]) -> list[tuple[str, str, str]]:
    """The verdict on each planned record, one checked move each: (id, status, note)."""
    from ..cli.verdicts import record_verdicts

    ledger = s.ledger()
    out: list[tuple[str, str, str]] = []
    if b.do.startswith("resolve"):
        verdict = {
            "applied": b.do == "resolve_applied",
            "reason": form.get("reason", "").strip(),
            "by": person.by,
            "evidence": form.get("evidence", "").strip() or None,
            "object_id": None,
            "now": ledger.clock().now(),
            "registry": s.registry(),
            "recheck": b.recheck,
        }
        _code, done = record_verdicts(ledger, b.targets, verdict, bar=False)
        for t in done:
            status = str(t.record.status) if t.record is not None else "-"
            out.append((t.action_id, status, t.skip or "recorded"))
        return out
    for t in b.targets:
        if t.skip:
            out.append((t.action_id, str(t.record.status), t.skip))
    if b.do == "retry":
        d = s.dispatcher(person.actor)
        providers = sorted({t.record.provider for t in b.targets if not t.skip})
        threads = {p: s.send_concurrency(p) for p in providers}
        for r in d.retry_many(b.ids, recheck=b.recheck, concurrency=threads):
            rec = r.report.record if r.report is not None else None
            if rec is not None:
                out.append((rec.action_id, str(rec.status), f"attempt {rec.attempt}"))
            else:
                now = ledger.find(str(r.action_id))
                out.append((str(r.action_id), str(now.status) if now else "-", r.problem))
        return out
    if b.ids:
        s.reconciler(actor=person.actor).run_ids(b.ids)
    for aid in b.ids:
        rec = ledger.get(aid)
        out.append((aid, str(rec.status), rec.reason or ""))
    return out


__all__ = ["DOS", "MAX_BULK", "Bulk", "bulk", "plan_bulk"]
