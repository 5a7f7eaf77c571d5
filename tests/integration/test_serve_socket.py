"""The service's listening socket: its connections send small writes at once.

A response's head and body leave in two writes; on a connection without TCP_NODELAY the
second waits for the client's delayed ACK (≈40 ms on Linux), so every keep-alive answer
took that long. asyncio sets TCP_NODELAY only on connections of a socket whose protocol
says TCP, which ``bind`` therefore names."""

from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.sqlite_only  # no ledger involved

from settled.serve.run import bind  # noqa: E402


def test_every_accepted_connection_has_tcp_nodelay() -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(500):  # bounded: the server side has seen the connection
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0
