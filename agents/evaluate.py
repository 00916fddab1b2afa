"""Evaluator: plays each task's held-out eval set whenever the trained model gets a new version.

Success rate is measured at the temperature the swarm trains with (1.0 by default), averaged over
`samples` episodes per held-out instance: the expected success of the policy being trained
("avg@k"). Greedy decoding (`temperature=0`) is available, but it hides what RL changes first:
a policy that is right 60% of the time at every token is often right 100% of the time greedily.

Consumes KV `swarm-models[<model>]` updates; runs eval episodes (`eval=True`: recorded by the
ledger, never trained on) through the same SDK and OpenAI endpoint as any client; publishes one
`EvalResult` per task and version to `swarm.metrics.eval.<model>`. Needs service credentials
(agents may not publish metrics).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from swarmrl.agents.runner import play_episode
from swarmrl.agents.sdk import SwarmClient
from swarmrl.agents.tasks import get_task
from swarmrl.schemas import EvalResult, ModelVersion, decode, encode
from swarmrl.schemas import subjects as S

log = logging.getLogger("swarmrl.evaluator")


async def evaluate(
    swarm: SwarmClient,
    task: str,
    model: str,
    *,
    limit: int = 0,
    samples: int = 1,
    parallel: int = 16,
    temperature: float = 1.0,
    max_tokens: int = 64,
) -> tuple[float, int]:
    """Success rate of `model` on `task`'s eval set (first `limit` instances; 0 = all), each instance
    played `samples` times; returns (rate, episodes)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    spec = get_task(task)
    instances = spec.eval_tasks()
    instances = (instances[:limit] if limit else instances) * samples
    gate = asyncio.Semaphore(parallel)

    async def one(instance: Any) -> bool:
        async with gate:
            try:
                out = await play_episode(
                    swarm, spec, instance, model, eval=True, temperature=temperature, max_tokens=max_tokens
                )
                return out.success
            except Exception as exc:  # an eval episode that failed counts as a failure, loudly
                log.warning("eval episode failed task=%s: %r", instance.task_id, exc)
                return False

    results = await asyncio.gather(*(one(i) for i in instances))
    return sum(results) / max(len(results), 1), len(results)


async def run_evaluator(
    nats_url: str,
    tasks: list[str],
    model: str,
    stop: asyncio.Event,
    *,
    every: int = 1,
    limit: int = 0,
    samples: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 64,
    final: int = -1,
) -> None:
    """Evaluate version 0, every `every`-th version and version `final`, until `stop` is set."""
    swarm = await SwarmClient.connect(nats_url, client_id=f"evaluator-{model}", code_version="evaluator")
    kv = await swarm.js.key_value(S.MODELS_BUCKET)
    watcher = await kv.watch(model)
    done: set[int] = set()
    try:
        while not stop.is_set():
            try:
                entry = await watcher.updates(timeout=1.0)
            except Exception:  # nats.py raises TimeoutError flavours on an idle watch
                continue
            if entry is None or entry.value is None:
                continue
            version = decode(entry.value, ModelVersion).version
            if version in done or (version % every and version != final):
                continue
            done.add(version)
            for task in tasks:
                rate, n = await evaluate(
                    swarm,
                    task,
                    model,
                    limit=limit,
                    samples=samples,
                    temperature=temperature,
                    max_tokens=max_tokens,
                )
                result = EvalResult(
                    model=model, step=version, task=task, success_rate=rate, n=n, temperature=temperature
                )
                await swarm.js.publish(
                    S.eval_metrics_subject(model),
                    encode(result),
                    headers={"Nats-Msg-Id": f"eval-{model}-{task}-{version}"},
                )
                log.info("eval model=%s version=%d task=%s success=%.3f n=%d", model, version, task, rate, n)
    finally:
        await watcher.stop()
        await swarm.close()
