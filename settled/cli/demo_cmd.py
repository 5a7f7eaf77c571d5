"""settled demo: a sim provider on a free loopback port, a throw-away ledger (kept with
--keep DIR), and a handful of actions across all four tiers, some with faults. It
shows how each ends and why, and what the provider really received."""

import os
import shlex
import time
from typing import Any

import typer

from ..advice import next_step
from ..clock import nap
from .render import Col, console, is_tty, listing, status_text, text

# (action id, operation, fault, what it shows)
SCRIPT = [
    ("demo-book", "book", "ok", "reply proves the booking"),
    ("demo-send-lag", "send", "lag:0.8", "202; visible 0.8 s later"),
    ("demo-send-lost", "send", "lost_after_accept", "202; then lost by provider"),
    ("demo-send-bounce", "send", "bounce", "202; then bounced"),
    ("demo-send-timeout", "send", "timeout_after_apply", "applied; reply never came"),
    ("demo-book-reject", "book", "reject", "rejected with 422"),
    ("demo-deliver", "deliver", "ok", "delivery receipt only"),
    ("demo-notify", "notify", "ok", "no receipt, no query"),
]

DEMO_HELP = """Run a self-contained demo against a simulated provider (no config needed).

The ledger lives in a temporary folder and is deleted at the end, unless --keep DIR
keeps it as DIR/demo.db, so that the closing hint can be tried on it.

\b
Examples:
  settled demo
  settled demo --keep ./demo && settled --db ./demo/demo.db queue
"""


def register(app: typer.Typer) -> None:
    @app.command(help=DEMO_HELP)
    def demo(
        keep: str | None = typer.Option(
            None, "--keep", metavar="DIR", help="Keep the demo's ledger as DIR/demo.db."
        ),
    ) -> None:
        import tempfile

        from ..errors import InvalidInput

        if keep is not None:
            target = os.path.join(keep, "demo.db")
            if os.path.exists(target):
                raise InvalidInput(
                    f"--keep {keep}: {target} exists already; remove it or choose another folder"
                )
            try:
                os.makedirs(keep, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise InvalidInput(
                    f"--keep {keep}: cannot create the folder: {exc.strerror}"
                ) from None
            _run(target, kept=True)
        else:
            with tempfile.TemporaryDirectory(prefix="settled-demo-") as tmp:
                _run(os.path.join(tmp, "demo.db"), kept=False)
        raise typer.Exit(0)


def _run(db: str, *, kept: bool) -> None:
    from ..dispatch import Dispatcher
    from ..providers import Registry
    from ..providers.sim_server import SimServer
    from ..storage import Ledger

    con = console()
    with SimServer(hang=1.0) as server:
        conf = {
            "type": "sim",
            "base_url": server.url,
            "timeout": 0.5,
            "consistency_window": 0.5,
            "verify_interval": 0.3,
            "verify_deadline": 2.0,
        }
        registry = Registry({"sim": conf}, source="demo")
        ledger = Ledger.open(db)
        try:
            d = Dispatcher(ledger, registry, actor="demo")
            where = f"ledger in {db}" if kept else "ledger in a temporary folder"
            con.print(text(f"sim provider on {server.url}; {where}"))
            con.print()
            for aid, op, fault, _ in SCRIPT:
                server.plan(aid, fault)
                rep = d.submit("sim", op, {"to": "customer@example.com"}, action_id=aid)
                status = rep.record.status if rep.record else "-"
                con.print(
                    text(f"dispatch {aid:<18} {op:<8} fault={fault:<20} → ")
                    + status_text(status)
                    + text(f" ({rep.result})")
                )
            _confirm_race(d, server, con)
            _settle(ledger, registry, con)
            con.print()
            _final_table(ledger, server)
            con.print()
            _queue_and_next_step(ledger, db, kept, con)
        finally:
            ledger.close()
            registry.close()


def _confirm_race(d: Any, server: Any, con: Any) -> None:
    """The late-confirmation race, in miniature: two confirms, one request."""
    server.plan("demo-confirm", "ok")
    d.submit("sim", "book", {"slot": "10:00"}, action_id="demo-confirm", needs_confirmation=True)
    a = d.confirm("demo-confirm")
    b = d.confirm("demo-confirm")
    con.print()
    con.print(
        text(
            f"confirm demo-confirm twice: first → {a.outcome} ({a.result}), "
            f"second → {b.outcome} ({b.result}); provider received "
            f"{len(server.requests_for('demo-confirm'))} request(s)"
        )
    )


def _settle(ledger: Any, registry: Any, con: Any) -> None:
    """Reconcile until nothing is due, as the daemon would (bounded at 8 s)."""
    from ..model import Status
    from ..reconcile import Reconciler

    con.print()
    con.print(text("reconciling until nothing is due (verification budget 2 s) …"))
    reconciler = Reconciler(ledger, registry, actor="demo-reconciler")
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        reconciler.run_due()
        pending = ledger.query(statuses=[Status.AWAITING_VERIFICATION, Status.IN_FLIGHT])
        due = [r for r in ledger.query(statuses=["DENIED_UNRESOLVED"]) if r.next_check_at]
        if not pending and not due:
            break
        nap(0.2)


def _queue_and_next_step(ledger: Any, db: str, kept: bool, con: Any) -> None:
    """What is left for a person, and the command that settles it."""
    from .table_columns import queue_columns, tsv_columns

    rows = ledger.query(statuses=["DENIED_UNRESOLVED"])
    tty = is_tty()
    listing(
        queue_columns(ledger.clock().now(), ["DENIED_UNRESOLVED"]) if tty else tsv_columns(),
        rows,
        "table" if tty else "tsv",
        title=f"queue: DENIED_UNRESOLVED ({len(rows)})",
    )
    first = rows[0].action_id if rows else "demo-notify"
    db_opt = f"--db {shlex.quote(db)} " if kept else ""
    con.print()
    con.print(
        text(
            "Nothing above says done without an observed effect. The queue is what "
            "only evidence or a person can settle; for example:"
        )
    )
    con.print(
        text(f'  settled {db_opt}resolve {first} --applied --reason "seen in the inbox"'),
        no_wrap=True,
        overflow="ignore",
        crop=False,
    )
    if not kept:
        con.print(text("(run `settled demo --keep DIR` to keep this ledger and try it)"))


def _final_table(ledger: Any, server: Any) -> None:
    from ..model import Status

    extra = ("demo-confirm", "book", "ok", "confirmed twice")
    rows = []
    for aid, _op, _fault, what in [*SCRIPT, extra]:
        r = ledger.get(aid)
        why = (
            f"effect observed by {r.confirmed_by}"
            if r.status is Status.CONFIRMED
            else (r.reason or next_step(r))
        )
        rows.append(
            {
                "id": aid,
                "tier": str(r.tier),
                "what": what,
                "status": str(r.status),
                "seen": f"{len(server.requests_for(aid))}/{server.effects_for(aid)}",
                "why": why,
            }
        )
    from .table_columns import status_style

    cols = [
        Col("action", lambda r: r["id"]),
        Col("tier", lambda r: r["tier"], give_way=2),
        Col("scenario", lambda r: r["what"], give_way=1),
        Col("status", lambda r: r["status"], style=lambda r: status_style(r["status"])),
        Col("sent/applied", lambda r: r["seen"], give_way=3),
        Col("why", lambda r: r["why"], flex=True),
    ]
    listing(
        cols,
        rows,
        "table" if is_tty() else "tsv",
        title="how each action ended (sent/applied: what the provider really saw)",
    )
