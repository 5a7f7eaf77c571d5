"""settled demo: a sim provider on a free loopback port, a throw-away ledger, and a
handful of actions across all four tiers, some with faults. It shows how each ends
and why, and what the provider really received."""

from __future__ import annotations

import time

import typer

from .common import STATUS_STYLE, console, next_step

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


def register(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """Run a self-contained demo against a simulated provider (no config needed)."""
        import tempfile

        from ..clock import utcnow
        from ..dispatch import Dispatcher
        from ..ledger import Ledger
        from ..providers import Registry
        from ..providers.sim_server import SimServer
        from ..reconcile import Reconciler

        con = console()
        with tempfile.TemporaryDirectory(prefix="settled-demo-") as tmp, SimServer(hang=1.0) as server:
            conf = {
                "type": "sim",
                "base_url": server.url,
                "timeout": 0.5,
                "consistency_window": 0.5,
                "verify_interval": 0.3,
                "verify_deadline": 2.0,
            }
            registry = Registry({"sim": conf}, source="demo")
            ledger = Ledger.open(f"{tmp}/demo.db")
            try:
                d = Dispatcher(ledger, registry, actor="demo")
                con.print(f"sim provider on {server.url}; ledger in a temporary folder\n")
                for aid, op, fault, _ in SCRIPT:
                    server.plan(aid, fault)
                    rep = d.submit("sim", op, {"to": "customer@example.com"}, action_id=aid)
                    status = rep.record.status if rep.record else "-"
                    con.print(
                        f"dispatch {aid:<18} {op:<8} fault={fault:<20} → "
                        f"[{STATUS_STYLE.get(str(status), 'white')}]{status}[/] ({rep.result})"
                    )
                # the late-confirmation race, in miniature
                server.plan("demo-confirm", "ok")
                d.submit("sim", "book", {"slot": "10:00"}, action_id="demo-confirm",
                         needs_confirmation=True)
                a = d.confirm("demo-confirm")
                b = d.confirm("demo-confirm")
                con.print(
                    f"\nconfirm demo-confirm twice: first → {a.outcome} ({a.result}), "
                    f"second → {b.outcome} ({b.result}); provider received "
                    f"{len(server.requests_for('demo-confirm'))} request(s)"
                )

                con.print("\nreconciling until nothing is due (verification budget 2 s) …")
                rec = Reconciler(ledger, registry, actor="demo-reconciler")
                deadline = time.monotonic() + 8
                while time.monotonic() < deadline:
                    rec.run_due()
                    pending = ledger.query(statuses=["AWAITING_VERIFICATION", "IN_FLIGHT"])
                    due = [r for r in ledger.query(statuses=["DENIED_UNRESOLVED"]) if r.next_check_at]
                    if not pending and not due:
                        break
                    time.sleep(0.2)
                _final_table(con, ledger, server)
                from .actions import render_queue

                con.print()
                render_queue(ledger.query(statuses=["DENIED_UNRESOLVED"]), utcnow(), ["DENIED_UNRESOLVED"])
                con.print(
                    "\nNothing above says done without an observed effect. The queue is what "
                    "only evidence or a person can settle: `settled resolve ID --applied|"
                    "--not-applied --reason ...`."
                )
            finally:
                ledger.close()
                registry.close()
        raise typer.Exit(0)


def _final_table(con: object, ledger: object, server: object) -> None:
    from rich.table import Table

    t = Table(
        title="how each action ended (sent/applied: what the provider really saw)",
        title_justify="left",
    )
    t.add_column("action", no_wrap=True)
    t.add_column("tier")
    t.add_column("scenario")
    t.add_column("status", no_wrap=True)
    t.add_column("sent/applied", justify="center")
    t.add_column("why", max_width=60)
    extra = ("demo-confirm", "book", "ok", "confirmed twice")
    for aid, _op, _fault, what in [*SCRIPT, extra]:
        r = ledger.get(aid)  # type: ignore[attr-defined]
        style = STATUS_STYLE[str(r.status)]
        if r.status == "CONFIRMED":
            why = f"effect observed by {r.confirmed_by}"
        else:
            why = r.reason or next_step(r)
        t.add_row(
            aid,
            str(r.tier),
            what,
            f"[{style}]{r.status}[/]",
            f"{len(server.requests_for(aid))}/{server.effects_for(aid)}",  # type: ignore[attr-defined]
            why,
        )
    con.print(t)  # type: ignore[attr-defined]
