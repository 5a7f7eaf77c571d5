"""``/ui/actions/{id}``: one action (what it was, where it stands, its timeline, what may
be done to it now) and, posted, one verdict on it (resolve, confirm, retry, reconcile),
each through the core as the CLI's command does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...advice import allowed
from ...display import config_secrets, event_detail, hidden, redact_params
from ...errors import EffectVisible, InvalidInput, NotFound, RecheckFailed, SettledError
from ...resolve import resolve as do_resolve
from ..lookups import config_changes
from .page_kit import (
    PageRoute,
    Refused,
    Visit,
    form_of,
    next_in_words,
    plain,
    raw_action_id,
    redirect,
)
from .rendering import aid_url, pretty

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session

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


TIER_WORDS = {  # what the operation's tier means for the person reading its page
    "full": "The provider's reply proves the effect: settled knows from the reply itself.",
    "reconcilable": "settled checks the provider for the effect after each send; a person "
    "is needed only when those checks cannot tell.",
    "partial": "The provider proves delivery only, never the effect: a person who can see "
    "the outcome (the customer, the provider's dashboard) settles it, or a signed callback.",
    "blind": "Nothing can observe this effect: only a person who knows whether it happened "
    "can settle it.",
}


async def action(visit: Visit) -> Response:
    aid = raw_action_id(visit.request)
    if visit.request.method == "POST":
        return await verdict(visit, aid)
    did = visit.request.query_params.get("did", "")
    visit.notice = DONE.get(did, "")
    return await _action_page(visit, aid)


async def _action_page(visit: Visit, aid: str, status: int = 200, error: str = "") -> Response:
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

    data = await visit.run(work, action_id=aid)
    return visit.page(
        "action.html", status, nav="queue", error=error, tier_words=TIER_WORDS, **data
    )


async def verdict(visit: Visit, aid: str) -> Response:
    """One verdict on one action, through the core; then back to its page."""

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
                by=person.name,
                via=person.session,
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
    except (EffectVisible, RecheckFailed) as exc:  # rule 14: the world was asked first
        visit.service.emit_error(exc, visit.request)  # the core kept the claim, refused
        status, words = plain(exc)
        return await _action_page(visit, aid, status, f"Refused: {words}")
    except SettledError as exc:
        visit.service.emit_error(exc, visit.request)
        if isinstance(exc, NotFound):
            raise Refused(*plain(exc, aid)) from None
        status, words = plain(exc)
        return await _action_page(
            visit, aid, 409 if not _is_input(exc) else 422, f"Refused: {words}"
        )
    return redirect(f"{aid_url(aid)}?did={did}")


def _is_input(exc: Exception) -> bool:
    return isinstance(exc, InvalidInput)


ROUTES = (PageRoute("/actions/{id:path}", action, ("GET", "POST")),)

__all__ = ["DONE", "ROUTES", "action"]
