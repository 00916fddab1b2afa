"""Per-role permissions of the bundled NATS accounts, against a real nats-server."""

from __future__ import annotations

import asyncio

import nats
import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import BeginEvent, ModelVersion, Sample, encode
from swarmrl.schemas import subjects as S


async def _agent(server: NatsServer) -> tuple[nats.aio.client.Client, list[str]]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(server.agent_url, error_cb=on_error)
    return nc, errors


async def test_agent_may_publish_episode_events(swarm_nats: NatsServer) -> None:
    nc, _ = await _agent(swarm_nats)
    ev = BeginEvent(episode_id="e1", seq=0, client_id="c", task_id="t")
    ack = await nc.jetstream().publish(
        S.episode_subject("e1", "begin"), encode(ev), headers={"Nats-Msg-Id": ev.msg_id}
    )
    assert ack.stream == S.EPISODES_STREAM
    await nc.close()


@pytest.mark.parametrize(
    "subject",
    [
        S.samples_subject("policy"),  # samples
        f"$KV.{S.MODELS_BUCKET}.policy",  # weights
        S.control_subject("stop"),  # control
        S.episode_subject("e1", "llm"),  # llm events are the gateway's
        S.train_metrics_subject("policy"),
        "$JS.API.STREAM.DELETE.SAMPLES",
    ],
)
async def test_agent_cannot_publish_outside_its_role(swarm_nats: NatsServer, subject: str) -> None:
    nc, errors = await _agent(swarm_nats)
    payload = encode(ModelVersion(version=9, path="/evil")) if "KV" in subject else b"x"
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(subject, payload, timeout=0.5)
    for _ in range(100):
        if errors:
            break
        await asyncio.sleep(0.02)
    assert any("permissions violation" in e.lower() for e in errors), errors
    await nc.close()

    svc = await nats.connect(swarm_nats.service_url)
    js = svc.jetstream()
    assert (await js.stream_info(S.SAMPLES_STREAM)).state.messages == 0
    assert (await js.stream_info(S.METRICS_STREAM)).state.messages == 0
    kv = await js.key_value(S.MODELS_BUCKET)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("policy")
    await svc.close()


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
    import subprocess

    from swarmrl.infra import NATS_CONF_DIR
    from swarmrl.infra.nats_server import nats_server_binary

    env = os.environ | {f"SWARM_{r}_PASSWORD": "x" for r in ("SERVICE", "AGENT", "SYS")}
    for conf in sorted(NATS_CONF_DIR.glob("*.conf")):
        if conf.name == "accounts.conf":
            continue
        out = subprocess.run(
            [nats_server_binary(), "-t", "-c", str(conf)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, f"{conf.name}: {out.stderr}{out.stdout}"
