"""The services' HTTP servers (`services/common/http.py`) answer without Nagle's delay."""

from __future__ import annotations

import asyncio
import socket

from swarmrl.services.common.http import _bind


async def test_accepted_connections_have_nodelay() -> None:
    """asyncio sets TCP_NODELAY on an accepted connection only when the listening socket's `proto`
    is IPPROTO_TCP; without it every reply on a kept-alive connection waited ~40 ms for the client's
    delayed ACK (44 ms against 1.2 ms per call to a FastAPI app, measured when this was found)."""
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    listener = _bind("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    port = listener.getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(seen, 5) != 0
    writer.close()
    server.close()
    await server.wait_closed()
