"""Each agent identity's call rate, held across every gateway: the gateways tell each other the
calls they served.

An identity's calls may reach any gateway: over NATS request/reply the gateways answer in one queue
group, and an identity's episodes may have been granted by different gateways. Each gateway keeps
its own token bucket per identity (`limits.py`), and every `TALLY_EVERY_S` it publishes what it
served since the last tally on `swarm.gw.calls` (core NATS: nothing stored, nothing to clean up);
every other gateway takes those calls from its own buckets too. So each bucket sees the calls of the
whole swarm, and the bound is the same with one gateway or ten. It is exact in the long run; within
one tally's time the gateways cannot see each other's calls, so N gateways may together serve up to
N bursts at the very start; a bucket may then go into debt (down to one burst), which the identity
pays back by waiting.
A tally lost (a gateway restarting, a slow subscriber) is calls the others do not take: the bound
then errs on the side of serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgpack
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.limits import AgentLimits

log = logging.getLogger("swarmrl.gateway")

TALLY_EVERY_S = 0.05
"""How often a gateway that served calls tells the others (the bound's lag across gateways)."""


class SharedCalls:
    """The NATS side of `AgentLimits`' call rate (see the module docstring)."""

    def __init__(self, nc: NATS, limits: AgentLimits, gateway: str) -> None:
        self.nc, self.limits, self.gateway = nc, limits, gateway
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.limits.rate > 0

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(S.GATEWAY_CALLS, cb=self._on_tally)
        self._task = asyncio.create_task(self._tell())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()

    async def _tell(self) -> None:
        while True:
            await asyncio.sleep(TALLY_EVERY_S)
            served = self.limits.take_served()
            if not served:
                continue
            try:
                await self.nc.publish(S.GATEWAY_CALLS, msgpack.packb({"by": self.gateway, "calls": served}))
            except nats.errors.Error as exc:  # the others serve a little more meanwhile; never fatal
                log.warning("calls: tally of %d calls not sent (%r)", sum(served.values()), exc)

    async def _on_tally(self, msg: Msg) -> None:
        try:
            tally = msgpack.unpackb(msg.data)
            by, calls = tally["by"], tally["calls"]
            if by == self.gateway:
                return
            now = time.monotonic()
            for identity, n in calls.items():
                self.limits.spent(str(identity), int(n), now)
        except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            log.warning("calls: ignored a tally on %s (%r)", msg.subject, exc)
