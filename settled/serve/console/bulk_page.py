"""A verdict on everything a filter selects, as ``settled resolve``/``retry``/``reconcile``
by selectors do it: a preview of exactly which records change (the CLI's plan: each
record with why it is left alone, and what each becomes), then, once the person typed
their number, one checked move per record. The preview is sealed (an HMAC, bound to
the session, of everything it shows: the verdict, the recheck choice, the reason, the
evidence, the object id, the filter and exactly the ids in order), so a resolve's reason
and evidence are asked for before the sealed preview. Rows ticked in the queue narrow
the filter to exactly those ids (the filter's ``ids``), so the seal binds them too. When anything posted differs from
what the sealed preview showed (the selection changed meanwhile, or a field of the form
was changed), nothing is done and the preview of what was posted is shown instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ...advice import next_attempt, resolvable, retryable, verdict_becomes
from ...reconcile import why_unchecked
from ...resolve import record_verdicts
from ...selection import Target
from ..sessions import Person
from .page_kit import DOS, Filter, PageRoute, Refused, Visit, form_of

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session

MAX_BULK = 10_000  # records one bulk verdict may change: narrow the filter for more


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


@dataclass(frozen=True)
class Verdict:
    """What a bulk verdict records on every record it changes: all its preview shows,
    and all its seal binds (with the filter and the ids)."""

    do: str
    recheck: bool = True
    reason: str = ""
    evidence: str = ""
    object_id: str = ""  # the bulk form has none: one posted is a change, refused

    @classmethod
    def of(cls, source: Any) -> Verdict:
        return cls(
            str(source.get("do") or ""),
            source.get("no_recheck") != "1",
            str(source.get("reason") or "").strip(),
            str(source.get("evidence") or "").strip(),
            str(source.get("object_id") or "").strip(),
        )

    @property
    def resolves(self) -> bool:
        return self.do.startswith("resolve")

    def shown(self, filt: Filter, ids: list[str]) -> dict[str, Any]:
        """What the seal covers: this verdict, the filter and exactly these ids."""
        return {
            "do": self.do,
            "recheck": self.recheck,
            "reason": self.reason,
            "evidence": self.evidence,
            "object_id": self.object_id,
            "filter": filt.values,
            "ids": ids,
        }


CHANGED = (
    "The verdict or the selection is not the one your preview showed: nothing was done. "
    "Review it again."
)


async def bulk(visit: Visit) -> Response:
    """GET: the preview (a resolve's reason and evidence are asked for first); POST
    ``step=review``: a resolve's preview with its reason and evidence, sealed; POST: the
    verdict, when everything posted is what the sealed preview showed."""
    if visit.request.method == "GET":
        q = visit.request.query_params
        v = Verdict(q.get("do", ""), q.get("no_recheck") != "1")
        ticked = [unquote(p) for p in q.getlist("pick")]  # percent-encoded: see rendering.quoted
        filt = Filter.of(q).picked(ticked)  # the rows ticked in the queue, if any
        return await _bulk_preview(visit, filt, v, sealed=not v.resolves)
    form = await form_of(visit, "operate")
    filt, v = Filter.of(form), Verdict.of(form)
    if v.resolves and not v.reason:
        return await _bulk_preview(
            visit, filt, v, status=422, error="A reason is required: say how you know."
        )
    if form.get("step") == "review":
        return await _bulk_preview(visit, filt, v, sealed=True)
    return await _bulk_run(visit, filt, v, form)


async def _bulk_preview(
    visit: Visit,
    filt: Filter,
    v: Verdict,
    *,
    sealed: bool = False,
    status: int = 200,
    error: str = "",
) -> Response:
    """The plan of ``v`` on the filter's selection; ``sealed``: with the form that
    carries it out, its seal over everything the page shows."""
    assert visit.person is not None
    sessions = visit.service.sessions
    assert sessions is not None
    plan = await visit.run(
        lambda s: (plan_bulk(s, filt, v.do, v.recheck), s.ledger().clock(anchor=False).now())
    )
    b, now = plan
    back = {"do": v.do, **({} if v.recheck else {"no_recheck": "1"})}
    return visit.page(
        "bulk.html",
        status,
        nav="queue",
        filter=filt,
        bulk=b,
        verdict=v,
        now=now,
        dos=DOS,
        error=error,
        sealed=sealed,
        back=filt.query(**back),
        digest=sessions.preview_digest(visit.person, v.shown(filt, b.ids)) if sealed else "",
        writable=visit.person.may("operate"),
    )


async def _bulk_run(visit: Visit, filt: Filter, v: Verdict, form: dict[str, str]) -> Response:
    person, sessions = visit.person, visit.service.sessions
    assert person is not None and sessions is not None

    def work(s: Session) -> Any:
        b = plan_bulk(s, filt, v.do, v.recheck)
        if sessions.preview_digest(person, v.shown(filt, b.ids)) != form.get("digest"):
            return b, None
        if form.get("typed", "").strip() != str(len(b.ids)):
            return b, "typed"
        return b, _act(s, b, person, v)

    b, results = await visit.run(work)
    if results is None:
        return await _bulk_preview(visit, filt, v, sealed=True, status=409, error=CHANGED)
    if results == "typed":
        return await _bulk_preview(
            visit,
            filt,
            v,
            sealed=True,
            status=422,
            error=f"Type {len(b.ids)} (the number of actions) to confirm: nothing was done.",
        )
    visit.service.emit("bulk", actor=person.actor, do=v.do, count=len(b.ids))
    return visit.page("bulk_done.html", nav="queue", bulk=b, results=results, filter=filt, dos=DOS)


def _act(s: Session, b: Bulk, person: Person, v: Verdict) -> list[tuple[str, str, str]]:
    """The verdict on each planned record, one checked move each: (id, status, note)."""
    ledger = s.ledger()
    out: list[tuple[str, str, str]] = []
    if b.do.startswith("resolve"):
        verdict = {
            "applied": b.do == "resolve_applied",
            "reason": v.reason,
            "by": person.name,
            "via": person.session,
            "evidence": v.evidence or None,
            "object_id": v.object_id or None,
            "now": ledger.clock().now(),
            "registry": s.registry(),
            "recheck": b.recheck,
        }
        for t, _refused in record_verdicts(ledger, b.targets, verdict):
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


ROUTES = (PageRoute("/bulk", bulk, ("GET", "POST")),)

__all__ = ["CHANGED", "DOS", "MAX_BULK", "ROUTES", "Bulk", "Verdict", "bulk", "plan_bulk"]
