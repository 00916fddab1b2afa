"""The local 3-node JetStream cluster (`tests/support/nats_cluster.py`): replicated streams survive a killed
node, the node comes back current on its store, and one agent registry reaches every node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from swarmrl.infra.credentials import AgentRegistry
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.retry import retry
from tests.conftest import wait_for
from tests.support.nats_cluster import NatsCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "nats") as c:
        yield c


async def test_a_killed_node_loses_nothing_and_comes_back_current(
    cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMRL_STREAM_REPLICAS", "3")
    nc = await bus.connect(cluster.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    info = await js.stream_info(S.METRICS_STREAM)
    assert info.config.num_replicas == 3 and info.cluster is not None
    for i in range(10):
        await js.publish(S.MERGE_METRICS_SUBJECT, b"x", headers={"Nats-Msg-Id": f"m{i}"})
    cluster.kill(1)
    assert not cluster.healthy(1)
    never = asyncio.Event()
    for i in range(10, 20):  # two of three replicas: still a quorum, once a leader is re-elected
        headers = {"Nats-Msg-Id": f"m{i}"}
        await asyncio.wait_for(retry(never, js.publish, S.MERGE_METRICS_SUBJECT, b"x", headers=headers), 30)
    cluster.restart(1)
    await asyncio.to_thread(cluster.wait_ready, 60)

    async def current() -> bool:
        ci = (await js.stream_info(S.METRICS_STREAM)).cluster
        assert ci is not None
        node = cluster.names()[1]
        return ci.leader == node or any(r.name == node and r.current for r in ci.replicas or [])

    await wait_for(current, timeout=30, what="the restarted node's replica to be current")
    assert (await js.stream_info(S.METRICS_STREAM)).state.messages == 20
    await nc.close()


async def test_one_registry_reaches_every_node(cluster: NatsCluster) -> None:
    # Each node wrote its own pid file into the shared conf dir: a mint reloads all three.
    assert sorted(p.name for p in cluster.conf_dir.glob("*.pid")) == [
        "cluster-node1.pid", "cluster-node2.pid", "cluster-node3.pid",
    ]  # fmt: skip
    cred = AgentRegistry(cluster.conf_dir).mint("late-agent")
    for node in cluster.nodes:
        nc = await nats.connect(
            **cred.with_servers([node.plain_url]).nats_options(), max_reconnect_attempts=0
        )
        await nc.close()


async def test_a_consumer_outlives_its_leader_node(
    cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pull requests get 503 until the consumer's replicas elect a new leader: `bus.batches` waits it
    out (before, the merger crashed on it whenever a node died)."""
    monkeypatch.setenv("SWARMRL_STREAM_REPLICAS", "3")
    nc = await bus.connect(cluster.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    sub = await bus.durable_pull(js, S.METRICS_STREAM, "test-durable", f"{S.METRICS_PREFIX}.>")
    leader = (await js.consumer_info(S.METRICS_STREAM, "test-durable")).cluster
    assert leader is not None
    cluster.kill(cluster.names().index(leader.leader))
    never = asyncio.Event()
    for i in range(5):  # the stream's leader may have been on that node too
        headers = {"Nats-Msg-Id": f"after-{i}"}
        await asyncio.wait_for(retry(never, js.publish, S.MERGE_METRICS_SUBJECT, b"x", headers=headers), 30)
    stop = asyncio.Event()
    got: list[bytes] = []
    dead_letters = bus.DeadLetters(nc, "test")

    async def consume() -> None:
        async for msgs in bus.batches(sub, stop, 10, timeout=0.5, dead_letters=dead_letters):
            for msg in msgs:
                got.append(msg.data)
                await msg.ack()
            if len(got) >= 5:
                stop.set()

    await asyncio.wait_for(consume(), timeout=60)
    assert len(got) == 5
    await nc.close()
