"""The console's reading pages and one action's verdicts (``settled.serve.console``
routes them): the queue with the CLI's filters, an action's story and what may be done
to it now, the providers and the stats. Each reads or acts through the core, as the
CLI's command does; none holds a rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ..errors import SettledError
from .console import Refused, Visit, form_of, raw_action_id, redirect
from .pages import aid_url

if TYPE_CHECKING:
    from starlette.responses import Response

    from ..session import Session

QUEUE_LIMIT = 500  # rows the queue page shows (the count says how many match)
FILTERS = (
    "status",
    "provider",
    "operation",
    "older_than",
    "since",
    "match",
    "delivery",
    "sort",
    "reverse",
)
DONE = {  # ?did= after a verdict (a fixed key: no text from the URL is ever shown)
    "resolved": "Your verdict was recorded.",
    "retried": "A new attempt was opened and dispatched.",
    "reconciled": "The provider was checked now.",
    "confirm-dispatched-succeeded": "Confirmed: sent once, and the effect was observed.",
    "confirm-dispatched-accepted": "Confirmed: sent once; the provider took it, and settled "
    "checks the effect next.",
    "confirm-dispatched-failed": "Confirmed: sent once; the provider refused it (FAILED).",
    "confirm-dispatched-unresolved": "Confirmed: sent once; nobody can tell yet whether it applied.",
    "confirm-already_completed": "Nothing sent: it had already completed.",
    "confirm-in_progress": "Nothing sent: another caller is dispatching it.",
    "confirm-blocked": "Nothing sent: a prior dispatch is unresolved; reconcile before retry.",
}


# ------------------------------------------------------------------ the queue


@dataclass(frozen=True)
class Filter:
    """The queue's filters, as the page's query string holds them."""

    values: dict[str, str]

    @classmethod
    def of(cls, source: Any) -> Filter:
        return cls(
            {k: str(source.get(k)).strip() for k in FILTERS if str(source.get(k) or "").strip()}
        )

    def query(self, **extra: str) -> str:
        return urlencode({**self.values, **extra})

    def selection(self, s: Session, now: Any) -> Any:
        """The ledger's ``Selection``, as ``settled queue`` makes it from these options
        (an unknown name, status, delivery or sort is a ``SettledError``)."""
        from ..cli.common import parse_duration
        from ..cli.listing import parse_statuses
        from ..cli.queue_cmd import parse_deliveries, parse_match, parse_sort
        from ..clock import plus, to_text
        from ..storage.base import Selection
        from .api import _check_names

        v = self.values
        provider, operation = v.get("provider"), v.get("operation")
        _check_names(s, provider, operation)

        def ago(raw: str | None) -> str | None:
            return None if raw is None else to_text(plus(now, -parse_duration(raw)))

        return Selection(
            statuses=parse_statuses(v.get("status", "DENIED_UNRESOLVED")),
            provider=provider,
            operation=operation,
            created_before=ago(v.get("older_than")),
            created_after=ago(v.get("since")),
            also_contradicted="status" not in v,
            delivery=parse_deliveries(v["delivery"]) if "delivery" in v else None,
            match=parse_match(v["match"]) if "match" in v else None,
            sort=parse_sort(v.get("sort", "created_at")),
            reverse=v.get("reverse") == "1",
        )


async def queue(visit: Visit) -> Response:
    from ..cli.common import STATUSES
    from ..cli.queue_cmd import DELIVERIES
    from ..cli.stats_cmd import summarise
    from ..clock import to_text
    from ..storage.query import SORT_FIELDS
    from .console_bulk import DOS

    filt = Filter.of(visit.request.query_params)

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        out: dict[str, Any] = {"now": now, "rows": [], "total": 0, "error": ""}
        names = set(ledger.names()) | _configured(s)
        out["names_p"] = sorted({p for p, _ in names})
        out["names_o"] = sorted({o for _, o in names})
        try:
            sel = filt.selection(s, now)
        except SettledError as exc:
            out["error"] = str(exc)
            sel = None
        out["stats"] = summarise(
            ledger.stats(_everything(), now=to_text(now), by="operation"), "operation"
        )
        if sel is not None:
            rows = ledger.records(replace(sel, limit=QUEUE_LIMIT))
            out["total"] = ledger.count(sel) if len(rows) >= QUEUE_LIMIT else len(rows)
            out["rows"] = [(r, next_in_words(r, now)) for r in rows]
        return out

    data = await visit.run(work)
    error = data.pop("error")
    return visit.page(
        "queue.html",
        422 if error else 200,
        nav="queue",
        filter=filt,
        error=error,
        statuses=STATUSES,
        deliveries=DELIVERIES,
        sorts=SORT_FIELDS,
        dos=DOS,
        shown_limit=QUEUE_LIMIT,
        **data,
    )


def _everything() -> Any:
    from ..storage.base import Selection

    return Selection()


def _configured(s: Session) -> set[tuple[str, str]]:
    reg = s.registry()
    out: set[tuple[str, str]] = set()
    for name in s.config().providers:
        try:
            out |= {(name, o) for o in reg.provider(name).operations()}
        except SettledError:
            continue
    return out


# ------------------------------------------------------------------ one action

# The CLI's ``next`` (its short form, with ages) in the console's words: a person here
# presses a button rather than typing a command.
CONSOLE_NEXT = {
    "settled retry": "a retry (the Retry button)",
    "settled reconcile": "a check with the provider (Check now)",
    "confirm/dispatch": "a confirmation (Confirm and send), or its dispatch",
    "needs a person": "a person's verdict (Give your verdict)",
}


TIER_WORDS = {  # what the operation's tier means for the person reading its page
    "full": "The provider's reply proves the effect: settled knows from the reply itself.",
    "reconcilable": "settled checks the provider for the effect after each send; a person "
    "is needed only when those checks cannot tell.",
    "partial": "The provider proves delivery only, never the effect: a person who can see "
    "the outcome (the customer, the provider's dashboard) settles it, or a signed callback.",
    "blind": "Nothing can observe this effect: only a person who knows whether it happened "
    "can settle it.",
}


def next_in_words(rec: Any, now: Any) -> str:
    """What settles ``rec`` next, as ``settled queue`` says it, with the console's
    buttons for the commands it names."""
    from ..cli.common import next_step

    short = next_step(rec, now)
    return CONSOLE_NEXT.get(short, short)


def allowed(rec: Any, now: Any) -> dict[str, Any]:
    """The verdicts the core would take on this record now (none is taken here)."""
    from ..cli.common import queryable
    from ..dispatch import retry_problem
    from ..policy import recheck_needed, resolution
    from ..reconcile import why_unchecked

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


async def action(visit: Visit) -> Response:
    aid = raw_action_id(visit.request)
    if visit.request.method == "POST":
        return await verdict(visit, aid)
    did = visit.request.query_params.get("did", "")
    visit.notice = DONE.get(did, "")
    return await _action_page(visit, aid)


async def _action_page(visit: Visit, aid: str, status: int = 200, error: str = "") -> Response:
    from ..cli.common import config_secrets, redact_params
    from ..cli.listing import event_detail
    from ..cli.render import hidden
    from .api import config_changes
    from .pages import pretty

    secrets = [*config_secrets(visit.service.config), *visit.service.tokens.secrets]

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        rec = ledger.get(aid)
        now = ledger.clock(anchor=False).now()
        events = ledger.events(aid)
        timeline = [(e, event_detail(e)) for e in events]
        touched = [
            (e, d)
            for e, d in timeline
            if str(e.kind) in ("reconciled", "callback", "unresolved", "late_outcome", "note")
            or "check" in d
        ]
        return {
            "rec": rec,
            "now": now,
            "timeline": timeline,
            "touched": touched,
            "params": redact_params(rec.params, secrets),
            "next": next_in_words(rec, now),
            "changes": config_changes(s, rec),
            "waiting": ledger.pending_callbacks(rec),
            "may": allowed(rec, now),
            "hidden": any(
                hidden(v)
                for v in (
                    rec.action_id,
                    rec.reason,
                    rec.contradiction,
                    *pretty(rec.params).split("\n"),
                )
            ),
        }

    data = await visit.run(work)
    return visit.page(
        "action.html", status, nav="queue", error=error, tier_words=TIER_WORDS, **data
    )


async def verdict(visit: Visit, aid: str) -> Response:
    """One verdict on one action, through the core; then back to its page."""
    from ..errors import EffectVisible, NotFound

    form = await form_of(visit, "read")
    do = form.get("do", "")
    person = visit.person
    assert person is not None
    roles = ("dispatch", "operate") if do == "confirm" else ("operate",)
    if not any(person.may(r) for r in roles):
        raise Refused(
            403,
            f"refused: {person.name} may not do this (needs the "
            f"{' or '.join(roles)} role; you have {person.roles})",
        )
    recheck = form.get("no_recheck") != "1"

    def work(s: Session) -> str:
        from ..resolve import resolve as do_resolve

        ledger = s.ledger()
        if do == "resolve":
            applied = {"applied": True, "not_applied": False}.get(form.get("verdict", ""))
            if applied is None:
                raise Refused(422, "say what happened: applied or not applied")
            reason = form.get("reason", "").strip()
            if not reason:
                raise Refused(422, "a reason is required: say how you know")
            do_resolve(
                ledger,
                aid,
                applied=applied,
                reason=reason,
                by=person.by,
                now=ledger.clock().now(),
                evidence=form.get("evidence", "").strip() or None,
                object_id=form.get("object_id", "").strip() or None,
                registry=s.registry(),
                recheck=recheck,
            )
            return "resolved"
        if do == "confirm":
            report = s.dispatcher(person.actor).confirm(aid)
            if str(report.outcome) == "not_found":
                raise NotFound(f"no action {aid!r}")
            result = f"-{report.result}" if str(report.outcome) == "dispatched" else ""
            return f"confirm-{report.outcome}{result}"  # the real result, as rule 8 says
        if do == "retry":
            s.dispatcher(person.actor).retry(aid, recheck=recheck)
            return "retried"
        if do == "reconcile":
            s.reconciler(actor=person.actor).run_ids([aid])
            return "reconciled"
        raise Refused(422, "unknown verdict")

    try:
        did = await visit.service.run(work)
    except EffectVisible as exc:  # rule 14: the world answered first; the record settled by it
        return await _action_page(visit, aid, 409, f"Refused: {exc}")
    except SettledError as exc:
        visit.service.emit_error(exc, visit.request)
        if isinstance(exc, NotFound):
            raise Refused(404, str(exc)) from None
        return await _action_page(visit, aid, 409 if not _is_input(exc) else 422, f"Refused: {exc}")
    return redirect(f"{aid_url(aid)}?did={did}")


def _is_input(exc: Exception) -> bool:
    from ..errors import InvalidInput

    return isinstance(exc, InvalidInput)


# ------------------------------------------------------------------ providers and stats


async def providers(visit: Visit) -> Response:
    from ..audit import audit

    def work(s: Session) -> dict[str, Any]:
        reg = s.registry()
        reg.load_all()
        specs = {
            (n, o): spec for n in reg.names() for o, spec in reg.provider(n).operations().items()
        }
        report = audit(s.ledger(), specs, s.config().callbacks)
        return {
            "ops": report.operations,
            "kept": report.callbacks,
            "debt": report.debt,
            "callbacks": s.config().callbacks,
        }

    return visit.page("providers.html", nav="providers", **(await visit.run(work)))


async def stats(visit: Visit) -> Response:
    from ..cli.stats_cmd import OPEN, summarise
    from ..clock import plus, to_text
    from ..storage.base import Selection

    windows = (("last hour", 3600.0), ("last day", 86400.0), ("last week", 7 * 86400.0))

    def work(s: Session) -> dict[str, Any]:
        ledger = s.ledger()
        now = ledger.clock(anchor=False).now()
        data = summarise(ledger.stats(Selection(), now=to_text(now), by="provider"), "provider")
        over: list[tuple[str, list[int]]] = []
        for g in data["groups"]:
            counts = []
            for _label, secs in windows:
                sel = Selection(
                    statuses=["DENIED_UNRESOLVED"],
                    provider=g["key"],
                    created_after=to_text(plus(now, -secs)),
                )
                counts.append(ledger.count(sel))
            over.append((g["key"], counts))
        figures = sorted(ledger.figures().items())  # the audit's: how settled, how fast
        return {
            "data": data,
            "over": over,
            "windows": [w for w, _ in windows],
            "open": OPEN,
            "now": now,
            "figures": figures,
        }

    return visit.page("stats.html", nav="stats", **(await visit.run(work)))


__all__ = [
    "DONE",
    "FILTERS",
    "Filter",
    "action",
    "allowed",
    "next_in_words",
    "providers",
    "queue",
    "stats",
]
