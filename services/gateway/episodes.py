"""Each agent identity's call rate and open episodes (`limits.py`), held across every gateway.

**Calls**: each gateway keeps a token bucket per identity and, every `TALLY_EVERY_S`, publishes the
calls it served on `swarm.gw.calls` (core NATS); the others take them from their buckets too, so the
bound is the same with one gateway or ten. Within one tally N gateways may serve N bursts (a bucket
may go into debt, paid back by waiting); a lost tally errs on the side of serving.

**Episodes**: an identity's episodes hold slots in NATS KV `swarm-groups`, keys
`e.<digest of the identity>.<slot>` (value: identity, episode, granting gateway), at most
`max_episodes`. A gateway grants a new episode's token only once its KV `create` of a free slot won,
so the bound is exact across gateways. The episode's `end` or `abort` frees the slot; an episode
given two slots at once keeps the lower. A gateway that served an episode's calls writes its key
again every `idle_s / 4`; a key idle for `idle_s` is deleted (as of the revision seen, so a key
written since stays). Every gateway watches the keys into its `AgentLimits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time

import msgpack
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyValueError
from nats.js.kv import KeyValue

from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.kv_watch import follow_kv, written_at
from swarmrl.services.common.tasks import Background
from swarmrl.services.gateway.limits import AgentLimits, OpenEpisode

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


KV_ERRORS = (nats.errors.Error, TimeoutError)  # KeyValueError is a nats.errors.Error


def slot_key(identity: str, slot: int) -> str:
    """KV key of `identity`'s slot `slot` (a digest keeps any identity to KV's key alphabet)."""
    return f"e.{hashlib.blake2b(identity.encode(), digest_size=12).hexdigest()}.{slot}"


class SharedEpisodes:
    """The NATS side of `AgentLimits`' episode bound (see the module docstring)."""

    def __init__(self, js: JetStreamContext, limits: AgentLimits, gateway: str) -> None:
        self.js, self.limits, self.gateway = js, limits, gateway
        self.kv: KeyValue  # bound by start()
        self.ready = asyncio.Event()  # set once the watch has delivered the live slots
        self._keys: dict[str, tuple[str, str]] = {}  # key -> (identity, episode), for deletes
        self._tasks = Background()  # the watch, the sweep and deletes of an episode's second slot

    @property
    def active(self) -> bool:
        return self.limits.max_episodes > 0

    @property
    def every_s(self) -> float:
        """How often a called episode's key is written again, and idle ones are looked for."""
        return min(self.limits.idle_s, bus.GROUPS_TTL_S) / 4

    async def start(self) -> None:
        self.kv = await self.js.key_value(S.GROUPS_BUCKET)
        self._tasks.spawn(
            follow_kv(self.js, self.kv, "e.>", self._apply, self.ready, "episodes"), watched=True
        )
        self._tasks.spawn(self._sweep(), watched=True)
        await self.ready.wait()

    async def stop(self) -> None:
        await self._tasks.close()

    def _value(self, identity: str, episode_id: str) -> bytes:
        """A slot's value: whose episode holds it, granted (or last called) by this gateway."""
        return json.dumps({"identity": identity, "episode": episode_id, "by": self.gateway}).encode()

    async def take(self, identity: str, episode_id: str, now: float) -> float:
        """0.0 once `episode_id` holds a slot of `identity` (now, or already), else the seconds to wait."""
        free = self.limits.free_slots(identity, episode_id, now)
        if free is None:
            return 0.0
        value = self._value(identity, episode_id)
        for slot in free:
            key = slot_key(identity, slot)
            stale = self.limits.holder(identity, slot)  # idle: its key is still there
            try:
                if stale is not None:
                    await self.kv.delete(key, last=stale.revision)
                revision = await self.kv.create(key, value)
            except KeyValueError:  # another gateway took the slot first (or wrote the stale one again)
                continue
            except KV_ERRORS as exc:
                log.warning("episodes: slot not taken (%r)", exc)
                break
            self._keys[key] = (identity, episode_id)
            self._hold(OpenEpisode(identity, episode_id, slot, revision, now, seen=now))
            return 0.0
        return self.limits.retry_after_s

    async def give_back(self, identity: str, episode_id: str) -> None:
        """Free the slot of an episode that will not start after all (admission refused it) or ended."""
        episode = self.limits.find(identity, episode_id)
        if episode is None:  # the watch may lag behind the grant: look for it
            episode = await self._lookup(identity, episode_id)
            if episode is None:
                return
        self.limits.closed(identity, episode_id)
        await self._free(episode)

    async def _lookup(self, identity: str, episode_id: str) -> OpenEpisode | None:
        for slot in range(self.limits.max_episodes):
            try:
                entry = await self.kv.get(slot_key(identity, slot))
            except KeyNotFoundError:
                continue
            except KV_ERRORS as exc:
                log.warning("episodes: slot %d of %s not read (%r)", slot, identity, exc)
                continue
            if entry.value and json.loads(entry.value).get("episode") == episode_id:
                return OpenEpisode(identity, episode_id, slot, entry.revision or 0, written_at(entry))
        return None

    def _apply(self, entry: KeyValue.Entry) -> None:
        if entry.operation is not None or not entry.value:  # deleted or purged: the slot is free
            identity, episode_id = self._keys.pop(entry.key, ("", ""))
            if identity:
                known = self.limits.find(identity, episode_id)
                if known is not None and slot_key(identity, known.slot) == entry.key:
                    self.limits.closed(identity, episode_id)
            return
        try:
            value = json.loads(entry.value)
            identity, episode_id = value["identity"], value["episode"]
            slot = int(entry.key.rsplit(".", 1)[1])
        except (ValueError, KeyError, IndexError) as exc:
            log.warning("episodes: ignored %s (%s)", entry.key, exc)
            return
        self._keys[entry.key] = (identity, episode_id)
        self._hold(OpenEpisode(identity, episode_id, slot, entry.revision or 0, written_at(entry)))

    def _hold(self, episode: OpenEpisode) -> None:
        """Record that `episode` holds its slot (taken here, or seen written). An episode given two
        slots at once (by two gateways) keeps the lower: every gateway that sees both frees the higher."""
        known = self.limits.find(episode.identity, episode.episode_id)
        if known is not None and known.slot != episode.slot:
            drop = episode if episode.slot > known.slot else known
            self._tasks.spawn(self._free(drop))
            if drop is episode:
                return
        self.limits.opened(episode)

    async def _free(self, episode: OpenEpisode) -> None:
        """Delete its slot's key as of its revision: one deleted, taken or written since is not ours."""
        with contextlib.suppress(*KV_ERRORS):
            await self.kv.delete(slot_key(episode.identity, episode.slot), last=episode.revision)

    async def _sweep(self) -> None:
        """Write again the keys of episodes called here; delete the keys of idle ones."""
        while True:
            await asyncio.sleep(self.every_s)
            now = time.monotonic()
            for episode in self.limits.due(now, self.every_s):
                key = slot_key(episode.identity, episode.slot)
                value = self._value(episode.identity, episode.episode_id)
                try:
                    episode.revision = await self.kv.update(key, value, last=episode.revision)
                    episode.written = now
                except KV_ERRORS as exc:  # deleted (it ended) or written by another gateway meanwhile
                    log.debug("episodes: %s not written again (%r)", key, exc)
            for episode in self.limits.idle(now):
                log.info("episodes: %s of %s idle for %.0f s: its slot is freed", episode.episode_id,
                         episode.identity, now - episode.last)  # fmt: skip
                await self.give_back(episode.identity, episode.episode_id)
