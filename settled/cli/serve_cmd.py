"""settled serve: the HTTP API, the console, /mcp, /metrics and /healthz in one process
(docs/serve.md, docs/console.md).

uvicorn, Starlette and the MCP SDK are an optional extra (``settled[serve]``), imported
only when the command runs."""

import os

import typer

from .common import STATE

SERVE_HELP = """Serve the HTTP API for apps (/api/v1), the console for people (/ui/), MCP
(/mcp), /metrics and /healthz.

Listens on 127.0.0.1:8780 unless --listen or [serve] listen says otherwise; any
address but loopback needs --allow-remote and at least one API token
([serve.tokens.NAME]), and belongs behind a TLS reverse proxy (docs/serve.md). Every
API call needs `Authorization: Bearer TOKEN` (the OpenAPI description at
/api/v1/openapi.json excepted); with no token configured the API refuses all calls.
The console at /ui/ logs people in with an API token, or trusts an authenticating
proxy's user header from [serve.ui] trusted_proxies (docs/console.md).

At start it checks the config, reads every token from the environment, builds every
provider, opens the ledger (created when missing) and binds the port: any problem
exits 1 with one line. Then it logs JSON lines on stderr: `listening` (with the URL),
one `request` line per request (method, route template, status, duration), and
systemd's READY=1. On SIGTERM/SIGINT it stops accepting, finishes the requests in
hand, logs `stopping` and `stopped` and exits 0.

--reconcile runs the daemon's reconciliation pass in the same process, every
[daemon] interval seconds, and stops it with the service.

\b
Examples:
  settled serve
  settled --config /etc/settled/settled.toml serve --reconcile
  settled serve --listen 0.0.0.0:8780 --allow-remote
  curl -fsS http://127.0.0.1:8780/healthz
"""


def register(app: typer.Typer) -> None:
    @app.command(help=SERVE_HELP)
    def serve(
        listen: str | None = typer.Option(
            None,
            "--listen",
            metavar="HOST:PORT",
            help="Address to listen on (default [serve] listen, else 127.0.0.1:8780; port 0: a free one).",
            show_default=False,
        ),
        allow_remote: bool = typer.Option(
            False,
            "--allow-remote",
            help="Allow an address other than loopback (needs an API token; use a TLS proxy).",
        ),
        reconcile: bool = typer.Option(
            False, "--reconcile", help="Also run the reconciliation pass, as `settled daemon`."
        ),
    ) -> None:
        import signal

        from ..errors import ConfigError, InvalidInput
        from ..notify import Notifier
        from . import signals

        # A stop may come at any moment of the start-up (the imports and the ledger take
        # a while): it is kept, and the service stops as soon as it runs, with its
        # `stopping` and `stopped` lines and exit 0, as the daemon does.
        early: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            early.append(signum)

        if signals.take(on_signal):
            early.append(signal.SIGTERM)
        signal.signal(signal.SIGINT, on_signal)
        from ..address import DEFAULT_LISTEN, is_loopback, is_wildcard, parse_listen
        from ..serve.run import bind, require

        require()
        cfg = STATE.config()
        if listen is not None:
            host, port = parse_listen(listen, "--listen")
            where = "--listen"
        else:
            where = cfg.where("serve.listen") if cfg.serve.listen else "--listen"
            host, port = parse_listen(cfg.serve.listen or DEFAULT_LISTEN, where)
        if not is_loopback(host):
            if not allow_remote:
                raise InvalidInput(
                    f"{where} {host}: not a loopback address; serving beyond this machine needs "
                    "--allow-remote, API tokens and a TLS reverse proxy (docs/serve.md)"
                )
            if not cfg.serve.tokens:
                raise InvalidInput(
                    f"{where} {host}: --allow-remote needs at least one API token: add "
                    '[serve.tokens.NAME] with secret = "${VAR}" and roles to the config'
                )
            if is_wildcard(host) and not cfg.serve.hosts:
                raise ConfigError(
                    f"{cfg.where('serve.hosts')}: required when listening on every interface "
                    f'({host}): the host names clients use, e.g. hosts = ["settled.example.com"]'
                )
        from ..agents.mcp_server import SettledMCP
        from ..serve.asgi import build
        from ..serve.run import open_service
        from ..serve.run import serve as run

        sock = bind(host, port)
        try:
            bound = sock.getsockname()[1]
            service = open_service(
                host=host,
                port=bound,
                db=STATE.db,
                config_path=STATE.config_path,
                reconcile=reconcile,
                debug=bool(os.environ.get("SETTLED_DEBUG")),
            )
        except BaseException:
            sock.close()
            raise
        try:
            mcp = SettledMCP(service.toolbox, debug=service.debug).server()
            code = run(build(service, mcp=mcp), service, sock, Notifier(), early=early)
        finally:
            service.close()
        raise typer.Exit(code)
