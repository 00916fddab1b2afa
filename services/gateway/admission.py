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
has no backlog. `max_backlog=0` turns the backlog bound off.

With task weights (`mixer`, see `mixing.py`) a new group that passed the backlog bound is also held
while its task is ahead of its share; the same two exemptions apply.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.mixing import TaskMixer

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
        mixer: TaskMixer | None = None,
    ) -> None:
        self.js, self.max_backlog, self.mixer = js, max_backlog, mixer
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

    def _admitted(self, group_key: str, task: str, now: float) -> bool:
        if not (group_key and group_key in self._groups):
            return False
        self._groups.move_to_end(group_key)
        if self.mixer is not None:
            self.mixer.seen(task, now)
        return True

    async def check(self, models: list[str], group_key: str, eval: bool, task: str = "") -> float:
        """0.0 to admit the episode now, else the seconds after which the client should ask again.

        With a mixer, `task` must be one of its tasks (checked by the caller for non-eval episodes)."""
        if eval or (self.max_backlog <= 0 and self.mixer is None):
            return 0.0
        now = time.monotonic()
        if self._admitted(group_key, task, now):
            return 0.0
        for model in models if self.max_backlog > 0 else []:
            waiting = await self.backlog(model)
            if waiting >= self.max_backlog:
                self.held += 1
                if self.mixer is not None:  # it asked: it still counts as an active task
                    self.mixer.seen(task, now)
                log.debug("holding group %s: model %s has %d untrained samples", group_key, model, waiting)
                return self.retry_after_s
        if self._admitted(group_key, task, now):  # a sibling episode got in while we read the backlog
            return 0.0
        if self.mixer is not None and not self.mixer.admit(task, now):
            self.held += 1
            log.debug("holding group %s: task %s is ahead of its share", group_key, task)
            return self.retry_after_s
        if group_key:
            self._groups[group_key] = None
            while len(self._groups) > self._remember:
                self._groups.popitem(last=False)
        return 0.0
