"""redact: erase the params values of one settled record, with proof
(``retention.py`` does the work)."""

from typing import Annotated

import typer

from . import options
from .common import STATE, emit_json, person
from .render import say

REDACT_HELP = """Erase the params values of one settled record: a person's erasure request.

Without --field every value in the params is replaced by "[redacted]" (keys and shape
are kept); --field PATH (a JSON pointer such as /to or /customer/email, repeatable)
erases only those. Wherever the record's reason, snapshot or events' evidence (a
provider's reply) repeat a removed text of 4 characters or more, it is replaced too.
A `redacted` event keeps who (--by, else SETTLED_OPERATOR, else the OS user), why
(--reason, required), which fields, and the SHA-256 of what was removed; params_hash
is kept, so a repeated dispatch of the same action id still finds its record.

Only a settled record (CONFIRMED or FAILED, uncontradicted) can be redacted: exit 7
for another, 6 when there is none, 1 for a --field the params do not hold; nothing is
written then. `settled verify` knows redactions: a value that reappears where one was
erased is a finding. Archives written afterwards hold only the redacted record.

\b
Examples:
  settled redact order-1842 --reason "erasure request #77" --by dpo
  settled redact order-1842 --field /customer/email --field /customer/name --reason "GDPR art. 17"
"""


def register(app: typer.Typer) -> None:
    app.command("redact", help=REDACT_HELP)(redact)


def redact(
    action_id: Annotated[str, options.action_id("The settled record.")],
    field: list[str] | None = typer.Option(
        None,
        "--field",
        metavar="PATH",
        help="A JSON pointer into the params (repeatable); default: every value.",
        show_default=False,
    ),
    reason: str = typer.Option(
        ..., "--reason", metavar="TEXT", help="Why (the erasure request, its reference)."
    ),
    by: Annotated[str | None, options.by("erases")] = None,
    as_json: options.JsonRecord = False,
) -> None:
    from ..clock import to_text
    from ..errors import InvalidInput
    from ..retention import Redaction, erasure
    from .inputs import check_id

    check_id(action_id)
    if not reason.strip():
        raise InvalidInput("--reason is required: say why (the request, its reference)")
    actor = person(by)
    ledger = STATE.ledger(create=False)
    now = to_text(ledger.clock(anchor=False).now())  # a refused redaction writes nothing
    ask = Redaction(tuple(field or ()), reason, actor, now)
    rec = ledger.redact(action_id, lambda r, log: erasure(r, log, ask))
    if rec is None:
        say(f"{action_id}: nothing left to erase there; nothing written")
        if as_json:
            emit_json(ledger.get(action_id).to_json())
        raise typer.Exit(0)
    if as_json:
        emit_json(rec.to_json())
    else:
        last = ledger.events(action_id)[-1]
        fields = ", ".join(last.detail.get("fields", [])) or "/"
        say(
            f"{action_id}: erased {last.detail.get('removed')} value(s) at {fields}; "
            f"{len(last.detail.get('events_redacted', []))} event(s) redacted; "
            f"sha256 of what was removed {last.detail.get('removed_sha256')}"
        )
