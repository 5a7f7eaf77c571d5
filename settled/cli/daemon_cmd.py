"""settled daemon: reconcile continuously (see settled.daemon and docs/daemon.md)."""

from __future__ import annotations

import typer

from .common import STATE


def register(app: typer.Typer) -> None:
    @app.command()
    def daemon(
        interval: float = typer.Option(
            None, "--interval", help="Seconds between passes (default [daemon] interval, 5).",
            show_default=False,
        ),
        once: bool = typer.Option(False, "--once", help="Run one pass, log it, and exit."),
        concurrency: int = typer.Option(
            None, "--concurrency", min=1, max=100, show_default=False,
            help="Queries in flight at once (default [reconcile] concurrency, else each "
            "provider's).",
        ),
    ) -> None:
        """Run the reconciliation pass (`reconcile --due`) every --interval seconds.

        Logs one JSON line per status move on stderr (time, action_id, from, to, kind,
        reason). On SIGTERM/SIGINT it finishes the check in hand, hands the rest of the
        batch back to the ledger and exits 0. Several daemons (and cron passes) may
        share one ledger: each row is leased before it is checked.
        """
        import signal

        from ..daemon import Sweeper
        from ..errors import UsageError

        cfg = STATE.config()
        every = cfg.daemon_interval if interval is None else interval
        if not every > 0 or every == float("inf"):
            raise UsageError(f"--interval {interval!r}: must be a number of seconds > 0")
        sweeper = Sweeper(
            STATE.ledger(), STATE.registry(), interval=every, batch=cfg.reconcile_batch,
            lease=cfg.reconcile_lease, probe=STATE.probe,
            concurrency=STATE.query_concurrency(concurrency),
        )

        def on_signal(signum: int, _frame: object) -> None:
            sweeper.request_stop(signal.Signals(signum).name)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        raise typer.Exit(sweeper.serve(once=once))
