"""Partition leases in NATS KV: replicas of a service share its partitions, and take over a dead one's.

Each replica keeps two kinds of key in KV `swarm-leases` alive by renewing them (the bucket's TTL,
`bus.LEASE_TTL_S`, removes a key nobody renews):

- `<service>.member.<replica>`: it is alive;
- `<service>.lease.<p>`: it owns partition p. Taking one is a KV `create`, which the server grants to
  exactly one replica (it fails while the key holds a value); keeping one is an `update` against the
  revision the holder last wrote, which fails once the key expired or someone else holds it.

Every `tick` a replica renews what it holds, reads the live keys, and aims at its fair share,
ceil(partitions / live members): it takes free partitions up to it and gives back what it holds
beyond it; a dead replica's partitions are free `LEASE_TTL_S` later. `plan` is the pure core, `Leases`
does the KV calls, `LeasedWork` runs one task per leased partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import KeyValueError, NotFoundError
from nats.js.kv import KeyValue

from swarmrl.services.common.bus import LEASE_TTL_S, durable_pull
from swarmrl.services.common.kv_watch import live_keys

log = logging.getLogger("swarmrl.leases")


def fair_share(partitions: int, members: int) -> int:
    return math.ceil(partitions / max(members, 1))


def plan(partitions: int, held: set[int], taken: set[int], members: int) -> tuple[list[int], list[int]]:
    """(partitions to try to take, in random order; partitions to give back) for a replica that
    holds `held`, while `taken` (its own included) have a live lease and `members` replicas live."""
    share = fair_share(partitions, members)
    if len(held) > share:
        return [], sorted(held)[share:]
    free = [p for p in range(partitions) if p not in taken and p not in held]
    random.shuffle(free)  # replicas starting together do not all race for partition 0
    return free[: share - len(held)], []


@dataclass
class Leases:
    """One replica's leases on `partitions` partitions of `service` (see the module docstring)."""

    js: JetStreamContext
    kv: KeyValue
    service: str
    replica: str
    partitions: int
    held: dict[int, int] = field(default_factory=dict)
    """partition -> the revision of our lease key, as we last wrote it."""

    def _lease(self, p: int) -> str:
        return f"{self.service}.lease.{p}"

    @property
    def _member(self) -> str:
        return f"{self.service}.member.{self.replica}"

    async def tick(self) -> list[int]:
        """Renew, then rebalance; `held` is then what is ours (those lost, taken by someone else or
        expired, are gone from it: stop working on them at once). Returns the partitions to give
        back: still ours, held, until their work has stopped and they are `release`d."""
        await self.kv.put(self._member, self.replica.encode())
        # All renewals at once: one round trip, not one per lease (on a busy machine 17 in a row took
        # longer than the TTL, and the replica lost the leases it was renewing).
        held = list(self.held.items())
        renewed = await asyncio.gather(
            *(self.kv.update(self._lease(p), self.replica.encode(), last=rev) for p, rev in held),
            return_exceptions=True,
        )
        lost, failed = [], None
        for (p, _), rev in zip(held, renewed, strict=True):
            if isinstance(rev, KeyValueError):  # expired (we stalled past the TTL) or taken since
                del self.held[p]
                lost.append(p)
            elif isinstance(rev, BaseException):  # the broker away: the round fails (`LeasedWork.tick`)
                failed = rev
            else:
                self.held[p] = rev
        if failed is not None:
            raise failed
        keys = await live_keys(self.js, self.kv, f"{self.service}.>")
        members = sum(k.startswith(f"{self.service}.member.") for k in keys)
        prefix = f"{self.service}.lease."
        taken = {int(k.removeprefix(prefix)) for k in keys if k.startswith(prefix)}
        want, give_back = plan(self.partitions, set(self.held), taken, members)
        gained = []
        created = await asyncio.gather(
            *(self.kv.create(self._lease(p), self.replica.encode()) for p in want), return_exceptions=True
        )
        for p, rev in zip(want, created, strict=True):
            if isinstance(rev, KeyValueError):  # another replica was first
                continue
            if isinstance(rev, BaseException):  # not ours: if the server took it, it expires in a TTL
                log.warning("%s: lease %d not taken (%r)", self.service, p, rev)
                continue
            self.held[p] = rev
            gained.append(p)
        if gained or lost or give_back:
            log.info("%s %s: took %s, lost %s, giving back %s; holds %d of %d (%d members)", self.service,
                     self.replica, gained, lost, give_back, len(self.held), self.partitions, members)  # fmt: skip
        return give_back

    async def release(self, p: int) -> None:
        """Give partition `p` back now (its work stopped), so another replica takes it at its next tick."""
        rev = self.held.pop(p, None)
        if rev is None:
            return
        try:
            await self.kv.delete(self._lease(p), last=rev)
        except (KeyValueError, nats.errors.Error) as exc:  # expired or taken: not ours anyway
            log.warning("%s: lease %d not released (%r)", self.service, p, exc)

    async def leave(self) -> None:
        """Release every partition and the membership (a graceful stop)."""
        for p in list(self.held):
            await self.release(p)
        try:
            await self.kv.delete(self._member)
        except nats.errors.Error as exc:
            log.warning("%s: membership not removed (%r)", self.service, exc)


@dataclass
class LeasedWork:
    """One task per partition `leases` holds, `work(p, stop, owned)`, in step with the leases: each `tick`
    renews and rebalances them, then sets `stop` for the work of every partition lost, given back or
    fenced (no renewal round began for the TTL less `margin_s`: another replica may own it by now),
    releases a partition given back once its work has ended, and starts the work of the others held.
    A work that fails unasked raises out of `tick` (the service fails as a crash would), unless its
    error is one of `survive`: then it starts again at the next round if the partition is still ours.
    `owned()` says whether the partition is still ours to work on (held, and not fenced)."""

    leases: Leases
    work: Callable[[int, asyncio.Event, Callable[[], bool]], Coroutine[Any, Any, None]]
    margin_s: float
    survive: tuple[type[BaseException], ...] = ()
    running: dict[int, tuple[asyncio.Event, asyncio.Task[None]]] = field(default_factory=dict)
    releasing: set[int] = field(default_factory=set)
    renewed: float = field(default_factory=time.monotonic)
    """When the last renewal round that succeeded began (a round renews many keys, which takes
    seconds on a busy machine: its start is what the keys' expiry counts from)."""

    def fenced(self) -> bool:
        return time.monotonic() - self.renewed > LEASE_TTL_S - self.margin_s

    def owned(self, p: int) -> bool:
        return p in self.leases.held and not self.fenced()

    async def tick(self) -> None:
        began = time.monotonic()
        try:
            self.releasing.update(await self.leases.tick())
            self.renewed = began
        except (nats.errors.Error, TimeoutError) as exc:  # the broker is away: try again next round
            log.warning("%s: lease renewal failed: %r", self.leases.service, exc)
        keep = set() if self.fenced() else set(self.leases.held) - self.releasing
        for p, (stop, task) in list(self.running.items()):
            if p not in keep:
                stop.set()
            if task.done():
                del self.running[p]
                failed = None if task.cancelled() else task.exception()
                if failed is not None and not stop.is_set() and not isinstance(failed, self.survive):
                    raise failed
                if failed is not None:
                    log.warning("%s: partition %d stopped: %r", self.leases.service, p, failed)
        for p in sorted(self.releasing - set(self.running)):
            self.releasing.discard(p)
            await self.leases.release(p)
        for p in sorted(keep - set(self.running)):
            stop = asyncio.Event()
            task = asyncio.create_task(
                self.work(p, stop, partial(self.owned, p)), name=f"{self.leases.service}-p{p}"
            )
            self.running[p] = (stop, task)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop every work and wait for them to end (up to `timeout`)."""
        for stop, _ in self.running.values():
            stop.set()
        if self.running:
            await asyncio.wait([task for _, task in self.running.values()], timeout=timeout)


async def take_consumer(
    js: JetStreamContext, stream: str, prefix: str, name: str, subject: str, **options: Any
) -> tuple[JetStreamContext.PullSubscription, bool]:
    """A partition's new owner's consumer `name` on work-queue `stream` (`options`: `durable_pull`'s),
    after deleting the partition's others (named `prefix...`): a work queue allows one consumer per
    partition, and an owner that lost its lease unnoticed then reads from a deleted consumer, nothing.
    Also returns whether an earlier owner's consumer existed."""
    existed = False
    for info in await js.consumers_info(stream):
        if info.name.startswith(prefix):
            existed = True
            with contextlib.suppress(NotFoundError):
                await js.delete_consumer(stream, info.name)
    return await durable_pull(js, stream, name, subject, **options), existed
