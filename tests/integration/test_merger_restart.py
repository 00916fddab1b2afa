"""SIGKILL a merger process mid-run: restarted alone, or covered by a second replica that was sharing
the partitions with it, every ended episode's samples appear exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import Event
from swarmrl.schemas import subjects as S
from swarmrl.services.common.kv_watch import live_keys
from tests.conftest import wait_for
from tests.integration.merger_support import (
    awaited_equals,
    chain_episode,
    merge_stats,
    merger_settled,
    publish,
    read_stream,
    samples,
    stream_count,
)

EPISODES = 180
WAVE = 30  # episodes open at the same time
ABORT_EVERY = 7


def spawn_merger(server: NatsServer, log: Path, replica: str = "") -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "swarmrl.cli", "serve", "merger", "--replica", replica,
           "--episode-timeout-s", "60", "--ack-wait-s", "3", "--stats-interval-s", "1"]  # fmt: skip
    with log.open("ab") as err:  # credentials by environment, never on the command line
        env = os.environ | {"SWARMRL_NATS": server.url("merger")}
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)


async def publish_waves(js: JetStreamContext, episodes: list[list[Event]], killed: asyncio.Event) -> None:
    """Interleave WAVE episodes at a time; halfway, hold back the ends until the merger was killed."""
    waves = [episodes[i : i + WAVE] for i in range(0, len(episodes), WAVE)]
    for w, wave in enumerate(waves):
        for k in range(len(wave[0])):
            if w == len(waves) // 2 and k == len(wave[0]) - 1:
                await killed.wait()  # this wave is open (begun, calls made) while the merger dies
            for events in wave:
                await publish(js, events[k])


async def mid_run(js: JetStreamContext) -> bool:
    """Some samples are out and the merger holds unacked events (so the restart has to replay)."""
    held = sum(c.num_ack_pending or 0 for c in await js.consumers_info(S.EPISODE_PARTS_STREAM))
    return bool(held) and await stream_count(js, S.SAMPLES_STREAM) > 0


async def leases(js: JetStreamContext, service: str = "merger") -> dict[str, int]:
    """Partitions held per `service` replica (KV swarm-leases)."""
    kv = await js.key_value(S.LEASES_BUCKET)
    held: dict[str, int] = {}
    for key in await live_keys(js, kv, f"{service}.lease.>"):
        try:
            entry = await kv.get(key)
        except NotFoundError:  # expired since it was listed
            continue
        owner = (entry.value or b"").decode()
        held[owner] = held.get(owner, 0) + 1
    return held


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_killed_merger_loses_and_doubles_nothing(
    replicas: int, swarm_nats: NatsServer, tmp_path: Path
) -> None:
    """One replica: it is restarted, and takes its partitions back once the dead one's leases expired.
    Two: the survivor takes the dead one's partitions over; nothing is restarted."""
    ids = [f"ep{i:03d}" for i in range(EPISODES)]
    aborted = {eid for i, eid in enumerate(ids) if i % ABORT_EVERY == 3}
    episodes = [chain_episode(eid, turns=3, outcome="abort" if eid in aborted else "end") for eid in ids]
    expected = {f"{eid}.a.m.0" for eid in ids if eid not in aborted}
    log = tmp_path / "merger.log"

    nc = await nats.connect(swarm_nats.service_url)
    js = nc.jetstream()
    killed = asyncio.Event()
    mergers = [spawn_merger(swarm_nats, log, f"m{i}") for i in range(replicas)]
    if replicas == 2:  # both at work before any event: each holds half of the partitions
        want = {"m0": S.EPISODE_PARTITIONS // 2, "m1": S.EPISODE_PARTITIONS // 2}
        await wait_for(
            lambda: awaited_equals(leases(js), want), timeout=30, what="two replicas sharing the partitions"
        )
    publisher = asyncio.create_task(publish_waves(js, episodes, killed))
    first = mergers[0]
    try:
        await wait_for(lambda: mid_run(js), timeout=30, what="samples published and events held")
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        got_before = await stream_count(js, S.SAMPLES_STREAM)
        killed.set()
        await asyncio.wait_for(publisher, timeout=30)

        if replicas == 1:
            mergers.append(spawn_merger(swarm_nats, log, "m1"))
        await wait_for(lambda: awaited_equals(leases(js), {"m1": S.EPISODE_PARTITIONS}), timeout=30,
                       what="the survivor holding every partition")  # fmt: skip
        await wait_for(lambda: merger_settled(js), timeout=40, what=f"replay after the kill; log {log}")
        got = await samples(js)
        stats = await merge_stats(js)
        dead = [m.headers["Swarm-Reason"] for m in await read_stream(js, S.DLQ_STREAM)]

        mergers[-1].send_signal(signal.SIGTERM)
        assert mergers[-1].wait(timeout=15) == 0
        assert await leases(js) == {}  # a clean stop gives its leases back at once
    finally:
        for proc in mergers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await nc.close()

    text = log.read_text()
    assert "merger m1: took [" in text, text[-3000:]  # the survivor or successor took partitions over
    assert 0 < got_before < len(expected), "the kill must fall mid-run"
    sample_ids = [s.sample_id for s in got]
    assert len(sample_ids) == len(set(sample_ids)), "a sample was published twice"
    assert set(sample_ids) == expected
    assert all(s.n_calls == 3 and sum(s.loss_mask) == 2 + 3 + 4 for s in got)
    assert sorted(s.episode_id for s in stats) == ids  # one MergeStats per episode, none doubled
    assert {s.episode_id for s in stats if s.status == "aborted"} == aborted
    # A kill between the acks of one episode leaves its later events to be dead-lettered on replay as
    # unknown_episode (its samples were already published); nothing else may reach the DLQ.
    assert all(r.startswith("unknown_episode:") for r in dead), dead
