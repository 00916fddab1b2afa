"""A KV watch's replay ends after the keys stored at its start, on a real nats-server: `watch_kv`,
which `follow_kv` (the gateways' views of groups and episodes) and `live_keys` (leases) read through.

nats-py can send its end-of-replay marker (`None`) before the stored keys (nats-io/nats.py#842: the
server answers the watch's consumer-info request before the entries it already sent arrive). That
ordering is timing-bound, so `EarlyMarker` makes every watch start with it: a gateway started now
must still know every group admitted before, not none of them (what CI saw once)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from swarmrl.services.common.kv_watch import follow_kv, live_keys, watch_kv


class EarlyMarker:
    """Bucket `kv`, whose watches yield nats-py's end-of-replay marker first, before any entry."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def status(self) -> KeyValue.BucketStatus:
        return await self.kv.status()

    async def watch(self, pattern: str, **options: Any) -> EarlyMarker.Watch:
        return EarlyMarker.Watch(await self.kv.watch(pattern, **options))

    class Watch:
        def __init__(self, watcher: KeyValue.KeyWatcher) -> None:
            self.watcher, self.first = watcher, True

        def __aiter__(self) -> EarlyMarker.Watch:
            return self

        async def __anext__(self) -> KeyValue.Entry | None:
            if self.first:
                self.first = False
                return None
            return await self.watcher.__anext__()

        async def stop(self) -> None:
            await self.watcher.stop()


@pytest.fixture
async def kv(js: JetStreamContext) -> KeyValue:
    return await js.create_key_value(bucket="watched", history=1)


async def follow(js: JetStreamContext, kv: Any, pattern: str) -> tuple[dict[str, bytes], asyncio.Task[None]]:
    """Follow `pattern` until `ready`: the keys and values applied (as they are at `ready` until the
    caller next awaits, kept up to date after), and the task that goes on."""
    seen: dict[str, bytes] = {}
    ready = asyncio.Event()

    def apply(entry: KeyValue.Entry) -> None:
        if entry.operation is None:
            seen[entry.key] = entry.value or b""
        else:
            seen.pop(entry.key, None)

    task = asyncio.create_task(follow_kv(js, kv, pattern, apply, ready, "test"))
    await asyncio.wait_for(ready.wait(), timeout=10)
    return seen, task


@pytest.mark.parametrize("early", [False, True], ids=["as-sent", "marker-first"])
async def test_a_watch_is_ready_only_once_every_stored_key_is_applied(
    js: JetStreamContext, kv: KeyValue, early: bool
):
    for i in range(60):
        await kv.put(f"g.{i}", str(i).encode())
    await kv.put("a.other", b"x")  # outside the pattern
    await kv.delete("g.7")
    watched = EarlyMarker(kv) if early else kv

    seen, task = await follow(js, watched, "g.>")
    at_ready = dict(seen)
    try:
        assert at_ready == {f"g.{i}": str(i).encode() for i in range(60) if i != 7}
        assert sorted(await live_keys(js, watched, "g.>")) == sorted(at_ready)  # type: ignore[arg-type]
    finally:
        task.cancel()


@pytest.mark.parametrize("early", [False, True], ids=["as-sent", "marker-first"])
async def test_nothing_stored_under_the_pattern_is_ready_at_once_and_later_keys_still_come(
    js: JetStreamContext, kv: KeyValue, early: bool
):
    await kv.put("a.other", b"x")  # the bucket is not empty, the pattern is
    watched = EarlyMarker(kv) if early else kv
    seen, task = await follow(js, watched, "g.>")
    try:
        assert seen == {}
        assert await live_keys(js, watched, "g.>") == []  # type: ignore[arg-type]
        await kv.put("g.late", b"1")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == {"g.late": b"1"}
    finally:
        task.cancel()


async def test_live_keys_ends_when_the_last_stored_message_is_a_delete(js: JetStreamContext, kv: KeyValue):
    """The last message a replay delivers may be a delete marker: the end must not depend on a value."""
    await kv.put("m.a", b"1")
    await kv.put("m.b", b"1")
    await kv.delete("m.b")
    keys = await asyncio.wait_for(live_keys(js, EarlyMarker(kv), "m.>"), timeout=10)  # type: ignore[arg-type]
    assert keys == ["m.a"]


async def test_watch_kv_refuses_to_drop_deletes(js: JetStreamContext, kv: KeyValue):
    with pytest.raises(ValueError, match="deletes"):
        async for _ in watch_kv(js, kv, ">", ignore_deletes=True):
            pass
