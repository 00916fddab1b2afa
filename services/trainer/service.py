"""The trainer of one model, top to bottom: samples -> groups -> step -> checkpoint -> new version.

Consumes `swarm.samples.<model>` and `swarm.samples.<model>.lost` (durable pull consumer, in stream
order). Publishes KV `swarm-models[<model>]` = ModelVersion after every checkpoint,
`swarm.metrics.train.<model>` TrainStep, `swarm.metrics.drops.<model>` SampleDrops, group outcomes
(`ready.py`) and dead letters (`intake.py`).

`Trainer.run` serves the resumed version, then runs two loops over one state: `consume` (fetch, take
in, form and queue groups, settle) and `train` (take a batch, update and checkpoint in a worker
thread, put the version, publish the TrainStep, ack; or the rollback the collapse guard asked for).
A crash before a step's ack replays its samples, and the resumed trainer skips those its checkpoint
trained. Under `accelerate launch` process 0 runs the loops and the other processes `follow`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections import Counter
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import BaseModel

from swarmrl.schemas import ModelVersion, SampleDrops, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.objects import WeightStore
from swarmrl.services.common.retry import retry
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState, checkpoint_root, latest, prune, step_dir
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.grouping import Group, GroupBuffer, Stall
from swarmrl.services.trainer.grpo import generated_versions
from swarmrl.services.trainer.guard import Diversity, RewardGuard
from swarmrl.services.trainer.intake import SampleIntake, Unacked, reasons
from swarmrl.services.trainer.lead import Lead
from swarmrl.services.trainer.learner import Learner, NonFiniteWeights, StepResult
from swarmrl.services.trainer.ready import Batch, Outcomes, ReadyGroups, msg_id, train_step

log = logging.getLogger("swarmrl.trainer")


async def load(cfg: TrainerConfig) -> tuple[Learner, Path | None]:
    """The learner, from the newest checkpoint or the base model, and that checkpoint (None: version 0
    is the base model). Every process of `accelerate launch` calls it."""
    root = checkpoint_root(cfg.run_dir, cfg.model).resolve()  # KV paths must be absolute
    found = latest(root)
    checkpoint = found[1] if found else None
    learner = await asyncio.to_thread(Learner, cfg, checkpoint or cfg.model_path)
    if cfg.rollback_window and learner.accelerator.num_processes > 1:
        raise ValueError("rollback_window: the collapse guard runs on one training process only")
    if checkpoint is not None:
        await asyncio.to_thread(learner.load_optimizer, checkpoint)
    elif cfg.lora_rank:  # version 0 is the fresh adapter: engines serve adapters only
        checkpoint = step_dir(root, 0)
        await asyncio.to_thread(learner.save, checkpoint, TrainerState(cfg.model, 0, 0))
    return learner, checkpoint


async def standby(cfg: TrainerConfig, stopping: asyncio.Event) -> Lead | None:
    """Wait, the model loaded, until this replica leads (`lead.py`); None if stopped first."""
    nc = await bus.connect(cfg.nats, f"trainer-{cfg.model}-lead")
    lead = Lead(nc, await nc.jetstream().key_value(S.LEASES_BUCKET), cfg.model, cfg.replica)
    log.info("model=%s replica %s ready, standing by for the lead", cfg.model, cfg.replica)
    if await lead.acquire(stopping):
        return lead
    await bus.close(nc)
    return None


async def catch_up(cfg: TrainerConfig, learner: Learner, checkpoint: Path | None) -> Path | None:
    """A standby that takes the lead: the newest checkpoint (the lead may have trained since this
    process loaded) into the learner, and that checkpoint."""
    found = latest(checkpoint_root(cfg.run_dir, cfg.model).resolve())
    if found is None or found[1] == checkpoint:
        return checkpoint
    await asyncio.to_thread(learner.restore, found[1])
    return found[1]


def follow(cfg: TrainerConfig, learner: Learner) -> None:
    """Processes 1..N-1 of `accelerate launch`: train and save the steps process 0 sends, until None."""
    root = checkpoint_root(cfg.run_dir, cfg.model).resolve()
    while (work := learner.broadcast(None)) is not None:
        step, version, items, state = work
        if learner.train_step(learner.shard(items), version).learned:
            learner.save(step_dir(root, step), state)


class Trainer:
    """The trainer on process 0: `await Trainer.start(cfg)`, then `await run()` until `stop()` or
    `max_steps`."""

    def __init__(
        self,
        cfg: TrainerConfig,
        learner: Learner,
        checkpoint: Path | None,
        nc: NATS,
        kv: KeyValue,
        sub: JetStreamContext.PullSubscription,
        stopping: asyncio.Event | None = None,
        weights: WeightStore | None = None,
        lead: Lead | None = None,
    ) -> None:
        self.cfg, self.learner, self.checkpoint, self.weights = cfg, learner, checkpoint, weights
        self.lead = lead  # held by one of several replicas: confirmed before each version it publishes
        self.nc, self.js, self.kv, self.sub = nc, nc.jetstream(), kv, sub
        self.root = checkpoint_root(cfg.run_dir, cfg.model).resolve()
        self.base = Path(cfg.model_path).resolve()
        self.state = TrainerState.read(checkpoint) if checkpoint else TrainerState(cfg.model, 0, 0)
        self.counts: Counter[str] = Counter(self.state.counts)
        self.stopping = stopping or asyncio.Event()
        self.wake = asyncio.Event()  # set after each fetch: the queued groups may have changed
        self.unacked = Unacked(bus.DeadLetters(nc, "trainer"), cfg.ack_wait_s, cfg.drop_report_s)
        self.buffer = GroupBuffer(cfg.num_repeat, cfg.group_timeout_s, cfg.min_group_size, self.counts)
        self.outcomes = Outcomes(cfg.model)
        self.ready = ReadyGroups(
            cfg, self.counts, self.unacked,
            lambda group, items, reason: self.outcomes.dropped(group.key, items, reason, self.state.step),
        )  # fmt: skip
        self.intake = SampleIntake(
            cfg.model, self.buffer, self.unacked,
            vocab_size=learner.vocab_size, max_tokens=learner.context_len or cfg.max_tokens_per_micro_batch,
            max_staleness=cfg.max_staleness, counts=self.counts, already_trained=self.state.sample_ids,
        )  # fmt: skip
        self.diversity = Diversity()
        self.guard = RewardGuard(cfg.rollback_window, cfg.rollback_drop)
        self.rollback_to: int | None = None  # the version the guard wants, until the train loop loads it

    @classmethod
    async def start(cls, cfg: TrainerConfig, stopping: asyncio.Event | None = None) -> Trainer:
        """`load` and `connect`: the trainer of a single process."""
        return await cls.connect(cfg, *await load(cfg), stopping)

    @classmethod
    async def connect(
        cls,
        cfg: TrainerConfig,
        learner: Learner,
        checkpoint: Path | None,
        stopping: asyncio.Event | None = None,
        lead: Lead | None = None,
    ) -> Trainer:
        """Connect to NATS and bind the durable consumer of the model's samples."""
        nc = await bus.connect(cfg.nats, f"trainer-{cfg.model}")
        try:
            js = nc.jetstream()
            subjects = [S.samples_subject(cfg.model), S.lost_subject(cfg.model)]  # one consumer: stream order
            durable = S.durable_name("trainer", S.SAMPLES_STREAM, cfg.model)
            sub = await bus.durable_pull(js, S.SAMPLES_STREAM, durable, subjects, ack_wait_s=cfg.ack_wait_s)
            weights = await WeightStore.open(js, cfg.model) if cfg.share_weights else None
            return cls(cfg, learner, checkpoint, nc, await bus.models_kv(js), sub, stopping, weights, lead)
        except BaseException:
            await bus.close(nc)
            raise

    @property
    def version(self) -> int:
        return self.state.version

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def done(self) -> bool:
        return self.cfg.max_steps > 0 and self.state.step >= self.cfg.max_steps

    async def run(self) -> None:
        """Serve the resumed version, then `consume` and `train` until stopped or done; on the way out
        nak what is held."""
        served = self.checkpoint or self.base
        log.info("model=%s starting at step %d from %s", self.cfg.model, self.state.step, served)
        loops: list[asyncio.Task[None]] = []
        try:
            await self.publish_version(served)
            # Renewing the lead raises LostLead (the process exits) once another replica has it.
            coros = [self.consume(), self.train(), *([self.lead.hold(self.stopping)] if self.lead else [])]
            loops = [asyncio.create_task(coro, name=coro.__name__) for coro in coros]
            await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            self.stop()  # done, stopped, or one loop failed: the other ends at its next look
            await asyncio.wait(loops)
            for loop in loops:
                loop.result()  # a failed step raises here: the process exits, a restart resumes
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self.unacked.nak_all()
            await self.nc.flush()  # acks and naks are fire-and-forget publishes: make sure they left
            await bus.close(self.nc)  # not drain(): draining a pull subscription waits out its timeout
            if self.lead is not None:  # after the naks: the standby that takes over gets them at once
                await self.lead.leave()
                await bus.close(self.lead.nc)
            if self.learner.accelerator.num_processes > 1:
                await asyncio.to_thread(self.learner.broadcast, None)

    # The intake loop ------------------------------------------------------------------------------
    async def consume(self) -> None:
        """fetch -> take in -> group -> settle, until stopped."""
        try:
            dead_letters, fetch = self.unacked.dead_letters, self.cfg.fetch_batch
            async for msgs in bus.batches(self.sub, self.stopping, fetch, dead_letters=dead_letters):
                now = time.monotonic()
                for msg in msgs:
                    await self.intake.handle(msg, self.version, now)
                self.form_groups(now)
                await self.settle(now)
                self.wake.set()
        finally:
            self.wake.set()

    def form_groups(self, now: float) -> None:
        """Warn of stalled groups, drop timed-out ones; count and queue the groups complete now."""
        for stall in self.buffer.stalled(now, self.cfg.stall_warn_s):
            self.warn_stall(stall)
        ready, dropped = self.buffer.pop_ready(now)
        self.unacked.drop(dropped, "dropped_group")
        for key, items, reason in self.buffer.take_dropped_groups():
            self.outcomes.dropped(key, items, reason, self.state.step)
        self.unacked.spend(self.buffer.take_spent())
        for group in ready:
            self.observe(group)
            self.ready.add(group, self.version)

    async def settle(self, now: float) -> None:
        """Publish outcomes; report the drops that waited `drop_report_s`, else ack the spent lost
        records; keep every held message alive."""
        await self.publish_outcomes()
        if self.unacked.report_due(now):
            dropped, keys = self.unacked.take_report()
            msg = SampleDrops(model=self.cfg.model, step=self.state.step, dropped=reasons(dropped))
            subject = S.drops_metrics_subject(self.cfg.model)
            await self.publish(subject, msg, msg_id(f"drops-{self.cfg.model}", msg.dropped))
            await self.unacked.ack(keys)
            log.info("model=%s reported %d dropped samples between steps", self.cfg.model, len(msg.dropped))
        elif not self.unacked.dropped:
            await self.unacked.ack(self.unacked.take_spent())
        await self.unacked.keep_alive(now)

    # The training loop ----------------------------------------------------------------------------
    async def train(self) -> None:
        """pick batch -> step -> checkpoint -> publish version -> ack, until stopped or done."""
        while not self.stopping.is_set() and not self.done():
            if self.rollback_to is not None:
                await self.roll_back(self.rollback_to)
            elif (batch := self.ready.take(self.version, time.monotonic())) is not None:
                await self.step(batch)
            else:
                await self.wake.wait()
                self.wake.clear()
        self.stop()

    async def step(self, batch: Batch) -> None:
        """One policy version: update and checkpoint, put the version in KV, publish the TrainStep,
        then ack the batch and the drops it reports."""
        started = time.perf_counter()
        version, step, items = self.version, self.state.step + 1, batch.items()
        sample_ids = [it.sample.sample_id for it in items]
        state = TrainerState(self.cfg.model, step, step, sample_ids, dict(self.counts))
        try:
            result = await asyncio.to_thread(self.learn, step, version, items, state)
        except NonFiniteWeights as exc:
            # Stop: the restart resumes from the newest (finite) checkpoint and retries the step's
            # samples; a batch that keeps doing this is dead-lettered after `bus.MAX_DELIVERIES`.
            log.error("model=%s step %d not saved, no new version; stopping: %s", self.cfg.model, step, exc)
            raise
        for held in batch.held():
            if (reason := result.skipped.get(held.sample.sample_id)) is not None:
                await self.unacked.dead_letter(held.handle, reason)
                self.counts["skipped_nonfinite"] += 1
        if not result.learned:
            log.warning("model=%s step %d skipped: no update applied (non-finite)", self.cfg.model, step)
            return await self.unacked.ack(batch.handles(result.skipped))  # its lost records
        self.state = state
        await self.publish_version(step_dir(self.root, step))
        dropped, reported = self.unacked.take_report()
        trained = [it for it in items if it.sample.sample_id not in result.skipped]
        await self.publish_step(trained, version, result, time.perf_counter() - started, reasons(dropped))
        for group in batch.groups:
            self.outcomes.trained(group.key, group.items, step)
        await self.publish_outcomes()
        await self.unacked.ack([*batch.handles(result.skipped), *reported])
        # with the collapse guard, keep every version a group can still come from: the good one is on disk
        keep = self.cfg.keep_checkpoints
        keep = max(keep, self.cfg.max_staleness + 1) if self.cfg.rollback_window else keep
        await asyncio.to_thread(prune, self.root, keep, self.guard.good_version)
        if self.done():
            log.info("model=%s reached max_steps=%d", self.cfg.model, self.cfg.max_steps)

    def learn(self, step: int, version: int, items: list[Scored], state: TrainerState) -> StepResult:
        """In a worker thread: hand the step to the other processes, train this one's shard, save."""
        learner = self.learner
        learner.broadcast((step, version, items, state))
        result = learner.train_step(learner.shard(items), version)
        if result.learned:  # the same on every process: the learner's skip decisions are collective
            t0 = time.perf_counter()
            learner.save(step_dir(self.root, step), state)
            result.stats["save_s"] = time.perf_counter() - t0
        return result

    # The collapse guard ---------------------------------------------------------------------------
    def observe(self, group: Group) -> None:
        """Count a formed group's task instance (`Diversity`) and its reward (`RewardGuard`)."""
        samples = [h.sample for h in group.items]
        if warning := self.diversity.observe(samples[0].task or self.cfg.model, samples[0].task_id):
            log.warning("model=%s %s", self.cfg.model, warning)
        versions = [v for s in samples for v in generated_versions(s)]
        rewards = [s.reward for s in samples]
        # A NaN reward is the group's problem, not a collapse; samples of unknown versions say nothing.
        if versions and all(math.isfinite(r) for r in rewards):
            target = self.guard.observe(min(versions), max(versions), statistics.mean(rewards))
            if target is not None and self.rollback_to is None:
                self.rollback_to = target
                log.warning(
                    "model=%s train reward collapsed: last %d groups (versions > %d) average %.3f, the best "
                    "window %.3f; rolling back to version %d",
                    self.cfg.model, self.guard.window, target, self.guard.mean(), self.guard.best, target,
                )  # fmt: skip

    async def roll_back(self, target: int) -> None:
        """Load version `target` back into the learner and serve it as the next step's version."""
        self.rollback_to = None
        path = step_dir(self.root, target) if target > 0 or self.cfg.lora_rank else self.base
        if not path.is_dir():
            log.error("model=%s cannot roll back: %s is gone; training on", self.cfg.model, path)
            return self.guard.rolled_back(self.version + 1)
        step = self.state.step + 1
        self.counts["rollbacks"] += 1
        state = TrainerState(self.cfg.model, step, step, [], dict(self.counts))

        def restore_and_save() -> None:
            self.learner.restore(path)
            self.learner.save(step_dir(self.root, step), state)

        await asyncio.to_thread(restore_and_save)
        self.state = state
        self.guard.rolled_back(step)
        self.ready.rolled_back(target, step)
        await self.publish_version(step_dir(self.root, step))
        log.warning("model=%s rolled back to version %d, served as version %d", self.cfg.model, target, step)

    # What the trainer publishes -------------------------------------------------------------------
    async def publish_version(self, path: Path) -> None:
        """Point engines at `path` (only ever weights `Learner.check_weights` passed)."""
        mv = ModelVersion(version=self.state.version, path=str(path), step=self.state.step)
        if self.lead is not None:  # never a version from a replica that lost the lead
            await retry(self.stopping, self.lead.confirm)
        if self.weights is not None:  # first the files, for engines on other hosts (`share_weights`)
            await retry(self.stopping, self.weights.put, mv.version, path)
        await retry(self.stopping, self.kv.put, self.cfg.model, encode(mv))
        log.info(
            "model=%s version=%d path=%s put in KV %s", self.cfg.model, mv.version, mv.path, S.MODELS_BUCKET
        )

    async def publish_step(
        self, items: list[Scored], version: int, result: StepResult, wall_s: float, dropped: dict[str, str]
    ) -> None:
        gauges = {k: float(v) for k, v in self.counts.items()}
        gauges.update(held_samples=float(len(self.buffer)), ready_groups=float(len(self.ready)))
        gauges.update({f"distinct.{task}": share for task, share in self.diversity.shares().items()})
        msg = train_step(
            self.state, items, version, result.stats, wall_s=wall_s, dropped=dropped, gauges=gauges
        )
        await self.publish(S.train_metrics_subject(self.cfg.model), msg, f"train-{self.cfg.model}-{msg.step}")
        stats = result.stats
        log.info(
            "model=%s step=%d loss=%.4f reward=%.3f samples=%d tokens=%d update=%.2fs save=%.2fs clip=%.3f",
            self.cfg.model, msg.step, msg.loss, msg.reward_mean, msg.samples, msg.tokens, stats["update_s"],
            stats["save_s"], stats["clip_frac"],
        )  # fmt: skip

    async def publish_outcomes(self) -> None:
        """Warn of clients most of whose groups are dropped, then publish each outcome to its owner."""
        for warning in self.outcomes.warnings():  # first: an agent that hears the outcome finds it logged
            log.warning("model=%s %s", self.cfg.model, warning)
        for subject_record_id in self.outcomes.take():
            await self.publish(*subject_record_id)

    async def publish(self, subject: str, record: BaseModel, msg_id: str) -> None:
        await retry(self.stopping, self.js.publish, subject, encode(record), headers={"Nats-Msg-Id": msg_id})

    def warn_stall(self, stall: Stall) -> None:
        self.counts["stalled_groups"] += 1
        cfg = self.cfg
        log.warning(
            "model=%s group %r of client(s) %s has %d of its %d episodes (%d lost) and none new for %.0fs: "
            "it trains when %d episodes of it arrive, or at the group timeout (%.0fs) with at least %d. "
            "Play a whole group per task instance (SwarmClient.group, or group_size on begin and that many "
            "episodes)",
            cfg.model, stall.key, ",".join(stall.clients), stall.episodes, stall.size, stall.lost,
            cfg.stall_warn_s, stall.size, cfg.group_timeout_s, cfg.min_group_size,
        )  # fmt: skip
