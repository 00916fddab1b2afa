"""Admission control: hold back new GRPO groups while a trainer is behind, or while their task is
ahead of its share (`mixing.py`).

A model's backlog is its trainer consumer's pending plus unacked samples (read every `refresh_s`; no
consumer yet: none). A token request for a new group of a model whose backlog is >= `max_backlog`
(0: off) gets `{"retry_after_s": x}`, and the SDK asks again. Episodes of an admitted group, and eval
episodes, always pass: a group held half-admitted could never complete.

The episodes of one group reach different gateways, which must admit the group whole and mix tasks
by one count: `GroupBook` shares admitted groups and task activity through NATS KV `swarm-groups`:

- `g.<digest of the group key>`: the group is admitted (value: its task and the gateway). Admitting
  is a KV `create`, which the server grants once: of two gateways admitting a group at once, one wins;
- `a.<task>`: the task asked for a token, written by each gateway at most every `window_s / 4`.

Every gateway watches the bucket and applies the others' writes to its `TaskMixer`. A (re)started
gateway's watch begins with the live keys, so it remembers the groups admitted within the bucket's TTL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyValueError, NotFoundError
from nats.js.kv import KeyValue

from swarmrl.schemas import subjects as S
from swarmrl.services.common.kv_watch import follow_kv, written_at
from swarmrl.services.common.tasks import Background
from swarmrl.services.gateway.mixing import TaskMixer

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
        self.held = 0  # token requests answered with retry_after_s (a counter, for logs and tests)

    @property
    def active(self) -> bool:
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


def _bounded_add(keys: dict[str, None], key: str, most: int) -> None:
    keys[key] = None
    while len(keys) > most:
        del keys[next(iter(keys))]


def group_key(group: str) -> str:
    """KV key of group `group` (any string: a digest keeps it to KV's key alphabet)."""
    return "g." + hashlib.blake2b(group.encode(), digest_size=16).hexdigest()


class GroupBook:
    """This gateway's view of the admitted groups and the tasks' activity (see the module docstring)."""

    def __init__(self, js: JetStreamContext, mixer: TaskMixer | None, *, remember: int = 100_000) -> None:
        self.js, self.mixer = js, mixer
        self.kv: KeyValue  # bound by start()
        self.gateway = f"gateway-{uuid.uuid4().hex[:12]}"
        self._known: dict[str, None] = {}  # KV keys of admitted groups, oldest first
        self._charged: dict[str, None] = {}  # of those, the ones this gateway's mixer counted
        self.claimed = 0  # groups this gateway admitted (won the KV create of), for logs and tests
        self._remember = remember
        self._announced: dict[str, float] = {}  # task -> when this gateway last wrote a.<task>
        self._tasks = Background()
        self.ready = asyncio.Event()  # set once the watch has delivered the bucket's live keys

    async def start(self) -> None:
        self.kv = await self.js.key_value(S.GROUPS_BUCKET)
        self._tasks.spawn(follow_kv(self.js, self.kv, ">", self._apply, self.ready, "groups"), watched=True)
        await self.ready.wait()

    async def stop(self) -> None:
        await self._tasks.close()

    def known(self, group: str) -> bool:
        return group_key(group) in self._known

    async def admitted(self, group: str) -> bool:
        """Whether some gateway admitted `group`, read from KV (for when the watch may lag)."""
        key = group_key(group)
        if key in self._known:
            return True
        try:
            await self.kv.get(key)
        except KeyNotFoundError:
            return False
        _bounded_add(self._known, key, self._remember)
        return True

    async def claim(self, group: str, task: str) -> bool:
        """Admit `group` of `task`: True if this gateway admitted it now (and charged the mixer),
        False if another gateway had (its charge arrives through the watch)."""
        key = group_key(group)
        try:
            await self.kv.create(key, json.dumps({"task": task, "by": self.gateway}).encode())
        except KeyValueError:  # the key exists: another gateway admitted the group first
            _bounded_add(self._known, key, self._remember)
            return False
        _bounded_add(self._known, key, self._remember)
        self.claimed += 1
        self._charge(key, task)
        return True

    async def asked(self, task: str, now: float) -> None:
        """`task` asked for a token here: tell the other gateways now and then (its activity)."""
        if self.mixer is None or now - self._announced.get(task, -1e18) < self.mixer.window_s / 4:
            return
        self._announced[task] = now
        try:
            await self.kv.put(f"a.{task}", self.gateway.encode())
        except (nats.errors.Error, TimeoutError) as exc:  # informational: the next ask tells again
            self._announced.pop(task, None)
            log.warning("groups: task activity not shared (%r)", exc)

    def _charge(self, key: str, task: str) -> None:
        """Count admitted group `key` in this gateway's mix, once (a re-watch delivers it again)."""
        if self.mixer is None or key in self._charged:
            return
        _bounded_add(self._charged, key, self._remember)
        self.mixer.charge(task)

    def _apply(self, entry: KeyValue.Entry) -> None:
        if entry.operation is not None or not entry.value:  # deletes and TTL expiries pass
            return
        key, value = entry.key, entry.value
        try:
            if key.startswith("g."):
                _bounded_add(self._known, key, self._remember)
                self._charge(key, json.loads(value)["task"])
            elif key.startswith("a.") and self.mixer is not None and value.decode() != self.gateway:
                self.mixer.seen(key.removeprefix("a."), written_at(entry))  # when it asked
        except (ValueError, KeyError) as exc:  # a task this gateway does not mix, or a bad value
            log.warning("groups: ignored %s (%s)", key, exc)
