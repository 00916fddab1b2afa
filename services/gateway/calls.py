"""Each agent identity's call rate, held across every gateway.

Each gateway keeps a token bucket per identity (`limits.py`) and, every `TALLY_EVERY_S`, publishes the
calls it served on `swarm.gw.calls` (core NATS); the others take them from their buckets too, so the
bound is the same with one gateway or ten. Within one tally N gateways may serve N bursts (a bucket
may go into debt, paid back by waiting); a lost tally errs on the side of serving.
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
from swarmrl.services.common.tasks import Background
from swarmrl.services.gateway.limits import AgentLimits

log = logging.getLogger("swarmrl.gateway")

TALLY_EVERY_S = 0.05
"""How often a gateway that served calls tells the others (the bound's lag across gateways)."""


class SharedCalls:
    """The NATS side of `AgentLimits`' call rate (see the module docstring)."""

    def __init__(self, nc: NATS, limits: AgentLimits, gateway: str) -> None:
        self.nc, self.limits, self.gateway = nc, limits, gateway
        self._sub: Subscription | None = None
        self._tasks = Background()

    @property
    def active(self) -> bool:
        return self.limits.rate > 0

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(S.GATEWAY_CALLS, cb=self._on_tally)
        self._tasks.spawn(self._tell())

    async def stop(self) -> None:
        await self._tasks.close()
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
