"""Admission control: hold back new GRPO groups while a trainer is behind, or while their task is
ahead of its share (`mixing.py`).

A model's backlog is its trainer consumer's pending plus unacked samples (read every `refresh_s`; no
consumer yet: none). A token request for a new group of a model whose backlog is >= `max_backlog`
(0: off) gets `{"retry_after_s": x}`, and the SDK asks again. Episodes of an admitted group, and eval
episodes, always pass: a group held half-admitted could never complete. Admitted groups and the mix's
counts are shared by every gateway (`groups.py`).
"""

from __future__ import annotations

import logging
import time

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.groups import GroupBook

log = logging.getLogger("swarmrl.gateway")


class Admission:
    def __init__(
        self,
        js: JetStreamContext,
        max_backlog: int,
        groups: GroupBook,
        *,
        refresh_s: float = 0.5,
        retry_after_s: float = 1.0,
    ) -> None:
        self.js, self.max_backlog, self.groups = js, max_backlog, groups
        self.mixer = groups.mixer
        self.refresh_s, self.retry_after_s = refresh_s, retry_after_s
        self._backlog: dict[str, tuple[float, int]] = {}  # model -> (read at, samples)
        self.held = 0
        """Token requests answered with retry_after_s (a counter, for logs and tests)."""

    @property
    def active(self) -> bool:
        """Whether admission may hold anything (a backlog bound or task mixing)."""
        return self.max_backlog > 0 or self.mixer is not None

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

    async def check(
        self, models: list[str], group_key: str, eval: bool, task: str = "", episode_id: str = ""
    ) -> float:
        """0.0 to admit the episode now, else the seconds after which the client should ask again.
        An episode without a group key is a group of its own; with a mixer, `task` must be one of its."""
        if eval or not self.active:
            return 0.0
        try:
            return await self._check(models, group_key or f"episode:{episode_id}", task)
        except (nats.errors.Error, TimeoutError) as exc:  # KV unreachable for now: the client asks again
            log.warning("admission: shared state unreachable (%r); asking the client to retry", exc)
            self.held += 1
            return self.retry_after_s

    async def _check(self, models: list[str], group_key: str, task: str) -> float:
        now = time.monotonic()
        if self.mixer is not None:  # every ask, held or not, shows the task is alive
            self.mixer.seen(task, now)
            await self.groups.asked(task, now)
        if self.groups.known(group_key):  # a group admitted here or by another gateway
            return 0.0
        for model in models if self.max_backlog > 0 else []:
            waiting = await self.backlog(model)
            if waiting >= self.max_backlog:
                log.debug("holding group %s: model %s has %d untrained samples", group_key, model, waiting)
                return await self._hold(group_key)
        if self.mixer is not None and self.mixer.ahead(task, now):
            log.debug("holding group %s: task %s is ahead of its share", group_key, task)
            return await self._hold(group_key, task)
        await self.groups.claim(group_key, task)  # admitted whether this gateway won or another did
        return 0.0

    async def _hold(self, group_key: str, task: str = "") -> float:
        """Hold a new group, unless another gateway admitted it meanwhile (the watch may lag)."""
        if await self.groups.admitted(group_key):
            return 0.0
        self.held += 1
        if task and self.mixer is not None:
            self.mixer.held[task] += 1
        return self.retry_after_s
