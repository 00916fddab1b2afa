"""Admission control: hold back new GRPO groups while a trainer is behind.

Clients and trainer are decoupled, so nothing stops clients from generating far faster than the
trainer learns. The surplus is wasted twice: its samples are dropped as stale (`max_staleness`),
and on a shared machine the engine serving them takes the CPU the trainer needs. The gateway is
where every episode starts (it mints the episode's tokens), so it bounds the backlog there:

- backlog(model) = samples waiting for the model's trainer: the durable consumer's undelivered
  plus delivered-but-unacked messages (the trainer acks a group only once it is trained);
- a token request for a *new* group whose models have a backlog >= `max_backlog` is answered with
  `{"retry_after_s": x}`; the SDK waits and asks again (it does not count as a failure);
- episodes of a group already admitted, and eval episodes, are always admitted: a group held
  half-admitted could never complete, and the trainer would hold its samples until its timeout.

The backlog is read from JetStream (cached for `refresh_s`); a model with no trainer consumer yet
has no backlog. `max_backlog=0` turns admission control off.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import subjects as S

log = logging.getLogger("swarmrl.gateway")


class Admission:
    def __init__(
        self,
        js: JetStreamContext,
        max_backlog: int,
        *,
        refresh_s: float = 0.5,
        retry_after_s: float = 1.0,
        remember_groups: int = 10_000,
    ) -> None:
        self.js, self.max_backlog = js, max_backlog
        self.refresh_s, self.retry_after_s = refresh_s, retry_after_s
        self._groups: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_groups
        self._backlog: dict[str, tuple[float, int]] = {}  # model -> (read at, samples)
        self.held = 0
        """Token requests answered with retry_after_s (a counter, for logs and tests)."""

    async def backlog(self, model: str) -> int:
        """Samples of `model` not yet trained (cached for `refresh_s`)."""
        now = time.monotonic()
        cached = self._backlog.get(model)
        if cached and now - cached[0] < self.refresh_s:
            return cached[1]
        durable = S.durable_name("trainer", S.SAMPLES_STREAM, model)
        try:
            info = await self.js.consumer_info(S.SAMPLES_STREAM, durable)
            samples = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        except NotFoundError:  # no trainer yet: nothing is waiting on it
            samples = 0
        self._backlog[model] = (now, samples)
        return samples

    async def check(self, models: list[str], group_key: str, eval: bool) -> float:
        """0.0 to admit the episode now, else the seconds after which the client should ask again."""
        if self.max_backlog <= 0 or eval:
            return 0.0
        if group_key and group_key in self._groups:
            self._groups.move_to_end(group_key)
            return 0.0
        for model in models:
            waiting = await self.backlog(model)
            if waiting >= self.max_backlog:
                self.held += 1
                log.debug("holding group %s: model %s has %d untrained samples", group_key, model, waiting)
                return self.retry_after_s
        if group_key:
            self._groups[group_key] = None
            while len(self._groups) > self._remember:
                self._groups.popitem(last=False)
        return 0.0
