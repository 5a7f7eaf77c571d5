"""Why a record is open, as a stable code and in a person's words.

A record's ``cause`` is set once per attempt, at its first outcome that leaves the
effect unknown (the send's reply, a lost dispatcher, or the first hand-over to a person),
and kept through every later check: a spent verification budget does not overwrite
"the provider answered 503" with "not seen". A new attempt starts without one. Which
code an outcome leaves is the policy's to say (``policy.cause_of_outcome`` and
``cause_of_handover``); this module only names the codes and words them.

    shown(rec)        -> the code a listing shows ("contradicted" over any other)
    sentence(rec)     -> "the provider answered HTTP 503; 4 checks since found nothing"

Codes (``CAUSES``): ``http_NNN`` (the provider answered NNN and it may have applied),
``timeout_after_send``, ``reply_lost`` (reset or dropped after the request left),
``conflict`` (a conditional write refused: an earlier try may have applied it),
``dispatcher_lost`` (the dispatcher's lease ran out before an outcome was recorded),
``accepted_unseen`` (accepted; the effect not observed yet), ``unprovable`` (accepted
and nothing can query it), ``blind`` (nothing can observe the effect),
``awaiting_person`` (only a person can verify it: partial tier), ``not_seen`` (the
checks found nothing before the budget was spent), ``check_failing`` (the checks
could not reach the provider), ``contradicted`` (a later reply contradicts a settled
status; shown over any other).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import InvalidInput
from .model import ActionRecord

FIXED = (
    "timeout_after_send",
    "reply_lost",
    "conflict",
    "dispatcher_lost",
    "accepted_unseen",
    "unprovable",
    "blind",
    "awaiting_person",
    "not_seen",
    "check_failing",
    "contradicted",
)
HTTP = re.compile(r"http_[1-5][0-9][0-9]")
CAUSES = ("http_NNN", *FIXED)  # what a person may ask for (``--cause``)

_WORDS = {
    "timeout_after_send": "the request was sent and no answer came in time",
    "reply_lost": "the request was sent and its reply was lost",
    "conflict": "the provider refused a repeat as a conflict; an earlier try may have applied it",
    "dispatcher_lost": "the dispatcher stopped before it recorded what the provider said",
    "accepted_unseen": "the provider accepted it; its effect is not seen yet",
    "unprovable": "the provider accepted it, and nothing can look up whether it applied",
    "blind": "nothing can observe this effect; a person must say whether it happened",
    "awaiting_person": "it was delivered; only a person can tell whether it was taken",
    "not_seen": "the checks never saw the effect",
    "check_failing": "the checks could not reach the provider",
    "contradicted": "a later reply contradicts the recorded outcome",
}


def is_cause(code: str) -> bool:
    return code in FIXED or HTTP.fullmatch(code) is not None


def parse(text: str) -> list[str]:
    """``--cause`` (a comma list of codes, any case), checked: ``InvalidInput`` names
    the codes there are."""
    wanted = [c.strip().lower() for c in text.split(",") if c.strip()]
    bad = [c for c in wanted if not is_cause(c)]
    if bad or not wanted:
        shown_bad = (bad[0] if bad else text)[:100]
        raise InvalidInput(
            f"unknown cause {shown_bad!r}; use one of {', '.join(CAUSES)} (e.g. http_503)"
        )
    return list(dict.fromkeys(wanted))


def shown(rec: ActionRecord) -> str | None:
    """The cause a listing shows: ``contradicted`` over any other."""
    # getattr: a renderer may be handed any object with the record's fields
    if getattr(rec, "contradiction", None):
        return "contradicted"
    code: str | None = getattr(rec, "cause", None)
    return code


def sentence(rec: ActionRecord) -> str:
    """The cause in a person's words, with what the checks since found ("" when none)."""
    code = shown(rec)
    if code is None:
        return ""
    if HTTP.fullmatch(code):
        words = f"the provider answered HTTP {code[5:]}"
    else:
        words = _WORDS.get(code, code.replace("_", " "))
    if code == "contradicted":
        return f"{words}: {rec.contradiction}"
    checks = getattr(rec, "checks", 0)
    if checks and code not in ("not_seen", "check_failing"):
        plural = "s" if checks != 1 else ""
        failing = getattr(rec, "check_error", None)
        found = "could not reach the provider" if failing else "found nothing"
        words += f"; {checks} check{plural} since {found}"
    return words


def match_text(code: str | None) -> str:
    """What ``--match`` reads of a cause: its code with spaces (``http 503``)."""
    return (code or "").replace("_", " ")


def to_json(rec: ActionRecord) -> dict[str, Any]:
    """What a listing's JSON adds to the record's: the cause in words (None when none)."""
    return {"cause_text": sentence(rec) or None}


__all__ = [
    "CAUSES",
    "FIXED",
    "HTTP",
    "is_cause",
    "match_text",
    "parse",
    "sentence",
    "shown",
    "to_json",
]
