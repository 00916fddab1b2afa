"""Which of a model's trainer processes trains: the lead, by lease; the others stand by with the model
loaded (most of a restart's cost, `bench/results/recovery-trainer.md`) and take over from the newest
checkpoint when it dies.

- The lease is the key `trainer.lead.<model>` of KV `swarm-leases`, taken with a `create` (granted to
  one process) and renewed every `RENEW_S` with an `update` against the revision the lead wrote.
- The lead answers on `swarm.lead.trainer.<model>`; a standby asks every `PROBE_S`, and when nobody
  answered for `GONE_S` it deletes the dead lead's key (that revision only) and takes it.
- A lead that loses the key stops: `confirm` runs before every version it publishes, and `hold`
  raises `LostLead`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyValueError
from nats.js.kv import KeyValue

from swarmrl.schemas import subjects as S
from swarmrl.services.common.tasks import wait_set

log = logging.getLogger("swarmrl.trainer")

RENEW_S = 1.0
"""How often the lead renews its lease (well inside `bus.LEASE_TTL_S`, 6 s)."""
PROBE_S = 0.25
"""How often a standby asks whether the lead is there."""
GONE_S = 1.0
"""A lead no one has heard for this long is gone (a NATS node's restart moves it in well under)."""


class LostLead(RuntimeError):
    """Another process holds the lead: this one must stop training."""


class Lead:
    """One trainer process's claim on `model`'s lead (see the module docstring)."""

    def __init__(self, nc: NATS, kv: KeyValue, model: str, replica: str) -> None:
        self.nc, self.kv, self.model, self.replica = nc, kv, model, replica
        self.key, self.subject = S.lead_key(model), S.lead_subject(model)
        self.revision: int | None = None
        self._renewing = asyncio.Lock()
        """`hold` and `confirm` both renew: one at a time, each against the revision the last wrote."""

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this process leads (True), or `stop` is set (False)."""
        heard = time.monotonic()
        while not stop.is_set():
            try:
                if await self.take():
                    log.info("model=%s replica %s leads", self.model, self.replica)
                    await self.nc.subscribe(self.subject, cb=self._answer)
                    return True
                await self.nc.request(self.subject, b"", timeout=PROBE_S * 4)
                heard = time.monotonic()
            except nats.errors.NoRespondersError:
                if time.monotonic() - heard >= GONE_S:
                    await self.depose()
                    continue
            except (nats.errors.Error, TimeoutError):  # a busy lead, or a broker away: no proof of death
                pass
            await wait_set(stop, PROBE_S)
        return False

    async def take(self) -> bool:
        try:
            self.revision = await self.kv.create(self.key, self.replica.encode())
            return True
        except KeyValueError:  # held (KeyWrongLastSequenceError)
            return False

    async def depose(self) -> None:
        """Delete the silent lead's key (that revision only: a key a live lead renewed since stays)."""
        try:
            entry = await self.kv.get(self.key)
            await self.kv.delete(self.key, last=entry.revision)
        except KeyNotFoundError:  # expired meanwhile: free to take
            return
        except (nats.errors.Error, TimeoutError) as exc:  # renewed since, or a broker away: ask again
            log.info("model=%s lead key not deleted (%r)", self.model, exc)
            return
        holder = (entry.value or b"").decode()
        log.warning(
            "model=%s lead %s does not answer: replica %s takes over", self.model, holder, self.replica
        )

    async def _answer(self, msg: Msg) -> None:
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(self.replica.encode())

    async def confirm(self) -> None:
        """Renew the lease now; LostLead if it is no longer ours."""
        async with self._renewing:
            try:
                self.revision = await self.kv.update(self.key, self.replica.encode(), last=self.revision)
            except KeyValueError as exc:
                # An update the server applied but whose answer was lost leaves our revision behind:
                # the key still names this process, so it is ours (a standby deletes, never writes it).
                try:
                    entry = await self.kv.get(self.key)
                except KeyNotFoundError:
                    entry = None
                if entry is None or entry.value != self.replica.encode():
                    raise LostLead(
                        f"model={self.model}: replica {self.replica} lost the lead ({exc!r})"
                    ) from None
                self.revision = await self.kv.update(self.key, self.replica.encode(), last=entry.revision)

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew every `RENEW_S` until `stop`; LostLead when another process took the lead. A broker
        away is retried (without NATS the lead publishes nothing either)."""
        while not stop.is_set():
            if await wait_set(stop, RENEW_S):
                return
            try:
                await self.confirm()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("model=%s lead renewal failed: %r", self.model, exc)

    async def leave(self) -> None:
        """Give the lead up now (a graceful stop), so a standby takes it at its next probe."""
        if self.revision is not None:
            with contextlib.suppress(KeyValueError, nats.errors.Error):
                await self.kv.delete(self.key, last=self.revision)
