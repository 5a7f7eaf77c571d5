"""settled mcp: the configured operations as tools for AI agents (docs/agents.md).

The MCP SDK is an optional extra; it is imported only when the command runs."""

import os

import typer

from .common import STATE

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _parse_address(text: str) -> tuple[str, int]:
    from ..errors import InvalidInput

    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(f"--http {text!r}: use HOST:PORT, e.g. 127.0.0.1:8765")
    if host not in LOOPBACK:
        raise InvalidInput(
            f"--http {text!r}: serves only on loopback (127.0.0.1, ::1, localhost): "
            "the MCP endpoint has no authentication"
        )
    return host, int(port)


def register(app: typer.Typer) -> None:
    @app.command()
    def mcp(
        http: str | None = typer.Option(
            None,
            "--http",
            metavar="HOST:PORT",
            help="Serve streamable HTTP at http://HOST:PORT/mcp (loopback only) instead of stdio.",
            show_default=False,
        ),
    ) -> None:
        """Serve the configured operations as MCP tools for AI agents (stdio by default).

        One tool per operation ({provider}_{operation}, input action_id and params),
        plus check_action and list_unresolved; every result says success, accepted,
        uncertain or failed, and only an observed effect is success. Needs the extra:
        pip install 'settled[mcp]'.

        \b
        Examples:
          settled --config /etc/settled/settled.toml mcp
          settled mcp --http 127.0.0.1:8765
          claude mcp add settled -- settled --config ~/settled.toml mcp
        """
        from ..errors import MissingExtra

        address = _parse_address(http) if http is not None else None
        try:
            import mcp as _sdk  # noqa: F401  (only to tell a missing extra apart)
        except ImportError:
            raise MissingExtra(
                "settled mcp needs the MCP SDK: pip install 'settled[mcp]'"
            ) from None
        from ..agents.mcp_server import POOL, build_server, serve
        from ..toolbox import Toolbox

        debug = bool(os.environ.get("SETTLED_DEBUG"))
        with Toolbox(
            db=STATE.db, config_path=STATE.config_path, actor="mcp", pool=POOL, migrate=False
        ) as box:
            serve(build_server(box, debug=debug), address)
