"""The event loop of every long-running swarmrl process (the services and the example clients):
uvloop where it is installed (a dependency on Linux and macOS), else asyncio's own.

On the 2-core reference machine the swarm of `just up` spends about half its CPU outside the engine
and the trainer, much of it in event loops (HTTP between clients, gateway and engine, NATS
publishes). With uvloop the swarm spends 0.97x the CPU per LLM call of asyncio's loop (gateway
0.93x, merger 0.93x, ledger 0.90x; httptools under uvicorn in both) and finishes 1.01x the episodes
a second (bench/results/swarm-uvloop.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's loop where uvloop is installed, else on asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
