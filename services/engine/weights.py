"""The weight watcher: follows KV `swarm-models[<model>]` and reloads the engine on every newer version.
A failed reload is retried with backoff, forever while the engine is unreachable or erroring (5xx),
`max_refusals` times while it refuses the checkpoint (4xx); undecodable values are dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from swarmrl.schemas import ModelVersion, WireError, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.objects import WeightsUnavailable, local_weights
from swarmrl.services.common.tasks import wait_set
from swarmrl.services.engine.client import EngineClient, EngineError, parse_weight_version

log = logging.getLogger("swarmrl.engine.weights")


class WeightWatcher:
    """Run with `await watcher.run(stop)`; `applied` is the version the engine serves (None: unknown)."""

    def __init__(
        self,
        nc: NATS,
        engine: EngineClient,
        model: str,
        *,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        max_refusals: int = 5,
    ) -> None:
        self.js = nc.jetstream()
        self.engine = engine
        self.model = S.check_token(model, "model name")
        self.retry_s, self.max_retry_s, self.max_refusals = retry_s, max_retry_s, max_refusals
        self.dead_letters = bus.DeadLetters(nc, "engine")
        self.applied: int | None = None
        self.counts: Counter[str] = Counter()  # reloaded, bad_value, reload_error, gave_up, stale
        self._pending: ModelVersion | None = None  # newest version seen and not applied yet
        self._failures, self._refusals, self._next_try = 0, 0, 0.0  # attempts on `_pending`

    async def run(self, stop: asyncio.Event) -> None:
        kv = await self._bucket(stop)
        if kv is None:
            return
        try:  # what the engine serves now, so that an equal version in KV is a no-op
            self.applied = parse_weight_version((await self.engine.model_info()).get("weight_version"))
        except EngineError as exc:  # unknown: the current KV value will be (re)applied, which is harmless
            log.warning("could not read the engine's weight_version: %s", exc)
        watcher = await kv.watch(self.model)
        log.info(
            "watching %s[%s]; engine serves weight_version=%s", S.MODELS_BUCKET, self.model, self.applied
        )
        try:
            while not stop.is_set():
                try:
                    entry = await watcher.updates(timeout=0.5)
                except nats.errors.TimeoutError:
                    entry = None
                if entry is not None:
                    await self._consider(entry)
                if self._pending is not None and asyncio.get_running_loop().time() >= self._next_try:
                    await self._reload(self._pending)
        finally:
            await watcher.stop()

    async def _reload(self, target: ModelVersion) -> None:
        """One reload attempt; on failure, schedule the next one (or give up on a refused version)."""
        what = f"{self.model} v{target.version}"
        try:  # a version trained on another host: fetched from the object store first
            path = await local_weights(self.js, self.model, target)
            await self.engine.update_weights_from_disk(path, target.version)
        except (EngineError, WeightsUnavailable) as exc:
            self.counts["reload_error"] += 1
            self._failures += 1
            self._refusals += int(400 <= exc.status < 500)
            if self._refusals >= self.max_refusals:
                log.error("giving up on %s after %d refusals: %s", what, self._refusals, exc)
                self.counts["gave_up"] += 1
                self._pending = None
                return
            delay = min(self.retry_s * 2 ** (self._failures - 1), self.max_retry_s)
            log.warning("reload of %s failed (retry in %.1fs): %s", what, delay, exc)
            self._next_try = asyncio.get_running_loop().time() + delay
            return
        self.applied, self._pending = target.version, None
        self.counts["reloaded"] += 1
        log.info("engine reloaded %s from %s", what, path)

    async def _consider(self, entry: KeyValue.Entry) -> None:
        """Decode one KV entry; keep it as the pending target if it is newer than anything seen."""
        if entry.operation in (KV_DEL, KV_PURGE) or entry.value is None:
            log.info("%s[%s] deleted; keeping the current weights", S.MODELS_BUCKET, self.model)
            return
        try:
            mv = decode(entry.value, ModelVersion)
        except WireError as exc:
            self.counts["bad_value"] += 1
            reason = f"{exc.code}: {S.MODELS_BUCKET}[{self.model}] revision {entry.revision}: {exc.detail}"
            try:
                await self.dead_letters.send(
                    None, reason, data=entry.value, subject=f"{S.MODELS_BUCKET}.{self.model}"
                )
            except Exception as dlq_exc:  # dead-lettering is best effort; the value is already logged
                log.error("could not dead-letter a bad %s value: %s", S.MODELS_BUCKET, dlq_exc)
            return
        known = [v for v in (self.applied, self._pending.version if self._pending else None) if v is not None]
        if known and mv.version <= max(known):
            self.counts["stale"] += 1
            return
        self._pending = mv
        self._failures, self._refusals, self._next_try = 0, 0, 0.0  # a new target starts afresh

    async def _bucket(self, stop: asyncio.Event) -> KeyValue | None:
        """The models bucket, waiting for it to be created (the swarm may be set up after the engine)."""
        while not stop.is_set():
            try:
                return await bus.models_kv(self.js)
            except RuntimeError as exc:
                log.warning("%s; retrying", exc)
                await wait_set(stop, 2.0)
        return None
