"""The trainer loop of one model, top to bottom: samples → groups → step → checkpoint → new version.

Consumes: `swarm.samples.<model>` (durable pull consumer `trainer-samples-<model>`).
Publishes: KV `swarm-models[<model>]` = ModelVersion after every checkpoint (engines reload it),
`swarm.metrics.train.<model>` TrainStep (msg id `train-<model>-<step>`), dead letters via handlers
(bad messages, and the samples of an optimizer update the learner refused as non-finite).

The update runs in a worker thread (`asyncio.to_thread`) while this loop keeps fetching, grouping and
keeping held samples alive. Order after a step: checkpoint on disk → KV version → metrics → ack the
step's samples; a crash anywhere before the ack replays them and the resumed trainer skips the ones
its last checkpoint already trained. On start: resume from the newest checkpoint and re-put its
version, or put version 0 = the base model. A step none of whose updates was applied (non-finite loss
or gradients) changed nothing: its samples are dead-lettered and it gets no checkpoint, version or
metrics. Non-finite weights are never saved nor served: the trainer stops instead (`_step`).
With `rollback_window`, a collapse of the groups' reward (`guard.py`) loads the best recent version's
checkpoint back between steps and puts it in KV as a new version (`_rollback`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import statistics
import time
from collections import Counter, deque
from pathlib import Path

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from swarmrl.schemas import (
    ModelVersion,
    Sample,
    SampleDrops,
    TrainStep,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.objects import WeightStore
from swarmrl.services.common.retry import retry
from swarmrl.services.trainer.batching import Scored
from swarmrl.services.trainer.checkpoint import TrainerState, checkpoint_root, latest, prune, step_dir
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.diversity import Diversity
from swarmrl.services.trainer.grouping import Group, GroupBuffer, Held, Stall
from swarmrl.services.trainer.grpo import GroupScore, generated_versions, score_group, staleness
from swarmrl.services.trainer.guard import RewardGuard
from swarmrl.services.trainer.intake import SampleIntake, ack_all, dead_letter_all, keep_alive, nak_all
from swarmrl.services.trainer.learner import Learner, NonFiniteWeights, StepResult

log = logging.getLogger("swarmrl.trainer")


class Trainer:
    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.root = checkpoint_root(cfg.run_dir, cfg.model).resolve()  # KV paths must be absolute
        self.base = Path(cfg.model_path).resolve()
        self.stopping = asyncio.Event()
        self.counts: Counter[str] = Counter()
        self.buffer = GroupBuffer(cfg.num_repeat, cfg.group_timeout_s, cfg.min_group_size, self.counts)
        self.ready: deque[Group] = deque()
        self.inflight: list[Held] = []
        self.inflight_lost: list[Msg] = []
        """The lost-episode records of the groups being trained: acked with their samples."""
        self.dropped: list[tuple[Held, str]] = []
        """Samples that will not be trained, with the reason: acked once a TrainStep reports them."""
        self._dropped_since = 0.0
        self._short_since: float | None = None
        """When a free trainer first held `min_batch_groups` groups but fewer than `batch_groups`
        (`batch_wait_s`); None while it holds a full batch or too few."""
        self.state = TrainerState(model=cfg.model, step=0, version=0)
        self.diversity = Diversity()
        self.guard = RewardGuard(cfg.rollback_window, cfg.rollback_drop)
        self._rollback_to: int | None = None
        """The version the collapse guard wants back, until the trainer is free to load it."""
        self.discarded: list[tuple[int, int]] = []
        """(good, served) of each rollback: versions strictly between were thrown away, and so are
        the samples they generated."""
        self.learner: Learner | None = None
        self.kv: KeyValue | None = None
        self.weights: WeightStore | None = None
        self.dead_letters: bus.DeadLetters | None = None

    @property
    def version(self) -> int:
        return self.state.version

    def stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        """Load (or resume), then train until `stop()` or `max_steps`."""
        found = latest(self.root)
        weights = found[1] if found else self.cfg.model_path
        self.learner = learner = await asyncio.to_thread(Learner, self.cfg, weights)
        if self.cfg.rollback_window and learner.accelerator.num_processes > 1:
            raise ValueError("rollback_window: the collapse guard runs on one training process only")
        if found:
            self.state = TrainerState.read(found[1])
            self.counts.update(self.state.counts)
            await asyncio.to_thread(learner.load_optimizer, found[1])
        elif self.cfg.lora_rank:  # version 0 is the fresh adapter: engines serve adapters only
            found = (0, step_dir(self.root, 0))
            await asyncio.to_thread(learner.save, found[1], self.state)
        if not learner.is_main:  # processes 1..N-1 of `accelerate launch` train what process 0 sends
            await asyncio.to_thread(self._follow)
            return
        log.info("model=%s starting at step %d from %s", self.cfg.model, self.state.step, weights)
        nc = await bus.connect(self.cfg.nats, f"trainer-{self.cfg.model}")
        js = nc.jetstream()
        try:
            await self._serve(js, found[1] if found else self.base)
        finally:
            await nak_all(self._handles())
            await nc.flush()  # acks and naks are fire-and-forget publishes: make sure they left
            await bus.close(nc)  # not drain(): draining a pull subscription waits out its timeout
            if learner.accelerator.num_processes > 1:
                await asyncio.to_thread(learner.broadcast, None)

    async def _serve(self, js: JetStreamContext, weights: Path) -> None:
        cfg, learner = self.cfg, self.learner
        assert learner is not None
        self.kv = await bus.models_kv(js)
        self.weights = await WeightStore.open(js, cfg.model) if cfg.share_weights else None
        await self._put_version(weights)
        subjects = [S.samples_subject(cfg.model), S.lost_subject(cfg.model)]  # one consumer: stream order
        durable = S.durable_name("trainer", S.SAMPLES_STREAM, cfg.model)
        sub = await bus.durable_pull(js, S.SAMPLES_STREAM, durable, subjects, ack_wait_s=cfg.ack_wait_s)
        self.dead_letters = bus.DeadLetters(js, "trainer")
        intake = SampleIntake(
            cfg.model, self.buffer, self.dead_letters,
            vocab_size=learner.vocab_size, max_tokens=learner.context_len or cfg.max_tokens_per_micro_batch,
            max_staleness=cfg.max_staleness, counts=self.counts, drop=self._drop,
            already_trained=self.state.sample_ids,
        )  # fmt: skip
        step_task: asyncio.Task[None] | None = None
        last_keep_alive = time.monotonic()
        if self._done():
            self.stop()
        async for msgs in bus.batches(sub, self.stopping, cfg.fetch_batch, dead_letters=intake.dead_letters):
            now = time.monotonic()
            for msg in msgs:
                await intake.handle(msg, self.version, now)
            for stall in self.buffer.stalled(now, cfg.stall_warn_s):
                self._warn_stall(stall)
            ready, dropped = self.buffer.pop_ready(now)
            self._drop(dropped, "dropped_group")
            for group in ready:
                self._observe(group)
                if await self._score(group) is not None:
                    self.ready.append(group)
            if step_task is not None and step_task.done():
                step_task.result()  # a failed step raises here: the process exits, a restart resumes
                step_task = None
            if step_task is None and self._rollback_to is not None:
                await self._rollback(self._rollback_to)
            if step_task is None and not self._done():
                batch = await self._take_batch()
                if batch is not None:
                    step_task = asyncio.create_task(self._step(js, batch))
            if self.dropped and now - self._dropped_since > cfg.drop_report_s:
                await self._report_drops(js)
            elif self.buffer.spent and step_task is None:
                await ack_all(self._take_spent())
            if now - last_keep_alive > cfg.ack_wait_s / 3:
                last_keep_alive = now
                await keep_alive(self._handles())
        if step_task is not None:
            await step_task

    def _warn_stall(self, stall: Stall) -> None:
        self.counts["stalled_groups"] += 1
        cfg = self.cfg
        log.warning(
            "model=%s group %r of client(s) %s has %d of its %d episodes (%d lost) and none new for %.0fs: it "
            "trains when %d episodes of it arrive, or at the group timeout (%.0fs) with at least %d. Play a "
            "whole group per task instance (SwarmClient.group, or group_size on begin and that many episodes)",
            cfg.model, stall.key, ",".join(stall.clients), stall.episodes, stall.size, stall.lost, cfg.stall_warn_s,
            stall.size, cfg.group_timeout_s, cfg.min_group_size,
        )  # fmt: skip

    def _observe(self, group: Group) -> None:
        """Count a formed group's task instance (`Diversity`) and its reward (`RewardGuard`), whatever
        its scores."""
        samples = [h.sample for h in group.items]
        if warning := self.diversity.observe(samples[0].task or self.cfg.model, samples[0].task_id):
            log.warning("model=%s %s", self.cfg.model, warning)
        versions = [v for s in samples for v in generated_versions(s)]
        rewards = [s.reward for s in samples]
        # A NaN reward is the group's problem, not a collapse; samples of unknown versions say nothing.
        if versions and all(math.isfinite(r) for r in rewards):
            target = self.guard.observe(min(versions), max(versions), statistics.mean(rewards))
            if target is not None and self._rollback_to is None:
                self._rollback_to = target
                log.warning(
                    "model=%s train reward collapsed: last %d groups (versions > %d) average %.3f, the best "
                    "window %.3f; rolling back to version %d",
                    self.cfg.model, self.guard.window, target, self.guard.mean(), self.guard.best, target,
                )  # fmt: skip

    async def _rollback(self, target: int) -> None:
        """Load version `target` (its checkpoint, or the base model for 0) back into the learner and
        serve it as a new version: the next step's number. Called while no step runs."""
        self._rollback_to = None
        path = step_dir(self.root, target) if target > 0 or self.cfg.lora_rank else self.base
        if not path.is_dir():
            log.error("model=%s cannot roll back: %s is gone; training on", self.cfg.model, path)
            self.guard.rolled_back(self.version + 1)
            return
        learner = self.learner
        assert learner is not None
        step = self.state.step + 1
        self.counts["rollbacks"] += 1
        state = TrainerState(self.cfg.model, step, step, [], dict(self.counts))

        def restore_and_save() -> None:
            learner.restore(path)
            learner.save(step_dir(self.root, step), state)

        await asyncio.to_thread(restore_and_save)
        self.state = state
        self.guard.rolled_back(step)
        self.discarded.append((target, step))
        await self._put_version(step_dir(self.root, step))
        log.warning("model=%s rolled back to version %d, served as version %d", self.cfg.model, target, step)

    def _handles(self) -> list[Msg]:
        """Every unacked message this trainer holds: samples waiting for a group, queued, being
        trained or dropped and not yet reported, and the lost-episode records that go with them."""
        held = [
            *self.buffer.all_held(), *(h for g in self.ready for h in g.items), *self.inflight,
            *(h for h, _ in self.dropped),
        ]  # fmt: skip
        lost = [*self.buffer.lost_handles(), *(m for g in self.ready for m in g.lost), *self.inflight_lost]
        return [*(h.handle for h in held), *lost, *self.buffer.spent]

    def _take_spent(self) -> list[Msg]:
        """The lost-episode records no group will use, or of dropped groups (`GroupBuffer.spent`),
        handed over for acking."""
        spent, self.buffer.spent = self.buffer.spent, []
        return spent

    def _drop(self, held: list[Held], reason: str) -> None:
        if held and not self.dropped:
            self._dropped_since = time.monotonic()
        self.dropped += [(h, reason) for h in held]

    async def _report_drops(self, js: JetStreamContext) -> None:
        """Report (then ack) the samples dropped since the last step without waiting for the next one:
        held, they count as backlog for admission control, which then holds the very groups the next
        step needs (a trainer whose ready groups all went stale waited forever)."""
        reported, self.dropped = self.dropped, []
        dropped = {h.sample.sample_id: reason for h, reason in reported}
        msg = SampleDrops(model=self.cfg.model, step=self.state.step, dropped=dropped)
        digest = hashlib.sha1("\n".join(sorted(dropped)).encode()).hexdigest()[:16]
        headers = {"Nats-Msg-Id": f"drops-{self.cfg.model}-{digest}"}
        await retry(
            self.stopping, js.publish, S.drops_metrics_subject(self.cfg.model), encode(msg), headers=headers
        )
        await ack_all([*(h.handle for h, _ in reported), *self._take_spent()])
        log.info("model=%s reported %d dropped samples between steps", self.cfg.model, len(dropped))

    def _done(self) -> bool:
        return self.cfg.max_steps > 0 and self.state.step >= self.cfg.max_steps

    async def _score(self, group: Group) -> GroupScore | None:
        """Score `group` at the current version; ack and drop stale samples, samples of versions a
        rollback threw away, or the whole group."""
        gone = [self._discarded(h.sample) for h in group.items] if self.discarded else []
        if any(gone):
            self.counts["dropped_rolled_back"] += sum(gone)
            self._drop([h for h, g in zip(group.items, gone, strict=True) if g], "rolled_back")
            group.items = [h for h, g in zip(group.items, gone, strict=True) if not g]
        score = self._score_samples([h.sample for h in group.items])
        stale = [h for h, st in zip(group.items, score.stale, strict=True) if st]
        if stale:
            self.counts["dropped_stale"] += len(stale)
            self._drop(stale, "stale")
            group.items = [h for h, st in zip(group.items, score.stale, strict=True) if not st]
            score = self._score_samples([h.sample for h in group.items])
        if score.status == "ok":
            return score
        self.counts[f"{score.status}_groups"] += 1
        self._drop(group.items, score.status)
        self.buffer.spent += group.lost
        return None

    def _discarded(self, sample: Sample) -> bool:
        """A token of `sample` was generated by a version a rollback threw away. Trained on such
        samples, the restored policy of round 10 of the peers race fell again within seconds, five
        times in 20 s (bench/results/peers-20min-round10/). Not kept across a restart of the trainer."""
        return any(good < v < served for v in sample.policy_versions for good, served in self.discarded)

    def _score_samples(self, samples: list[Sample]) -> GroupScore:
        cfg = self.cfg
        return score_group(
            samples, self.version, max_staleness=cfg.max_staleness, min_group_size=cfg.min_group_size,
            per_episode_norm=cfg.per_episode_norm, skip_zero_adv=cfg.skip_zero_adv_groups,
        )  # fmt: skip

    async def _take_batch(self) -> list[Scored] | None:
        """Up to `batch_groups` groups re-scored at the current version, or None while fewer than
        `min_batch_groups` (0: `batch_groups`) are ready, or fewer than `batch_groups` for less than
        `batch_wait_s` (groups stay queued)."""
        cfg = self.cfg
        need = cfg.min_batch_groups or cfg.batch_groups
        taken: list[tuple[Group, GroupScore]] = []
        while self.ready and len(taken) < cfg.batch_groups:
            group = self.ready.popleft()
            score = await self._score(group)
            if score is not None:
                taken.append((group, score))
        if len(taken) < need:
            self._short_since = None
        elif len(taken) < cfg.batch_groups and cfg.batch_wait_s > 0:
            now = time.monotonic()
            self._short_since = now if self._short_since is None else self._short_since
            if now - self._short_since < cfg.batch_wait_s:
                need = cfg.batch_groups
        if len(taken) < need:
            self.ready.extendleft(g for g, _ in reversed(taken))
            return None
        self._short_since = None
        self.inflight = [h for g, _ in taken for h in g.items]
        self.inflight_lost = [m for g, _ in taken for m in g.lost]
        return [Scored(h.sample, a) for g, s in taken for h, a in zip(g.items, s.advantages, strict=True)]

    async def _step(self, js: JetStreamContext, items: list[Scored]) -> None:
        started = time.perf_counter()
        version, step = self.version, self.state.step + 1
        state = TrainerState(
            self.cfg.model, step, step, [it.sample.sample_id for it in items], dict(self.counts)
        )
        path = step_dir(self.root, step)
        try:
            result = await asyncio.to_thread(self._train_and_save, step, version, items, state)
        except NonFiniteWeights as exc:
            # Stop rather than reload in place: the restarted trainer resumes from its newest
            # checkpoint (never written from non-finite weights) through the resume path that works on
            # one process or N, where an in-place reload would need its own FSDP-aware code. The
            # step's samples are nak'ed on the way out and retried from the good weights; a batch that
            # keeps doing this is dead-lettered as `poison` after `bus.MAX_DELIVERIES`.
            log.error("model=%s step %d not saved, no new version; stopping: %s", self.cfg.model, step, exc)
            raise
        await self._dead_letter_skipped(result.skipped)
        if not result.learned:
            log.warning("model=%s step %d skipped: no update applied (non-finite)", self.cfg.model, step)
            return
        self.state = state
        await self._put_version(path)
        trained = [it for it in items if it.sample.sample_id not in result.skipped]
        reported, self.dropped = self.dropped, []
        dropped = {h.sample.sample_id: reason for h, reason in reported}
        await self._publish_metrics(
            js, trained, version, result.stats, time.perf_counter() - started, dropped
        )
        await ack_all(h.handle for h in self.inflight)
        await ack_all([*self.inflight_lost, *(h.handle for h, _ in reported), *self._take_spent()])
        self.inflight, self.inflight_lost = [], []
        await asyncio.to_thread(prune, self.root, self._keep(), self.guard.good_version)
        if self._done():
            log.info("model=%s reached max_steps=%d", self.cfg.model, self.cfg.max_steps)
            self.stop()

    def _keep(self) -> int:
        """Checkpoints to keep: `keep_checkpoints`, and with the collapse guard every version a group
        can still come from (`max_staleness`), so that the version the guard marks good is on disk."""
        cfg = self.cfg
        return (
            max(cfg.keep_checkpoints, cfg.max_staleness + 1) if cfg.rollback_window else cfg.keep_checkpoints
        )

    async def _dead_letter_skipped(self, skipped: dict[str, str]) -> None:
        """Dead-letter (and ack) the samples of updates the learner did not apply; they leave `inflight`."""
        bad = [h for h in self.inflight if h.sample.sample_id in skipped]
        self.inflight = [h for h in self.inflight if h.sample.sample_id not in skipped]
        assert self.dead_letters is not None
        await dead_letter_all(bad, self.dead_letters, skipped)
        self.counts["skipped_nonfinite"] += len(bad)

    def _train_and_save(
        self, step: int, version: int, items: list[Scored], state: TrainerState
    ) -> StepResult:
        learner = self.learner
        assert learner is not None
        learner.broadcast((step, version, items, state))
        result = learner.train_step(learner.shard(items), version)
        if result.learned:  # the same on every process: the learner's skip decisions are collective
            t0 = time.perf_counter()
            learner.save(step_dir(self.root, step), state)
            result.stats["save_s"] = time.perf_counter() - t0
        return result

    def _follow(self) -> None:
        learner = self.learner
        assert learner is not None
        while (work := learner.broadcast(None)) is not None:
            step, version, items, state = work
            if learner.train_step(learner.shard(items), version).learned:
                learner.save(step_dir(self.root, step), state)

    async def _put_version(self, path: Path) -> None:
        """Point engines at `path`: only ever weights `Learner.check_weights` passed (on load or in
        `save`), so no KV version names non-finite weights."""
        assert self.kv is not None
        mv = ModelVersion(version=self.state.version, path=str(path), step=self.state.step)
        if self.weights is not None:  # first the files, for engines on other hosts (`share_weights`)
            await retry(self.stopping, self.weights.put, mv.version, path)
        await retry(self.stopping, self.kv.put, self.cfg.model, encode(mv))
        log.info(
            "model=%s version=%d path=%s put in KV %s", self.cfg.model, mv.version, mv.path, S.MODELS_BUCKET
        )

    @staticmethod
    def task_metrics(samples: list[Sample]) -> dict[str, float]:
        """`reward_mean.<task>` and `samples.<task>` for each task named in a step's samples (cocktail
        training mixes tasks in one step). Samples without a task name count only in `reward_mean`."""
        by_task: dict[str, list[float]] = {}
        for s in samples:
            if s.task:
                by_task.setdefault(s.task, []).append(s.reward)
        out: dict[str, float] = {}
        for task, rewards in sorted(by_task.items()):
            out[f"reward_mean.{task}"] = statistics.mean(rewards)
            out[f"samples.{task}"] = float(len(rewards))
        return out

    async def _publish_metrics(
        self,
        js: JetStreamContext,
        items: list[Scored],
        version: int,
        stats: dict[str, float],
        wall_s: float,
        dropped: dict[str, str],
    ) -> None:
        rewards = [it.sample.reward for it in items]
        # Exact arithmetic: a float sum of huge finite rewards overflows, and a TrainStep refuses inf.
        mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
        stale = [staleness(it.sample, version) for it in items]
        extra = {k: float(v) for k, v in stats.items() if k not in ("loss", "tokens", "trained_tokens")}
        extra.update({k: float(v) for k, v in self.counts.items()})
        extra.update(held_samples=float(len(self.buffer)), ready_groups=float(len(self.ready)))
        extra.update(self.task_metrics([it.sample for it in items]))
        extra.update({f"distinct.{task}": share for task, share in self.diversity.shares().items()})
        msg = TrainStep(
            model=self.cfg.model, step=self.state.step, policy_version=self.state.version, loss=stats["loss"],
            reward_mean=mean, reward_std=std,
            samples=len(items), tokens=int(stats["tokens"]), trained_tokens=int(stats["trained_tokens"]),
            tokens_per_s=stats["tokens"] / max(stats["update_s"], 1e-9),
            staleness_mean=sum(stale) / len(stale), staleness_max=max(stale), wall_s=wall_s, extra=extra,
            sample_ids=[it.sample.sample_id for it in items], dropped=dropped,
        )  # fmt: skip
        subject = S.train_metrics_subject(self.cfg.model)
        headers = {"Nats-Msg-Id": f"train-{self.cfg.model}-{msg.step}"}
        await retry(self.stopping, js.publish, subject, encode(msg), headers=headers)
        log.info(
            "model=%s step=%d loss=%.4f reward=%.3f samples=%d tokens=%d update=%.2fs save=%.2fs clip=%.3f",
            self.cfg.model, msg.step, msg.loss, mean, msg.samples, msg.tokens, stats["update_s"],
            stats["save_s"], stats["clip_frac"],
        )  # fmt: skip
