"""Evaluator: plays each task's held-out eval set whenever the trained model gets a new version.

Success is measured at the training temperature (1.0 by default), averaged over `samples` episodes
per instance ("avg@k"): greedy decoding hides what RL changes first. Follows KV `swarm-models`,
plays `eval=True` episodes through the SDK like any client, and publishes one `EvalResult` per task
and version to `swarm.metrics.eval.<model>` (service credentials). An episode the infrastructure
failed (`INFRA`) is played again, then left out of the rate, never scored as the model's failure.
It also warns when held-out success and train reward diverge (`Divergence`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

import openai

from swarmrl.agents.runner import Outcome, play_episode, roles_of
from swarmrl.agents.sdk import TRANSIENT, SwarmClient
from swarmrl.agents.tasks import get_task, rewards
from swarmrl.schemas import EvalResult, ModelVersion, TrainStep, decode, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common.retry import backoff

log = logging.getLogger("swarmrl.evaluator")

SEED_STRIDE = 1 << 16
"""Sampling seeds per eval episode: its model calls use `seed + n` for n below this."""

INFRA = (openai.APIConnectionError, openai.InternalServerError, *TRANSIENT)
"""Failures of the swarm, not of the policy: connection errors, a gateway 5xx, NATS timeouts."""


@dataclass
class EvalOutcome:
    """Held-out results of one task: the team outcome and each role's own metric."""

    success: float
    episodes: int
    metrics: dict[str, tuple[float, int]] = field(default_factory=dict)
    """metric -> (mean over the episodes where it is defined, how many those were)."""


@dataclass
class Divergence:
    """Held-out success of one task against its train reward (a narrowing training distribution).
    `check` warns, once until a new best, when success falls `drop` below its best while the mean
    train reward since that best is no lower than over the `window` steps up to it."""

    task: str
    drop: float = 0.10
    window: int = 10
    rewards: list[tuple[int, float]] = field(default_factory=list)
    """(step, train reward of this task), in arrival order."""
    best: tuple[int, float] | None = None
    warned: bool = False

    def reward(self, step: TrainStep) -> None:
        self.rewards.append((step.step, step.extra.get(f"reward_mean.{self.task}", step.reward_mean)))

    def check(self, version: int, success: float) -> str | None:
        if self.best is None or success > self.best[1]:
            self.best, self.warned = (version, success), False
            return None
        at, best = self.best
        before = [r for s, r in self.rewards if s <= at][-self.window :]
        after = [r for s, r in self.rewards if at < s <= version]
        if self.warned or success > best - self.drop or not before or not after:
            return None
        if statistics.mean(after) < statistics.mean(before):
            return None  # both fell: a worse policy, not a divergence
        self.warned = True
        return (
            f"task {self.task}: held-out success {success:.0%} (v{version}) is {best - success:.0%} "
            f"below its best {best:.0%} (v{at}) while the train reward went {statistics.mean(before):.3f} -> "
            f"{statistics.mean(after):.3f}: train and held-out diverge (a narrowing training distribution? "
            "see the trainer's distinct.<task>)"
        )


async def evaluate(
    swarm: SwarmClient,
    task: str,
    roles: dict[str, str] | str,
    *,
    limit: int = 0,
    samples: int = 1,
    parallel: int = 16,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    attempts: int = 4,
    seed: int | None = 0,
) -> EvalOutcome:
    """Success rate on `task`'s eval set (first `limit` instances; 0 = all), each played `samples`
    times; `roles` maps each role to its model (or is a single-agent task's model). An `INFRA`
    failure is retried, `attempts` times in all. `seed`: the k-th episode samples from
    `seed + SEED_STRIDE * k` on, so two versions are scored on the same draws (None: the engine's
    sampler)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    spec = get_task(task)
    role_map = roles_of(spec, {}, roles) if isinstance(roles, str) else roles_of(spec, roles, "")
    instances = spec.eval_tasks()
    instances = instances[:limit] if limit else instances
    gate = asyncio.Semaphore(max(1, parallel // samples))  # questions at once, each with its samples
    unscored: list[BaseException] = []

    async def one(k: int, instance: Any) -> Outcome | None:
        episode_seed = None if seed is None else seed + SEED_STRIDE * k
        play = functools.partial(
            play_episode, swarm, spec, instance, role_map, eval=True, temperature=temperature,
            max_tokens=max_tokens, seed=episode_seed,
        )  # fmt: skip
        try:
            return await backoff(play, transient=INFRA, tries=attempts, first_s=1.0, max_s=20.0)
        except INFRA as exc:
            unscored.append(exc)
            return None
        except Exception as exc:  # the episode's own failure counts as a failure, loudly
            log.warning("eval episode failed task=%s: %r", instance.task_id, exc)
            return Outcome(instance.task_id, reward=0.0, success=False, turns=0)

    async def question(i: int, instance: Any) -> list[Outcome | None]:
        """A question's `samples` episodes at once (a dataset task's reward scores them in one call)."""
        async with gate:
            with rewards.group(samples):
                plays = (rewards.member(one(s * len(instances) + i, instance)) for s in range(samples))
                return list(await asyncio.gather(*plays))

    per_question = await asyncio.gather(*(question(i, inst) for i, inst in enumerate(instances)))
    results = [r for outs in per_question for r in outs if r is not None]
    if unscored:
        log.warning(
            "task %s: %d of %d eval episodes left out, failed by the swarm %d times each (last: %r)",
            task, len(unscored), len(instances) * samples, attempts, unscored[-1],
        )  # fmt: skip
    metrics: dict[str, list[float]] = {}
    for r in results:
        for name, value in r.metrics.items():
            metrics.setdefault(name, []).append(value)
    return EvalOutcome(
        success=sum(r.success for r in results) / max(len(results), 1),
        episodes=len(results),
        metrics={name: (sum(v) / len(v), len(v)) for name, v in metrics.items()},
    )


async def run_evaluator(
    nats_url: str,
    tasks: dict[str, dict[str, str]],
    stop: asyncio.Event,
    *,
    every: int = 1,
    limit: int = 0,
    samples: int = 1,
    temperature: float = 1.0,
    max_tokens: dict[str, int | None] | None = None,
    finish: asyncio.Event | None = None,
) -> None:
    """Evaluate each task at version 0, then whenever its lead model (its first role's) is `every`
    versions past the last evaluated (the newest version, never a queue), until `stop`. Once
    `finish` is set, evaluate each task's newest version unless it already was, then return.

    `tasks` maps a task to its roles (role -> model). Each evaluation publishes the team outcome
    under the lead model and, for a multi-role task, each role's own metric under that role's model.
    """
    swarm = await SwarmClient.connect(nats_url, client_id=S.EVALUATOR, code_version=S.EVALUATOR)
    kv = await swarm.js.key_value(S.MODELS_BUCKET)
    watcher = await kv.watchall()
    versions: dict[str, int] = {}
    last: dict[str, int] = {}  # task -> the version of its last evaluation
    divergence = {task: Divergence(task) for task in tasks}

    async def on_step(msg: Any) -> None:
        try:
            step = decode(msg.data, TrainStep)
        except Exception:  # the ledger dead-letters a bad metric; here it only misses one reward
            return
        for task, roles in tasks.items():
            if lead_of(roles) == step.model:
                divergence[task].reward(step)

    for lead in {lead_of(roles) for roles in tasks.values()}:
        await swarm.nc.subscribe(S.train_metrics_subject(lead), cb=on_step)
    try:
        while not stop.is_set():
            finishing = finish is not None and finish.is_set()
            timeout = 0.05 if finishing else 1.0
            while True:  # every update waiting now, the newest version of each model kept
                try:
                    entry = await watcher.updates(timeout=timeout)
                except Exception:  # nats.py raises TimeoutError flavours on an idle watch
                    break
                timeout = 0.05
                if entry is not None and entry.value is not None:
                    versions[entry.key] = max(
                        versions.get(entry.key, -1), decode(entry.value, ModelVersion).version
                    )
            for task, roles in tasks.items():
                version, before = versions.get(lead_of(roles)), last.get(task)
                if version is None or not due(version, before, 1 if finishing else every):
                    continue
                last[task] = version
                success = await _evaluate_and_publish(
                    swarm, task, roles, version, versions, limit=limit, samples=samples,
                    temperature=temperature, max_tokens=(max_tokens or {}).get(task),
                )  # fmt: skip
                if success is not None and (warning := divergence[task].check(version, success)):
                    log.warning("%s", warning)
            if finishing:
                return
    finally:
        await watcher.stop()
        await swarm.close()


def lead_of(roles: dict[str, str]) -> str:
    """A task's lead model: its first role's."""
    return next(iter(roles.values()))


def due(version: int, last: int | None, every: int) -> bool:
    """Whether a task last evaluated at `last` (None: never) is due an evaluation at `version`."""
    return last is None or version - last >= every


async def _evaluate_and_publish(
    swarm: SwarmClient,
    task: str,
    roles: dict[str, str],
    version: int,
    versions: dict[str, int],
    **kwargs: Any,
) -> float | None:
    """Evaluate `task` at `version` and publish; the team's success rate (None: nothing played)."""
    spec = get_task(task)
    out = await evaluate(swarm, task, roles, **kwargs)
    if out.episodes == 0:
        log.error("eval task=%s version=%d: no episode could be played; nothing published", task, version)
        return None
    lead = lead_of(roles)
    # (model, its version, metric, (rate, n)): the team outcome, then each role's own metric
    rows = [(lead, version, "success", (out.success, out.episodes))] + [
        (roles[role], versions.get(roles[role], 0), metric, out.metrics[metric])
        for role, metric in spec.role_metrics.items()
        if metric in out.metrics
    ]
    for model, step, metric, (rate, n) in rows:
        r = EvalResult(model=model, step=step, task=task, success_rate=rate, n=n,
                       temperature=kwargs["temperature"], metric=metric)  # fmt: skip
        await swarm.js.publish(
            S.eval_metrics_subject(r.model),
            encode(r),
            headers={"Nats-Msg-Id": f"eval-{task}-{lead}-{version}-{r.model}-{r.metric}"},
        )
        log.info("eval task=%s model=%s version=%d %s=%.3f n=%d", task, model, step, metric, rate, n)
    return out.success
