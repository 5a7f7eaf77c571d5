"""Running the service: the parts opened once, the socket, uvicorn, signals, systemd.

``open_service`` builds a :class:`~settled.serve.service.Service` from the config (its
tokens read from the environment now, its session pool opened, the ledger created when
missing); ``serve`` runs it under uvicorn on a socket bound beforehand (so a taken
port fails at start) until SIGTERM or SIGINT:

- ``listening`` (with the URL) once the socket accepts, and systemd's ``READY=1``;
- on the signal: ``stopping`` and ``STOPPING=1``; the socket closes, the requests in
  hand finish (within ``GRACE`` seconds), the reconciliation pass in hand finishes;
- ``stopped``, and exit 0.

Connections are bounded (``settled.serve.connections``): uvicorn runs its h11 protocol
with a limit on every wait, and at most ``max_connections`` at once, kept
``RESERVED_FDS`` below the descriptor limit, whose soft value is raised to the hard one
at start.

uvicorn's own logging is turned into the same JSON lines (warnings and errors only);
its access log is off: the service writes its own line per request, without the path.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING, Any

from ..address import is_loopback, shown
from ..log import Log, json_lines
from .auth import Guard, Tokens
from .problems import one_line
from .service import POOL, Service
from .sessions import Sessions

if TYPE_CHECKING:
    from ..notify import Notifier

GRACE = 60.0  # s the requests in hand may take to finish after SIGTERM
# s an idle keep-alive connection stays open: longer than a reverse proxy's (nginx's
# upstream keepalive_timeout is 60 s), so that the service never closes a connection
# just as the proxy (or a client) sends a request on it
KEEP_ALIVE = 75
TRUSTED_PROXIES = ["127.0.0.1", "::1"]  # X-Forwarded-Proto/For honoured from here only
# descriptors kept for the service's own use below its limit, whatever the clients do:
# the ledger (a pooled SQLite session holds 3 with WAL), provider connections, the
# event loop, threads' clients, the log; about 60 at the default pool, with a margin
RESERVED_FDS = 256
MAX_NOFILE = 1 << 20  # what the soft limit is raised to when the hard one is unlimited
INSTALL = "pip install 'settled[serve]'"


def require() -> None:
    """Exit 1 naming the install command when an extra ``serve`` needs is missing."""
    from ..errors import MissingExtra

    for module in ("uvicorn", "starlette", "mcp", "prometheus_client", "jsonschema", "jinja2"):
        try:
            __import__(module)
        except ImportError:
            raise MissingExtra(f"settled serve needs {module}: {INSTALL}") from None


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (systemd's ``LimitNOFILE``
    sets both; a shell's soft default is 1,024): ``(soft before, soft now)``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_NOFILE if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # a kernel cap below the hard limit: keep the soft one
            return soft, soft
        return soft, wanted
    return soft, soft


def max_connections(configured: int, nofile: int) -> int:
    """The connections served at once: ``[serve] max_connections``, kept
    ``RESERVED_FDS`` below the descriptor limit (and at least 16)."""
    return max(16, min(configured, nofile - RESERVED_FDS))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one)."""
    from ..errors import InvalidInput

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on the connections of a socket
    # whose proto says TCP, and without it every keep-alive answer waited ≈40 ms for the
    # client's delayed ACK (a response's head and body are two writes).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InvalidInput(
            f"--listen {shown(host, port)}: cannot listen: {exc.strerror or exc}"
        ) from None
    return sock


def open_service(  # noqa: PLR0913  (keyword-only: the parts a service is built from)
    *,
    host: str,
    port: int,
    db: str | None = None,
    config_path: str | None = None,
    reconcile: bool = False,
    log: Log | None = None,
    debug: bool = False,
    pool: int = POOL,
) -> Service:
    """The service for this config and ledger, its pool open (the ledger is created when
    missing, as ``settled dispatch`` would). ``port`` is the bound one (the Host check
    names it). With ``reconcile``, a sweeper with a session of its own."""
    from ..metrics import Metrics
    from ..session import Session
    from ..toolbox import Toolbox

    # Migrations are explicit (``settled migrate``): an older ledger stops the start.
    main = Session(db=db, config_path=config_path, migrate=False)
    box = Toolbox(db=db, config_path=config_path, actor="mcp", pool=pool, migrate=False)
    try:
        cfg = main.config()
        tokens = Tokens.from_config(cfg)
        sessions = Sessions.from_config(cfg, tokens)  # the console's key, read now
        registry = main.registry()
        registry.load_all()  # every provider built now: a config mistake stops us at start
        box.prepare()
        shared = box.shared_ledger()
        if shared is not None:  # PostgreSQL: one ledger's connections for the whole service
            main.share(shared)
        with box.session() as s:
            location = s.ledger().location
            s.hooks()  # every callback secret read now: a missing one stops us at start
    except BaseException:
        box.close()
        main.close()
        raise
    service = Service(
        toolbox=box,
        config=cfg,
        tokens=tokens,
        guard=Guard(host, port, cfg.serve.hosts),
        metrics=Metrics(),
        log=log or json_lines(),
        debug=debug,
        ledger_location=location,
        sessions=sessions,
    )
    service.closing.append(main.close)
    if reconcile:
        from ..config import DEFAULT_OUTAGE_AFTER
        from ..notify import Notifier
        from ..outage import Outages
        from ..sweep import Sweeper

        service.sweeper = Sweeper(
            main.ledger(),
            registry,
            interval=cfg.daemon_interval,
            batch=cfg.reconcile_batch,
            lease=cfg.reconcile_lease,
            metrics=service.metrics,
            notifier=Notifier({}),  # the service speaks to systemd, once
            log=service.log,
            name=service.name,
            probe=main.probe,
            concurrency=main.query_concurrency(),
            outages=Outages(cfg.outage_after, DEFAULT_OUTAGE_AFTER),
        )
    return service


class Peer:
    """Keeps the address the socket saw as ``scope["settled.peer"]`` before the proxy
    headers replace ``client`` with the address a proxy reports."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("client"):
            scope["settled.peer"] = scope["client"][0]
        await self.app(scope, receive, send)


class _JsonLogging(logging.Handler):
    """A library's warnings (uvicorn, the MCP SDK) as the service's JSON lines."""

    def __init__(self, service: Service) -> None:
        super().__init__(logging.WARNING)
        self.service = service

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = one_line(record.getMessage())
        except Exception:  # a library's malformed log call must not stop the service
            message = one_line(str(record.msg))
        self.service.emit(
            "library", level=record.levelname.lower(), logger=record.name, message=message
        )


def serve(
    app: Any,
    service: Service,
    sock: socket.socket,
    notifier: Notifier,
    early: list[int] | None = None,
) -> int:
    """Serve ``app`` on ``sock`` until SIGTERM/SIGINT; 0 when it stopped cleanly.

    ``early`` is the list the command's own handlers filled during start-up: a signal
    that came before uvicorn took them over stops the service as soon as it starts."""
    import asyncio

    import uvicorn

    from .connections import Limits, bounded

    host, port = sock.getsockname()[:2]
    url = f"http://{shown(host, port)}"
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    # X-Forwarded-Proto/For are honoured from loopback and from the console's trusted
    # proxies; the peer the socket saw is kept for the console (``Peer``), which trusts
    # a proxy's user header only from those addresses, never from what a header says.
    trusted = list(dict.fromkeys([*TRUSTED_PROXIES, *service.config.serve.ui.trusted_proxies]))
    app = Peer(ProxyHeadersMiddleware(app, trusted_hosts=trusted))
    nofile_was, nofile = raise_nofile()
    conf = service.config.serve
    limits = Limits(
        head_timeout=conf.head_timeout,
        body_timeout=conf.body_timeout,
        max_connections=max_connections(conf.max_connections, nofile),
    )
    config = uvicorn.Config(
        app,
        http=bounded(limits),  # uvicorn's h11 protocol, with a limit on every wait
        log_config=None,
        access_log=False,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,
        timeout_graceful_shutdown=int(GRACE),
        timeout_keep_alive=KEEP_ALIVE,
        server_header=False,
    )
    handler = _JsonLogging(service)
    root = logging.getLogger()
    root.addHandler(handler)

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self.loop = asyncio.get_running_loop()
            if stops and not self.should_exit:  # it came before uvicorn's handlers
                self.handle_exit(stops[0], None)
            await super().startup(sockets=sockets)
            if not self.should_exit:
                listening()
                if notifier.watchdog is not None:
                    self.loop.create_task(watchdog(self))

        def handle_exit(self, sig: int, frame: Any) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and self.loop is not None:  # never log from a signal handler
                self.loop.call_soon_threadsafe(stopping, signal.Signals(sig).name)

    def listening() -> None:
        # What start-up built (uvicorn, Starlette, the app and its templates, the
        # providers and their HTTP clients, the ledger's pool) lives as long as the
        # service: the cyclic collector is told never to walk it again, so a request's
        # collections look only at what requests made (on callbacks the collector was
        # 17 % of the profile; docs/performance.md). The CLI froze its own start-up.
        gc.collect()
        gc.freeze()
        service.emit(
            "listening",
            url=url,
            api=f"{url}/api/v1",
            ui=f"{url}/ui/",
            mcp=f"{url}/mcp",
            ledger=service.ledger_location,
            tokens=len(service.tokens),
            remote=not is_loopback(host),
            reconcile=service.sweeper is not None,
            hosts=service.guard.allowed_hosts(),
            max_body=service.max_body,
            head_timeout=limits.head_timeout,
            body_timeout=limits.body_timeout,
            max_connections=limits.max_connections,
            bodies_per_client=conf.bodies_per_client,
            nofile=nofile,
            **({"nofile_was": nofile_was} if nofile_was != nofile else {}),
            pid=os.getpid(),
        )
        if not len(service.tokens):
            service.emit(
                "warning",
                level="warning",
                message="no API tokens are configured: /api/v1 answers 401 to every call "
                "until [serve.tokens.NAME] is set (docs/serve.md)",
            )
        notifier.ready(f"serving {url}")

    def stopping(reason: str) -> None:
        if service.sweeper is not None and service.sweeper.exit_code:
            reason = "ledger_changed"  # the sweeper's own SIGTERM: its schema moved
        service.stopping = True
        service.emit("stopping", reason=reason)
        notifier.stopping()
        if service.sweeper is not None:
            service.sweeper.request_stop(reason)

    async def watchdog(server: Server) -> None:
        assert notifier.watchdog is not None
        while not server.should_exit:
            if service.sweeper is None or service.sweeper.alive():
                notifier.ping()
            await asyncio.sleep(notifier.watchdog)

    server = Server(config)
    # uvicorn stops gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    # handlers it found: with these, a requested stop ends in exit 0, as the daemon's does.
    stops: list[int] = early if early is not None else []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    try:
        server.run(sockets=[sock])
    finally:
        root.removeHandler(handler)
        sock.close()
    if not server.started:
        service.emit("stopped", level="error", message="the service did not start")
        return 1
    service.emit("stopped")
    return 1 if service.sweeper is not None and service.sweeper.exit_code else 0


__all__ = [
    "GRACE",
    "INSTALL",
    "RESERVED_FDS",
    "TRUSTED_PROXIES",
    "Peer",
    "bind",
    "max_connections",
    "open_service",
    "raise_nofile",
    "require",
    "serve",
]
