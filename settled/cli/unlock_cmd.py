"""settled unlock: release the leases of a holder a person names as dead, recorded."""

import sys
from typing import Annotated, Any

import typer

from . import options
from .common import STATE, emit_json, operator

WINDOW = 60.0  # s: a holder that took a lease this recently may still be alive

UNLOCK_HELP = """Release the leases a dead holder still holds, recorded.

HOLDER is a lease owner as `settled show --json` names it (`lease_owner`: a
dispatcher's or a daemon's id). Its leases are listed (id, kind, until when)
and, once a person said yes (or --yes), released: a dispatch lease (IN_FLIGHT)
takes exactly the move the reconciler makes when a dispatcher's lease expires, to
DENIED_UNRESOLVED, so the request that may have left is checked, never sent again;
a check lease is handed back, due at once. Each release is an event naming the person, the reason and the
holder.

Refused (exit 7, nothing changed) while the holder shows it is alive: a dispatch
lease it took within the last --window seconds (default 60). A dispatcher never
renews its claim, so a recent claim is the only sign of life the ledger holds.
No lease held: "nothing to release", exit 0.

\b
Examples:
  settled unlock disp-4f2a-1234 --reason "host web-3 died at 14:02" --by alice
  settled unlock --holder disp-4f2a-1234 --reason "OOM-killed" --yes --json
"""


def register(app: typer.Typer) -> None:
    @app.command("unlock", help=UNLOCK_HELP)
    def unlock(
        holder: str | None = typer.Argument(None, metavar="HOLDER", show_default=False),
        holder_opt: str | None = typer.Option(
            None, "--holder", metavar="HOLDER", help="= HOLDER.", show_default=False
        ),
        reason: str = typer.Option(
            ..., "--reason", metavar="TEXT", help="Why the holder is dead (recorded)."
        ),
        by: Annotated[str | None, options.by("releases the leases")] = None,
        window: float = typer.Option(
            WINDOW,
            "--window",
            metavar="S",
            min=1.0,
            max=86400.0,
            help="A lease taken this recently shows the holder may be alive: refused.",
        ),
        yes: Annotated[bool, options.yes("Release without asking.")] = False,
        as_json: Annotated[bool, options.json_output("Machine output.")] = False,
    ) -> None:
        from ..errors import InvalidInput

        if holder is not None and holder_opt is not None and holder != holder_opt:
            raise InvalidInput("HOLDER and --holder disagree; give one of them")
        name = (holder if holder is not None else holder_opt or "").strip()
        if not name:
            raise InvalidInput("name the holder: settled unlock HOLDER --reason TEXT")
        if not reason.strip():
            raise InvalidInput("--reason must not be empty")
        actor = operator(by)
        _unlock(name, reason.strip(), actor, window, yes, as_json)


def _unlock(holder: str, reason: str, actor: str, window: float, yes: bool, as_json: bool) -> None:
    from ..clock import from_text, to_text
    from ..errors import Conflict
    from ..model import Status
    from ..unlock import held_by, release

    ledger = STATE.ledger()
    now = ledger.clock(anchor=False).now()
    held = held_by(ledger, holder, now)
    rows = [lease_row(h) for h in held]
    if not held:
        if as_json:
            emit_json({"holder": holder, "released": []})
        else:
            _say(f"holder {holder!r} holds no lease on {ledger.location}: nothing to release")
        return
    recent = [
        h
        for h in held
        if h.record.status is Status.IN_FLIGHT
        and (now - (from_text(h.record.updated_at) or now)).total_seconds() < window
    ]
    if recent:
        newest = max(h.record.updated_at for h in recent)
        raise Conflict(
            f"holder {holder!r} took a dispatch lease at {newest}, less than {window:g} s ago: "
            "it may still be sending; stop it, wait out the window, then unlock; "
            "nothing was changed"
        )
    if not as_json:
        for r in rows:
            print(f"{r['action_id']}\t{r['kind']}\t{r['status']}\tuntil {r['until']}")
    if not yes:
        from .select import confirm

        if not confirm(
            len(held),
            question=f"release {len(held)} lease(s) of {holder!r}?",
            doing="release the leases of",
            asked=True,
        ):
            _say("nothing was changed")
            raise typer.Exit(1)
    done = release(ledger, held, holder=holder, actor=actor, reason=reason, now=now)
    for r, ok in zip(rows, done, strict=True):
        r["released"] = ok
    if as_json:
        emit_json({"holder": holder, "at": to_text(now), "released": rows})
    else:
        n = sum(done)
        _say(f"released {n} lease(s) of {holder!r}" + _moved_on(len(done) - n))
    sys.stdout.flush()


def _moved_on(n: int) -> str:
    return f"; {n} had moved on meanwhile and were left as they are" if n else ""


def lease_row(h: Any) -> dict[str, Any]:
    return {
        "action_id": h.record.action_id,
        "kind": h.kind,
        "status": str(h.record.status),
        "until": h.until,
        # a dispatch lease is taken by the claim, the record's last write
        "taken_at": h.record.updated_at if h.kind == "dispatch" else None,
    }


def _say(line: str) -> None:
    from ..display import term

    print(f"settled: {term(line, limit=2000)}", file=sys.stderr)
