"""Agents are untrusted: each attack a security probe ran with an agent credential, refused by the
real nats-server (accounts, per-client nkey users and permissions) or by the real gateway.

Two clients, `alice` and `mallory`, each with its own identity; the services use the service role.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import nats
import pytest
from nats.aio.client import Client as NATS

from swarmrl.agents.sdk import SwarmClient, SwarmError
from swarmrl.infra.credentials import AgentCredential
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import (
    MAX_EVENT_BYTES,
    BeginEvent,
    ModelVersion,
    RewardEvent,
    Sample,
    TokenRequest,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.gateway.config import GatewayConfig
from swarmrl.services.gateway.service import GatewayService


class Agent:
    """A raw nats-py connection with one identity, recording the server's errors."""

    def __init__(self, nc: NATS, errors: list[str], cred: AgentCredential) -> None:
        self.nc, self.errors, self.cred = nc, errors, cred

    async def violation(self) -> str:
        for _ in range(100):
            if any("permissions violation" in e.lower() for e in self.errors):
                return next(e for e in self.errors if "permissions violation" in e.lower())
            await asyncio.sleep(0.02)
        raise AssertionError(f"no permissions violation reported; errors: {self.errors}")


async def connect(server: NatsServer, name: str) -> Agent:
    cred = server.agent if name == "agent" else server.mint_agent(name)
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(**cred.nats_options(), error_cb=on_error, max_reconnect_attempts=0)
    return Agent(nc, errors, cred)


@pytest.fixture
async def gateway(swarm_nats: NatsServer) -> AsyncIterator[GatewayService]:
    """The gateway's NATS responders (tokens, completions); minting tokens needs no engine."""
    nc = await nats.connect(swarm_nats.service_url)
    service = GatewayService(
        GatewayConfig(nats=swarm_nats.service_url, port=0), nc, models=dict.fromkeys(["policy"])
    )  # type: ignore[arg-type]
    await service.start_nats()
    yield service
    await nc.close()


async def stream_counts(server: NatsServer) -> dict[str, int]:
    nc = await nats.connect(server.service_url)
    js = nc.jetstream()
    out = {s: (await js.stream_info(s)).state.messages for s in S.STREAM_SUBJECTS}
    out["kv"] = (await js.stream_info(f"KV_{S.MODELS_BUCKET}")).state.messages
    await nc.close()
    return out


def token_request(episode_id: str) -> bytes:
    return encode(TokenRequest(episode_id=episode_id, models=["policy"], ttl_s=60.0, group_key="g",
                               client_id="c", client_version="v"))  # fmt: skip


async def test_an_agent_publishes_its_own_episodes_and_gets_its_tokens(
    swarm_nats: NatsServer, gateway: GatewayService
) -> None:
    alice = await connect(swarm_nats, "alice")
    ev = BeginEvent(episode_id="alice_1", seq=0, client_id="c", task_id="t")
    ack = await alice.nc.jetstream().publish(
        S.episode_subject("alice_1", "begin"), encode(ev), headers={"Nats-Msg-Id": ev.msg_id}
    )
    assert ack.stream == S.EPISODES_STREAM  # a JetStream publish across accounts gets its PubAck
    answer = msgpack.unpackb(
        (await alice.nc.request(S.token_subject("alice"), token_request("alice_1"))).data
    )
    assert set(answer["tokens"]) == {"agent"}
    await alice.nc.close()


async def test_no_agent_sees_another_agents_inbox_or_any_service_traffic(
    swarm_nats: NatsServer, gateway: GatewayService
) -> None:
    """The probe read 3,735 messages in 25 s on `_INBOX.>`: tokens, completions, pull deliveries."""
    mallory = await connect(swarm_nats, "mallory")
    await mallory.nc.subscribe("_INBOX.>")
    assert "_inbox.>" in (await mallory.violation()).lower()
    mallory.errors.clear()
    await mallory.nc.subscribe("_INBOX.alice.>")
    await mallory.violation()
    for others in ("swarm.metrics.outcome.alice.*", "swarm.metrics.outcome.>", "swarm.metrics.>"):
        mallory.errors.clear()
        await mallory.nc.subscribe(others)  # what became of alice's groups is alice's to read
        await mallory.violation()
    # Its own inbox prefix is allowed, but the services live in another account: a service message
    # to `_INBOX.mallory.x` (or a pull delivery, or alice's token reply) never reaches it.
    seen: list[str] = []

    async def spy(msg: Any) -> None:
        seen.append(msg.subject)

    await mallory.nc.subscribe("_INBOX.mallory.>", cb=spy)
    await mallory.nc.flush()
    svc = await nats.connect(swarm_nats.service_url)
    await svc.publish("_INBOX.mallory.spy", b"service traffic")
    alice = await connect(swarm_nats, "alice")
    await alice.nc.request(S.token_subject("alice"), token_request("alice_2"))
    await svc.flush()
    await asyncio.sleep(0.3)
    assert seen == []
    for nc in (svc, alice.nc, mallory.nc):
        await nc.close()


async def test_an_agent_cannot_write_into_or_get_tokens_for_another_agents_episode(
    swarm_nats: NatsServer, gateway: GatewayService
) -> None:
    mallory = await connect(swarm_nats, "mallory")
    js = mallory.nc.jetstream()
    reward = RewardEvent(episode_id="alice_1", seq=5, client_id="m", value=100.0)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await js.publish(S.episode_subject("alice_1", "reward"), encode(reward), timeout=0.5)
    await mallory.violation()
    # Under its own name the server accepts the subject; the consumers dead-letter it as
    # `not_owner` (tests/integration/test_merger.py, test_ledger.py).
    answer = msgpack.unpackb(
        (await mallory.nc.request(S.token_subject("mallory"), token_request("alice_1"))).data
    )
    assert answer["error"].startswith("not_owner")
    mallory.errors.clear()
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await mallory.nc.request(S.token_subject("alice"), token_request("alice_1"), timeout=0.5)
    await mallory.violation()
    await mallory.nc.close()
    assert (await stream_counts(swarm_nats))[S.EPISODES_STREAM] == 0


async def test_the_sdk_refuses_an_episode_id_it_does_not_own(swarm_nats: NatsServer) -> None:
    swarm = await SwarmClient.connect(swarm_nats.agent)
    with pytest.raises(SwarmError, match="not this client's"):
        swarm.episode("t", models=["policy"], episode_id="alice_1")
    assert swarm.episode("t", models=["policy"]).episode_id.startswith("agent_")
    await swarm.close()


@pytest.mark.parametrize(
    "reply",
    [
        S.samples_subject("policy"),
        f"$KV.{S.MODELS_BUCKET}.policy",
        S.control_subject("stop"),
        S.dlq_subject("merger"),
        S.episode_subject("alice_1", "reward"),
        "$JS.API.STREAM.PURGE.EPISODES",
    ],
)
async def test_a_reply_subject_cannot_aim_a_service_at_a_service_subject(
    swarm_nats: NatsServer, gateway: GatewayService, reply: str
) -> None:
    """The probe moved the KV revision and planted a dead letter this way."""
    before = await stream_counts(swarm_nats)
    mallory = await connect(swarm_nats, "mallory")
    await mallory.nc.publish(S.token_subject("mallory"), token_request("mallory_1"), reply=reply)
    await mallory.nc.publish(S.llm_subject("policy"), b'{"api_key": "x", "request": {}}', reply=reply)
    await mallory.nc.flush()
    await asyncio.sleep(0.5)  # the gateway answers within milliseconds
    assert await stream_counts(swarm_nats) == before
    await mallory.nc.close()


@pytest.mark.parametrize(
    "subject",
    [
        S.samples_subject("policy"),  # samples
        f"$KV.{S.MODELS_BUCKET}.policy",  # weights
        S.control_subject("stop"),  # control
        S.episode_subject("agent", "llm"),  # llm events are the gateway's
        S.train_metrics_subject("policy"),
        "$JS.API.STREAM.DELETE.SAMPLES",
        S.GATEWAY_CALLS,  # a forged tally would spend another agent's rate
    ],
)
async def test_agent_cannot_publish_outside_its_role(swarm_nats: NatsServer, subject: str) -> None:
    agent = await connect(swarm_nats, "agent")
    payload = encode(ModelVersion(version=9, path="/evil")) if "KV" in subject else b"x"
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await agent.nc.request(subject, payload, timeout=0.5)
    await agent.violation()
    await agent.nc.close()
    counts = await stream_counts(swarm_nats)
    assert counts[S.SAMPLES_STREAM] == counts[S.METRICS_STREAM] == counts["kv"] == 0


async def test_a_revoked_client_is_disconnected_and_refused_while_the_others_go_on(
    swarm_nats: NatsServer,
) -> None:
    mallory, alice = await connect(swarm_nats, "mallory"), await connect(swarm_nats, "alice")
    assert {"mallory", "alice"} <= set(swarm_nats.registry.load())
    assert swarm_nats.revoke_agent("mallory")
    for _ in range(100):
        if not mallory.nc.is_connected:
            break
        await asyncio.sleep(0.02)
    assert not mallory.nc.is_connected
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(**mallory.cred.nats_options(), allow_reconnect=False)
    ev = BeginEvent(episode_id="alice_9", seq=0, client_id="c", task_id="t")
    ack = await alice.nc.jetstream().publish(S.episode_subject("alice_9", "begin"), encode(ev))
    assert ack.seq == 1
    await alice.nc.close()


async def test_service_may_publish_samples(swarm_nats: NatsServer) -> None:
    nc = await nats.connect(swarm_nats.service_url)
    s = Sample(
        sample_id="e.a.0",
        model="policy",
        episode_id="e",
        agent="a",
        task_id="t",
        group_key="t",
        token_ids=[1],
        loss_mask=[1],
        logprobs=[-1.0],
        policy_versions=[0],
        reward=1.0,
    )
    ack = await nc.jetstream().publish(
        S.samples_subject("policy"), encode(s), headers={"Nats-Msg-Id": s.sample_id}
    )
    assert ack.stream == S.SAMPLES_STREAM and not ack.duplicate
    await nc.close()


def test_bundled_configs_are_valid(tmp_path) -> None:
    import os
    import shutil
    import subprocess

    from swarmrl.infra import NATS_CONF_DIR
    from swarmrl.infra.credentials import AgentRegistry, password_var
    from swarmrl.infra.nats_server import ROLES, nats_server_binary

    for conf in NATS_CONF_DIR.glob("*.conf"):
        shutil.copyfile(conf, tmp_path / conf.name)
    # writes agents.conf and services.conf, which accounts.conf includes
    AgentRegistry(tmp_path).mint("a-client", reload=False)
    env = os.environ | {password_var(role): "x" for role in ROLES}
    for conf in sorted(tmp_path.glob("*.conf")):
        if conf.name in ("accounts.conf", "agents.conf", "services.conf", "runs.conf"):  # included files
            continue
        out = subprocess.run(
            [nats_server_binary(), "-t", "-c", str(conf)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, f"{conf.name}: {out.stderr}{out.stdout}"


async def test_an_agent_message_over_the_event_limit_never_reaches_a_stream(swarm_nats: NatsServer) -> None:
    """The probe stored an 8,388,548-byte `begin` whose dead-letter copy then broke the services.
    Agents are capped at 4 MiB by their account (the services keep 8 MB for dead letters)."""
    agent = await connect(swarm_nats, "agent")
    big = BeginEvent(
        episode_id="agent_1", seq=0, client_id="c", task_id="t", task={"pad": "x" * MAX_EVENT_BYTES}
    )
    publish = agent.nc.jetstream().publish(S.episode_subject("agent_1", "begin"), encode(big), timeout=2)
    with pytest.raises((TimeoutError, nats.errors.Error)):
        await asyncio.wait_for(publish, 5)  # the server cuts the connection (nats-py may not notice)
    log = swarm_nats.log_path.read_bytes()
    assert b"maximum payload exceeded" in log and b"vs 4194304" in log  # the account limit, not 8 MB
    await agent.nc.close()
    assert (await stream_counts(swarm_nats))[S.EPISODES_STREAM] == 0
    swarm = await SwarmClient.connect(swarm_nats.agent)  # the SDK says why instead of being cut off
    with pytest.raises(SwarmError, match="over the"):
        await swarm.publish(big)
    await swarm.close()
