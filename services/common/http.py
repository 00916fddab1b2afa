"""HTTP serving shared by the services that speak HTTP (engine, gateway): uvicorn inside the service's
own asyncio loop, or in a background thread for tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

KEEP_ALIVE_S = 75
"""How long our servers keep an idle HTTP connection open: longer than any client of ours keeps one
(httpx's default 5 s, `EngineClient`'s 30 s), so a client never sends on a connection the server is
closing at that instant (uvicorn's default is 5 s, the same as httpx's: under load a burst of
`APIConnectionError`s, `bench/results/load.md`)."""


class BackgroundServer:
    """uvicorn serving `app` from a daemon thread on an already-bound socket (port 0 = any free port).

    For tests and benchmarks; the `engine` service runs uvicorn on its own asyncio loop instead.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = _bind(host, port)
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(_config(app))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        self._thread.start()
        for _ in range(int(timeout / 0.02)):
            if self._server.started:
                return self
            time.sleep(0.02)
        raise TimeoutError(f"uvicorn did not start within {timeout}s on {self.url}")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


class ServiceServer(uvicorn.Server):
    """uvicorn for the engine service's own loop: the service, not uvicorn, owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_in_loop(app: FastAPI, host: str, port: int) -> tuple[ServiceServer, asyncio.Task[None]]:
    """Start uvicorn as a task of the running loop; return once it listens.

    The socket is bound here first: uvicorn's own bind failure is a SystemExit, which would escape
    the event loop instead of reaching the service as an error naming the address.
    """
    sock = _bind(host, port)
    server = ServiceServer(_config(app))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it, if anything did
            raise RuntimeError("uvicorn stopped before it started listening")
        await asyncio.sleep(0.02)
    return server, task


def _config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S)


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says it is TCP. Without it, a reply on a kept-alive connection waited ~40 ms
    # for the client's delayed ACK (Nagle), on every engine and gateway call.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc}") from exc
    return sock
