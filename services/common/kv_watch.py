"""Following a KV bucket: a watch whose replay of the stored keys ends where it should (`watch_kv`), the
keys that hold a value now (`live_keys`), every change applied as it comes (`follow_kv`), and when
an entry was written (`written_at`): how the gateways share their state through KV."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

log = logging.getLogger("swarmrl.bus")

KEYS_INACTIVE_S = 5.0
"""How long the server keeps the consumer that one `live_keys` call read through after it stopped."""


async def _stores(js: JetStreamContext, kv: KeyValue, pattern: str) -> bool:
    """Whether bucket `kv` holds a message under a key matching `pattern` now (a value or a marker)."""
    bucket = (await kv.status()).bucket  # its stream and subjects by the KV scheme (ADR-8)
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.{pattern}")
    return bool(info.state.subjects)


async def watch_kv(
    js: JetStreamContext, kv: KeyValue, pattern: str, **options: Any
) -> AsyncGenerator[KeyValue.Entry | None, None]:
    """`kv.watch(pattern, **options)`'s entries, with one `None` once the keys stored at its start
    are all delivered, then the later changes, until the caller stops iterating.

    nats-py's own `None` can come before the stored keys: the server may answer its "anything to
    deliver?" before the entries it already sent arrive (nats-io/nats.py#842). Here it is believed
    only if nothing under `pattern` is stored; otherwise the replay ends at the entry with nothing
    pending after it (`delta` 0), so every message must reach the caller (no `ignore_deletes`)."""
    if options.get("ignore_deletes"):
        raise ValueError("watch_kv needs every entry, deletes included: skip them in the caller")
    watcher = await kv.watch(pattern, **options)
    replayed = False
    try:
        async for entry in watcher:
            if entry is not None:
                yield entry
                if not replayed and not entry.delta:
                    replayed = True
                    yield None
            elif not replayed and not await _stores(js, kv, pattern):
                replayed = True
                yield None
    finally:
        with contextlib.suppress(nats.errors.Error):  # the connection is closed or the watch already gone
            await watcher.stop()


async def live_keys(js: JetStreamContext, kv: KeyValue, pattern: str = ">") -> list[str]:
    """The keys of `kv` matching `pattern` that hold a value now. Like `KeyValue.keys()`, but its
    consumer is gone `KEYS_INACTIVE_S` after (`keys()` leaves one for 5 minutes: a replica calling it
    every few seconds piled up to a stream's limit of 1,000, and the server then refused every new
    consumer of the bucket), and its end of the keys is `watch_kv`'s, not the early one of `keys()`."""
    keys = []
    entries = watch_kv(js, kv, pattern, meta_only=True, inactive_threshold=KEYS_INACTIVE_S)
    # a watch's replay cut off never ends by itself: hence the timeout
    async with contextlib.aclosing(entries), asyncio.timeout(LIVE_KEYS_TIMEOUT_S):
        async for entry in entries:
            if entry is None:  # every key stored at the start is delivered
                break
            if entry.operation is None:  # a value, not a delete or purge marker
                keys.append(entry.key)
    return keys


LIVE_KEYS_TIMEOUT_S = 10.0
"""Longest `live_keys` waits for its keys (then TimeoutError): a watch whose replay was cut by a
network partition delivers nothing more, and the leases' renewal loop waited on one for minutes
(`bench/results/partitions.md`)."""


def written_at(entry: KeyValue.Entry) -> float:
    """When a KV entry was written (the server's stamp), on this process's monotonic clock."""
    created: Any = entry.created
    age = time.time() - created.timestamp() if hasattr(created, "timestamp") else 0.0
    return time.monotonic() - max(age, 0.0)


async def follow_kv(
    js: JetStreamContext,
    kv: KeyValue,
    pattern: str,
    apply: Callable[[KeyValue.Entry], None],
    ready: asyncio.Event,
    what: str,
) -> None:
    """Apply every change of `kv`'s keys matching `pattern`, first its stored keys (then `ready` is
    set: `watch_kv` says when), until cancelled. A watch that fails is started again a second
    later: the stored keys come again, so `apply` must take an entry it has seen before."""
    while True:
        try:
            async with contextlib.aclosing(watch_kv(js, kv, pattern)) as entries:
                async for entry in entries:
                    if entry is None:
                        ready.set()
                    else:
                        apply(entry)
            return
        except Exception as exc:  # any error: the caller's view of the bucket must go on being followed
            log.error("%s: watch of %s failed (%r); watching again", what, pattern, exc)
        await asyncio.sleep(1.0)
