"""A client keeps its place in its task streams across restarts (KV `swarm-clients`), on a real
nats-server with agent identities: it reaches its own key and no other."""

from __future__ import annotations

import itertools

import nats
import pytest

from swarmrl.agents.runner import TaskCursor
from swarmrl.agents.sdk import SwarmClient
from swarmrl.agents.tasks import get_task
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import ClientState, decode
from swarmrl.schemas import subjects as S


async def test_a_client_saves_and_loads_its_own_state(swarm_nats: NatsServer) -> None:
    cred = swarm_nats.mint_agent("alice")
    alice = await SwarmClient.connect(cred, retry_s=2.0)
    assert await alice.load_state() is None
    await alice.save_state(ClientState(seed=3, rounds=7, drawn={"calculator": 7}))
    await alice.close()

    again = await SwarmClient.connect(cred, retry_s=2.0)  # a new process with the same identity
    state = await again.load_state()
    await again.close()
    assert state is not None and (state.seed, state.rounds, state.drawn) == (3, 7, {"calculator": 7})

    # The services see it in the bucket under the client's name.
    nc = await nats.connect(swarm_nats.service_url)
    entry = await (await nc.jetstream().key_value(S.CLIENTS_BUCKET)).get("alice")
    await nc.close()
    assert decode(entry.value, ClientState).rounds == 7


async def test_a_client_cannot_read_or_write_another_clients_state(swarm_nats: NatsServer) -> None:
    alice = await SwarmClient.connect(swarm_nats.mint_agent("alice"), retry_s=2.0)
    await alice.save_state(ClientState(seed=0, rounds=5))
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    cred = swarm_nats.mint_agent("mallory")
    nc = await nats.connect(**cred.nats_options(), error_cb=on_error, max_reconnect_attempts=0)
    put, get = S.client_state_subjects("alice")
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(get, b"", timeout=1.0)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.jetstream().publish(put, b"\x80", timeout=1.0)
    await nc.close()
    assert sum("permissions violation" in e.lower() for e in errors) == 2, errors
    state = await alice.load_state()
    await alice.close()
    assert state is not None and state.rounds == 5  # untouched


async def test_a_restarted_client_continues_its_task_stream(swarm_nats: NatsServer) -> None:
    """Five rounds, a restart, five more: the ten instances are the stream's first ten, with no
    repeat, where the old runner replayed the first five."""
    spec = get_task("calculator")
    cred = swarm_nats.mint_agent("calculator-0")
    weights = {"calculator": 1.0}
    played = []
    for _ in range(2):
        swarm = await SwarmClient.connect(cred, retry_s=2.0)
        cursor = await TaskCursor.resume(swarm, 1000, [spec])
        for _ in range(5):
            _, instance, _ = await cursor.next(weights)
            played.append(instance.task_id)
        await swarm.close()  # as a SIGKILL would: nothing is saved on the way out
    expected = [t.task_id for t in itertools.islice(spec.train_tasks(1000), 10)]
    assert played == expected

    # Another seed starts its own stream from its beginning.
    swarm = await SwarmClient.connect(cred, retry_s=2.0)
    cursor = await TaskCursor.resume(swarm, 1001, [spec])
    _, instance, round_ = await cursor.next(weights)
    await swarm.close()
    assert (instance.task_id, round_) == (next(spec.train_tasks(1001)).task_id, 1)
