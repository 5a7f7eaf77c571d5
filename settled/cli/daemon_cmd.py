"""settled daemon: reconcile continuously (see settled.sweep and docs/daemon.md)."""

from typing import Annotated, Any

import typer

from . import options
from .common import STATE

MAX_INTERVAL = 86400.0  # s: a pass at least once a day; longer is a cron job's work

DAEMON_HELP = """Run the reconciliation pass (`reconcile --due`) every --interval seconds.

At start it checks the config and builds every provider (a missing ${VAR} included),
opens the ledger and, with --metrics, binds the port: any problem exits 1 with one
line. Then it logs JSON lines on stderr: each status move, a warning per check that
could not observe anything (provider, operation, error class), a summary per pass and
a heartbeat every --heartbeat seconds. Under systemd (Type=notify) it reports ready
and pings the watchdog (WatchdogSec). On SIGTERM/SIGINT it finishes the check in
hand, hands the rest of the batch back and exits 0. Several daemons (and cron
passes) may share one ledger.

--metrics HOST:PORT serves Prometheus metrics on /metrics and a health check on
/healthz (200 while passes succeed; 503 before the first and after a failed one);
it needs `pip install 'settled[metrics]'`.

\b
Examples:
  settled daemon --interval 5
  settled --config /etc/settled/settled.toml daemon --metrics 127.0.0.1:9108
  settled daemon --once
"""


def register(app: typer.Typer) -> None:
    @app.command(help=DAEMON_HELP)
    def daemon(
        interval: float | None = typer.Option(
            None,
            "--interval",
            metavar="S",
            help="Seconds between passes (default [daemon] interval, 5).",
            show_default=False,
        ),
        once: bool = typer.Option(False, "--once", help="Run one pass, log it, and exit."),
        metrics: str | None = typer.Option(
            None,
            "--metrics",
            metavar="HOST:PORT",
            help="Serve /metrics and /healthz on this address.",
        ),
        heartbeat: float = typer.Option(
            60.0, "--heartbeat", metavar="S", help="Seconds between heartbeat lines."
        ),
        concurrency: Annotated[
            int | None,
            options.concurrency(
                "Queries in flight at once (default [reconcile] concurrency, else each provider's)."
            ),
        ] = None,
    ) -> None:
        import signal

        from . import signals

        # A stop may come at any moment of the start-up (a CI cancel, a deploy that
        # changed its mind): it is kept, the start-up finishes (each step is bounded),
        # and the daemon then logs `started`, `stopping` and `stopped` and exits 0.
        sweeper: list[Any] = []
        early: list[str] = []

        def on_signal(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            if sweeper:
                sweeper[0].request_stop(name)
            else:
                early.append(name)

        if signals.take(on_signal):
            early.append("SIGTERM")
        signal.signal(signal.SIGINT, on_signal)
        sweeper.append(_start(interval, metrics, heartbeat, concurrency))
        if early:
            sweeper[0].request_stop(early[0])
        board = sweeper[0].metrics
        try:
            code = sweeper[0].serve(once=once)
        finally:
            if board is not None:
                board.close()
        raise typer.Exit(code)


def _start(
    interval: float | None, metrics: str | None, heartbeat: float, concurrency: int | None
) -> Any:
    """Everything the daemon needs before its first pass, each part checked now: any
    problem is exit 1 with one line, nothing started."""
    from ..config import DEFAULT_OUTAGE_AFTER
    from ..errors import InvalidInput
    from ..notify import Notifier
    from ..outage import Outages
    from ..sweep import Sweeper

    cfg = STATE.config()
    every = cfg.daemon_interval if interval is None else interval
    source = "--interval" if interval is not None else f"{cfg.source}: daemon.interval"
    if not 0 < every <= MAX_INTERVAL:  # also refuses nan and inf
        raise InvalidInput(
            f"{source} {every!r}: must be a number of seconds > 0 and <= {MAX_INTERVAL:g} (a day)"
        )
    if not 1 <= heartbeat <= MAX_INTERVAL:
        raise InvalidInput(f"--heartbeat {heartbeat!r}: must be between 1 and {MAX_INTERVAL:g} s")
    address = None
    if metrics is not None:
        from ..metrics import parse_address, require

        address = parse_address(metrics)
        require()
    registry = STATE.registry()
    registry.load_all()  # every provider built now: a config mistake stops us at start
    ledger = STATE.ledger()
    board, where = None, None
    if address is not None:
        from ..metrics import Metrics

        board = Metrics(providers=cfg.providers)
        host, port = board.serve(*address)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sweeper = Sweeper(
        ledger,
        registry,
        interval=every,
        batch=cfg.reconcile_batch,
        lease=cfg.reconcile_lease,
        heartbeat=heartbeat,
        metrics=board,
        metrics_address=where,
        notifier=Notifier(),
        outages=Outages(cfg.outage_after, DEFAULT_OUTAGE_AFTER),
        probe=STATE.probe,
        concurrency=STATE.query_concurrency(concurrency),
    )
    return sweeper
