"""A two-model team episode end to end: the runner plays each role with its own model and token,
the gateway routes each call by model, and the merger publishes samples for both models with each
agent's own reward. Two different architectures (Qwen2 and Llama presets, random init) with two
different tokenizers (vocabularies of 792 and about 600 tokens, trained on different corpora): capture,
merging and a training step hold per model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest

from swarmrl.agents import SwarmClient
from swarmrl.agents.runner import play_episode
from swarmrl.agents.tasks.base import Message, TaskSpec, Turn
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import Sample, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.merger.service import Merger
from tests.conftest import wait_for
from tests.support.localstack import generation_stack, llm_events


@dataclass(frozen=True)
class Relay:
    task_id: str = "relay/1"


@dataclass
class RelayEnv:
    """Role `a` speaks, then role `b` answers what `a` said; a gets 1, b gets 0.25."""

    task: Relay
    done: bool = False
    success: bool = False
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    said: list[str] = field(default_factory=list)

    def turn(self) -> Turn | None:
        if len(self.said) == 0:
            return Turn("a", [{"role": "user", "content": "say something"}])
        if len(self.said) == 1:
            return Turn("b", [{"role": "user", "content": f"answer this: {self.said[0]}"}])
        return None

    def step(self, reply: Message) -> None:
        self.said.append(str(reply.get("content") or ""))
        if len(self.said) == 2:
            self.done, self.success = True, True
            self.rewards = {"a": 1.0, "b": 0.25}
            self.metrics = {"a_spoke": 1.0, "b_spoke": 1.0}


RELAY = TaskSpec(
    name="relay",
    make_env=RelayEnv,
    train_tasks=lambda seed: iter([Relay()]),
    eval_tasks=lambda: [Relay()],
    demonstration=None,
    parse_reply=lambda m: m,
    roles=("a", "b"),
    role_metrics={"a": "a_spoke", "b": "b_spoke"},
    role_demonstrations=lambda inst, rng: {},
)


@pytest.fixture(scope="module")
def llama_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from swarmrl.bootstrap.model import build_model

    return build_model(
        tmp_path_factory.mktemp("llama"), seed=1, warm_start_steps=0, preset="tiny-llama", progress=False,
        vocab_size=600,
    )  # fmt: skip


async def _samples(server: NatsServer, model: str) -> list[Sample]:
    nc = await nats.connect(server.service_url)
    sub = await nc.jetstream().subscribe(S.samples_subject(model), ordered_consumer=True)
    out = []
    while True:
        try:
            out.append(decode((await sub.next_msg(timeout=0.5)).data, Sample))
        except nats.errors.TimeoutError:
            break
    await nc.close()
    return out


async def test_a_team_episode_trains_both_models_with_each_agents_reward(
    swarm_nats: NatsServer, tiny_model_dir: Path, llama_model_dir: Path, start_merger: Callable[..., Merger]
) -> None:
    start_merger(episode_timeout_s=30)
    async with generation_stack(swarm_nats, tiny_model_dir, "alpha", more={"beta": llama_model_dir}) as stack:
        swarm = await SwarmClient.connect(swarm_nats.agent, code_version="team-v1")
        out = await play_episode(
            swarm, RELAY, Relay(), {"a": "alpha", "b": "beta"}, max_tokens=5, group_key="g1"
        )
        await swarm.close()
        calls = await llm_events(stack.nats)
    assert out.success and out.metrics == {"a_spoke": 1.0, "b_spoke": 1.0}
    assert [(c.agent, c.model) for c in calls] == [("a", "alpha"), ("b", "beta")]
    # the two models differ: the same prompt text would not even have the same architecture behind it
    assert type(stack.engines["alpha"].model).__name__ != type(stack.engines["beta"].model).__name__

    async def both() -> bool:
        return bool(await _samples(swarm_nats, "alpha")) and bool(await _samples(swarm_nats, "beta"))

    await wait_for(both, timeout=20, interval=0.5, what="samples for both models")
    alpha, beta = await _samples(swarm_nats, "alpha"), await _samples(swarm_nats, "beta")
    assert [(s.agent, s.reward, s.task, s.client_version) for s in alpha] == [("a", 1.0, "relay", "team-v1")]
    assert [(s.agent, s.reward, s.task) for s in beta] == [("b", 0.25, "relay")]
    assert alpha[0].token_ids[-len(calls[0].output_ids) :] == calls[0].output_ids
    assert beta[0].token_ids[-len(calls[1].output_ids) :] == calls[1].output_ids

    # Each call was tokenized by its own model's tokenizer, which the other's would not match.
    handles = stack.gateway.gateway.models
    vocab = {name: len(h.tokenizer) for name, h in handles.items()}
    assert vocab["alpha"] != vocab["beta"]
    for call, other in zip(calls, ["beta", "alpha"], strict=True):
        own = handles[call.model].builder
        text = own.render(call.messages, [], gen_prompt=True)
        assert call.prompt_ids == own.encode(text) != handles[other].builder.encode(text)
    # ... and each model trains on its own samples (ids inside its own vocabulary).
    from swarmrl.services.trainer.batching import Scored
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.grpo import check_sample
    from swarmrl.services.trainer.learner import Learner

    for name, path, samples in (("alpha", tiny_model_dir, alpha), ("beta", llama_model_dir, beta)):
        learner = Learner(TrainerConfig(model_path=str(path), run_dir=str(path), model=name), str(path))
        assert learner.vocab_size == vocab[name] and max(samples[0].token_ids) < vocab[name]
        assert check_sample(samples[0], name, learner.vocab_size) is None
        stats = learner.train_step([Scored(samples[0], 1.0)], version=0).stats
        assert stats["trained_tokens"] == len(calls[0 if name == "alpha" else 1].output_ids)
