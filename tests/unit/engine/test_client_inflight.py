"""`EngineClient(max_inflight=N)` sends at most N requests at once (the rest wait in the client), on
at most N connections; 0 sends all at once. Measured at a real HTTP server that counts them."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi import FastAPI, Request

from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.client import EngineClient


class Counting:
    def __init__(self) -> None:
        self.now = self.most = 0
        self.peers: set[int] = set()
        self.lock = threading.Lock()
        self.app = FastAPI()

        @self.app.get("/get_model_info")
        def info(request: Request) -> dict[str, str]:  # a sync route: it runs in the server's threads
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                self.peers.add(request.client.port)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            return {"weight_version": "0"}


@pytest.fixture
def server():
    counting = Counting()
    bg = BackgroundServer(counting.app).start()
    yield counting, bg.url
    bg.stop()


@pytest.mark.parametrize(("cap", "most"), [(3, 3), (0, 12)])
async def test_at_most_max_inflight_requests_at_once(server, cap: int, most: int) -> None:
    counting, url = server
    client = EngineClient(url, max_inflight=cap)
    try:
        infos = await asyncio.gather(*(client.model_info() for _ in range(12)))
    finally:
        await client.aclose()
    assert all(i["weight_version"] == "0" for i in infos)
    assert counting.most == most
    assert len(counting.peers) == most  # one connection per request in flight, kept for the next
