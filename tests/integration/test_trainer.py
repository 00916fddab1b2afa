"""The trainer against a real nats-server and the real tiny model: steps, KV versions, metrics, acks,
dead letters, resume, and non-finite values kept away from the weights."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import msgpack
import nats
import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import LostEpisode, ModelVersion, Sample, SampleDrops, TrainStep, decode, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.trainer.config import TrainerConfig
from swarmrl.services.trainer.learner import NonFiniteWeights
from swarmrl.services.trainer.service import Trainer
from tests.conftest import wait_for
from tests.unit.trainer.samples import OVERFLOWING_ADAMW, make_sample

MODEL = "tiny"
VOCAB = 500  # token ids drawn below the tiny model's vocabulary (about 800)
REWARDS = [1.0, 0.0, 0.5, 0.0]


def group(name: str, version: int = 0, rewards: list[float] = REWARDS) -> list[Sample]:
    return [
        make_sample(
            f"{name}-ep{i}", r, group=name, prompt=20, gen=30, vocab=VOCAB, model=MODEL, version=version
        )
        for i, r in enumerate(rewards)
    ]


def config(server: NatsServer, model_dir: Path, tmp_path: Path, **fields: object) -> TrainerConfig:
    """The trainer under test: groups of 4, a high lr, short packed rows; `fields` override."""
    base: dict[str, object] = {
        "nats": server.service_url, "model": MODEL, "model_path": str(model_dir),
        "run_dir": str(tmp_path / "run"), "num_repeat": 4, "lr": 1e-3, "max_tokens_per_micro_batch": 256,
    }  # fmt: skip
    return TrainerConfig(**(base | fields))  # type: ignore[arg-type]


async def publish(js: nats.js.JetStreamContext, samples: list[Sample]) -> None:
    for s in samples:
        await js.publish(S.samples_subject(MODEL), encode(s), headers={"Nats-Msg-Id": s.sample_id})


async def fetch_all(js: nats.js.JetStreamContext, subject: str, stream: str) -> list:
    sub = await js.pull_subscribe(subject, stream=stream)
    try:
        return await sub.fetch(100, timeout=1.0)
    except TimeoutError:  # nats.errors.TimeoutError, or the plain one nats.py raises as a fetch expires
        return []


async def versions(kv) -> list[ModelVersion]:
    return [decode(e.value, ModelVersion) for e in await kv.history(MODEL)]


@pytest.mark.timeout(90)
async def test_trainer_steps_publishes_versions_and_resumes(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    # drops wait for a step to report them (no SampleDrops between steps, however slow a step is)
    cfg = config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=2, max_steps=2, drop_report_s=60.0)
    await publish(js, group("g0") + group("g1"))
    await publish(js, [make_sample(f"same-ep{i}", 1.0, group="same", vocab=VOCAB) for i in range(4)])
    await js.publish(S.samples_subject(MODEL), b"\xc1 not msgpack")
    await publish(js, group("g2") + group("g3"))

    await asyncio.wait_for((await Trainer.start(cfg)).run(), timeout=45)  # returns at max_steps

    kv = await bus.models_kv(js)
    history = await versions(kv)
    assert [(v.version, v.step) for v in history] == [(0, 0), (1, 1), (2, 2)]
    assert Path(history[0].path) == tiny_model_dir
    for v in history[1:]:
        assert Path(v.path).name == f"step-{v.step}"
        AutoModelForCausalLM.from_pretrained(v.path)

    steps = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert [s.step for s in steps] == [1, 2]
    first = steps[0]
    assert first.samples == 8 and first.tokens == 8 * 50 and first.trained_tokens == 8 * 30
    assert first.reward_mean == pytest.approx(0.375) and first.staleness_max == 0
    assert steps[1].staleness_max == 1 and steps[1].extra["off_policy_frac"] == 1.0
    assert steps[1].extra["zero_adv_groups"] == 1 and steps[1].extra["dead_letters"] == 1
    # every sample is reported once: trained by a step, or dropped with its reason
    assert sorted(first.sample_ids + steps[1].sample_ids) == sorted(
        x.sample_id for g in ("g0", "g1", "g2", "g3") for x in group(g)
    )
    assert first.dropped | steps[1].dropped == {f"same-ep{i}.a.{MODEL}.0": "zero_adv" for i in range(4)}

    durable = S.durable_name("trainer", S.SAMPLES_STREAM, MODEL)
    info = await js.consumer_info(S.SAMPLES_STREAM, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0  # every sample acked, none waiting

    (dead,) = await fetch_all(js, S.dlq_subject("trainer"), "DLQ")
    assert dead.data == b"\xc1 not msgpack" and dead.headers[bus.REASON_HEADER].startswith("malformed")

    # A restarted trainer resumes at step 2, re-puts version 2, and its next step is 3. It skips a
    # replay of a sample its last checkpoint trained and drops one too stale for max_staleness=1.
    await publish(js, group("g4", version=2) + group("g5", version=2))
    replay = group("g3")[0]
    await js.publish(S.samples_subject(MODEL), encode(replay), headers={"Nats-Msg-Id": "replayed"})
    await publish(js, [make_sample("old-ep0", 1.0, group="g6", vocab=VOCAB, version=0)])
    resumed = await Trainer.start(cfg.model_copy(update={"max_steps": 3, "max_staleness": 1}))
    await asyncio.wait_for(resumed.run(), timeout=45)
    history = await versions(kv)
    assert [v.version for v in history] == [0, 1, 2, 2, 3]
    steps = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert [s.step for s in steps] == [1, 2, 3]
    assert steps[2].extra["dead_letters"] == 1  # counters survive the restart
    assert steps[2].extra["already_trained"] == 1 and steps[2].extra["dropped_stale"] == 1
    assert steps[2].staleness_max == 0
    assert list(steps[2].dropped.values()) == ["stale"] and "old-ep0" in next(iter(steps[2].dropped))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints" / MODEL).iterdir()) == [
        "step-1",
        "step-2",
        "step-3",
    ]
    await nc.close()


async def publish_lost(
    js: nats.js.JetStreamContext, episode: str, group_key: str, model: str = MODEL
) -> None:
    lost = LostEpisode(
        episode_id=episode, model=model, group_key=group_key, status="aborted", reason="killed"
    )
    await js.publish(S.lost_subject(model), encode(lost), headers={"Nats-Msg-Id": f"lost-{episode}-{model}"})


@pytest.mark.timeout(90)
async def test_a_group_with_a_dropped_episode_is_trained_without_waiting_for_the_timeout(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The merger's lost-episode record comes through the trainer's own consumer, in stream order
    with the samples; it is acked with the group's samples once their step is checkpointed."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    await publish(js, group("short")[:3])  # the 4th episode's client aborted: the merger says so
    await publish_lost(js, "short-ep3", "short")
    await publish_lost(js, "x", "short", model="other")  # another model's trainer reads that one
    cfg = config(
        swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, max_steps=1,
        group_timeout_s=3600,  # only the merger's word can release the group in time
    )  # fmt: skip
    trainer = await Trainer.start(cfg)
    await asyncio.wait_for(trainer.run(), timeout=45)
    (step,) = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert step.samples == 3 and step.extra["short_groups"] == 1 and step.extra["lost_episodes"] == 1
    info = await js.consumer_info(S.SAMPLES_STREAM, S.durable_name("trainer", S.SAMPLES_STREAM, MODEL))
    assert info.num_ack_pending == 0 and info.num_pending == 0  # the record was acked with the group
    await nc.close()


@pytest.mark.timeout(120)
async def test_a_restarted_trainer_gets_the_lost_records_of_the_groups_it_had_not_trained(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A trainer that stops with a group formed but untrained hands back its samples and the lost
    record that completed it; the next trainer gets both and trains the group at once. Before the
    record existed, a restarted trainer replayed merge stats by time, and a group whose record it
    missed waited out the group timeout while admission held new groups on its backlog (the chaos
    run stalled for 7 minutes)."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    await publish_lost(js, "gone-ep3", "gone")
    await publish(js, group("gone")[:3])
    cfg = config(
        swarm_nats, tiny_model_dir, tmp_path, batch_groups=2, min_batch_groups=0, max_steps=1,
        group_timeout_s=3600,
    )  # fmt: skip
    first = await Trainer.start(cfg)  # waits for a second group that never comes (every step takes 2)
    run = asyncio.create_task(first.run())
    await wait_for(lambda: len(first.ready) == 1 or run.done(), what="the first trainer formed the group")
    first.stop()
    await asyncio.wait_for(run, timeout=30)
    assert first.state.step == 0
    await asyncio.wait_for(
        (await Trainer.start(cfg.model_copy(update={"batch_groups": 1}))).run(), timeout=45
    )
    (step,) = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert step.samples == 3 and step.extra["short_groups"] == 1 and step.extra["lost_episodes"] == 1
    await nc.close()


@pytest.mark.timeout(90)
async def test_dropped_samples_are_reported_and_acked_without_waiting_for_a_step(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A group dropped untrained (here: zero advantage) is reported on `swarm.metrics.drops` and acked
    although no step follows. Held until a step, its samples counted as backlog for admission control,
    which then held the groups that step needed: the chaos run's second stall."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    same = [make_sample(f"flat-ep{i}", 1.0, group="flat", vocab=VOCAB, model=MODEL) for i in range(4)]
    await publish(js, same)
    trainer = await Trainer.start(
        config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, drop_report_s=0.5)
    )
    run = asyncio.create_task(trainer.run())
    durable = S.durable_name("trainer", S.SAMPLES_STREAM, MODEL)

    async def acked() -> bool:
        try:
            info = await js.consumer_info(S.SAMPLES_STREAM, durable)
        except nats.js.errors.NotFoundError:  # the trainer has not bound its consumer yet
            return False
        return info.num_ack_pending == 0 and info.num_pending == 0 and info.delivered.stream_seq >= 4

    await wait_for(acked, timeout=30, what="the dropped group to be acked without a step")
    (report,) = [
        decode(m.data, SampleDrops) for m in await fetch_all(js, S.drops_metrics_subject(MODEL), "METRICS")
    ]
    assert report.dropped == {s.sample_id: "zero_adv" for s in same} and report.step == 0
    assert await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS") == []
    trainer.stop()
    await asyncio.wait_for(run, timeout=30)
    await nc.close()


@pytest.mark.timeout(90)
async def test_min_batch_groups_steps_on_the_groups_that_are_ready(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With `min_batch_groups = 1` a free trainer steps on the trainable groups ready, up to
    `batch_groups`: three groups published before it starts make one step of three; one more group
    alone makes the next step instead of waiting for three others."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    await publish(js, group("a") + group("b") + group("c"))
    cfg = config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=4, min_batch_groups=1, max_steps=2)
    run = asyncio.create_task((await Trainer.start(cfg)).run())

    async def steps() -> list[TrainStep]:
        return [
            decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
        ]

    async def stepped_once() -> bool:
        return len(await steps()) == 1

    await wait_for(stepped_once, timeout=45, what="the first step")
    await publish(js, group("d"))
    await asyncio.wait_for(run, timeout=45)  # returns at max_steps = 2
    first, second = await steps()
    assert sorted(first.sample_ids) == sorted(x.sample_id for g in "abc" for x in group(g))
    assert sorted(second.sample_ids) == sorted(x.sample_id for x in group("d"))
    await nc.close()


@pytest.mark.timeout(120)
async def test_batch_wait_s_fills_a_step_that_is_short_then_steps_with_fewer(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With `min_batch_groups = 1` and `batch_wait_s`, a free trainer holding two of its four groups
    waits: two more arriving within the wait make one step of four (without the wait it would step
    on the first two). One group alone then steps once the wait runs out, instead of waiting for three
    others. A `min_batch_groups` above `batch_groups` is refused."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    await bus.ensure_streams(js)
    await publish(js, group("a") + group("b"))
    cfg = config(
        swarm_nats, tiny_model_dir, tmp_path, batch_groups=4, min_batch_groups=1, batch_wait_s=6.0,
        max_steps=2,
    )  # fmt: skip
    trainer = await Trainer.start(cfg)
    run = asyncio.create_task(trainer.run())
    await wait_for(lambda: len(trainer.ready) == 2 or run.done(), what="the trainer to hold two groups")
    await publish(js, group("c") + group("d"))
    await wait_for(lambda: trainer.state.step == 1 or run.done(), timeout=45, what="the first step")
    await publish(js, group("e"))
    await asyncio.wait_for(run, timeout=45)  # returns at max_steps = 2
    first, second = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert sorted(first.sample_ids) == sorted(x.sample_id for g in "abcd" for x in group(g))
    assert sorted(second.sample_ids) == sorted(x.sample_id for x in group("e"))
    with pytest.raises(ValueError, match="min_batch_groups 5 > batch_groups 4"):
        TrainerConfig.model_validate(cfg.model_dump() | {"min_batch_groups": 5})
    await nc.close()


def weights(path: str | Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.mark.timeout(150)
async def test_a_collapsed_train_reward_rolls_the_policy_back_to_the_best_windows_version(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`rollback_window`: groups made by versions 1-2 average 0.75, then groups of versions 3-4 score 0
    (a collapse). The trainer loads version 2's checkpoint back (pinned on disk past the newest
    checkpoints it keeps), weights and optimizer state, and serves it as version 5; samples of the
    collapsed versions still arriving are dropped, and do not roll it back again."""
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    cfg = config(
        swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, keep_checkpoints=1, max_staleness=1,
        rollback_window=2, rollback_drop=0.3,
    )  # fmt: skip
    trainer = await Trainer.start(cfg)
    run = asyncio.create_task(trainer.run())

    async def step(n: int) -> None:
        await wait_for(lambda: trainer.state.step == n or run.done(), timeout=45, what=f"step {n}")
        assert not run.done(), run.result()

    await publish(js, group("a", 0, [0.0, 1.0, 0.0, 0.0]) + group("b", 0, [0.0, 1.0, 0.0, 0.0]))
    await step(2)
    await publish(js, group("c", 1, [1.0, 1.0, 1.0, 0.0]) + group("d", 2, [1.0, 1.0, 1.0, 0.0]))
    await step(4)
    root = tmp_path / "run" / "checkpoints" / MODEL
    # The guard keeps max_staleness + 1 = 2 checkpoints (step-2 is still one of them).
    assert {"step-3", "step-4"} <= {p.name for p in root.iterdir()}
    before = weights(root / "step-2")
    collapsed = weights(root / "step-4")
    await publish(js, group("e", 3, [0.0] * 4) + group("f", 4, [0.0] * 4))
    await step(5)
    assert trainer.counts["rollbacks"] == 1 and trainer.guard.since == 5
    restored = weights(root / "step-5")
    assert all(torch.equal(restored[k], before[k]) for k in before)
    assert any(not torch.equal(restored[k], collapsed[k]) for k in before)
    adam = [torch.load(root / f"step-{n}" / "optimizer-rank0.pt", weights_only=False) for n in (2, 5)]
    assert adam[0]["state"][0]["step"] == adam[1]["state"][0]["step"] == 2  # version 2's AdamW state
    kv = await bus.models_kv(js)
    assert [(v.version, Path(v.path).name) for v in await versions(kv)][-1] == (5, "step-5")
    # Late groups of the thrown-away versions 3-4 are neither counted by the guard nor trained, even
    # one with a learning signal (g); the restored policy's groups train on.
    await publish(js, group("g", 4) + group("h", 4, [0.0] * 4) + group("i", 5))
    await step(6)
    assert trainer.counts["rollbacks"] == 1 and trainer.counts["dropped_rolled_back"] == 8
    # step-2 stays pinned past the two newest (step-5, step-6): the guard's good version.
    await wait_for(
        lambda: sorted(p.name for p in root.iterdir()) == ["step-2", "step-5", "step-6"], what="pruning"
    )
    last = decode((await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS"))[-1].data, TrainStep)
    assert last.step == 6 and sorted(last.sample_ids) == sorted(x.sample_id for x in group("i", 5))
    trainer.stop()
    await asyncio.wait_for(run, timeout=30)
    await nc.close()


def assert_finite_checkpoint(path: str | Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(path)
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    assert not bad, f"{path}: non-finite {bad}"


@pytest.mark.timeout(90)
async def test_nonfinite_values_are_dead_lettered_and_training_goes_on(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    trainer = await Trainer.start(config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, max_steps=1))
    run = asyncio.create_task(trainer.run())
    # At the edge: a NaN logprob, as a merger in another language could send it.
    nan_logprob = msgpack.unpackb(encode(group("edge")[0]))
    nan_logprob["logprobs"][25] = math.nan
    await js.publish(S.samples_subject(MODEL), msgpack.packb(nan_logprob))
    # In depth: finite rewards, so the schema takes them, whose sum overflows: every advantage of the
    # group is NaN, and so is the loss of the step that trains it.
    huge = [
        make_sample(f"huge-ep{i}", r, group="huge", prompt=20, gen=30, vocab=VOCAB)
        for i, r in enumerate([1.7e308, 1.7e308, 0.0, 0.0])
    ]
    await publish(js, huge)
    await wait_for(lambda: trainer.counts["skipped_nonfinite"] == 4 or run.done(), what="the refused step")
    await publish(js, group("good"))
    await asyncio.wait_for(run, timeout=45)  # returns at max_steps: the good group made step 1

    kv = await bus.models_kv(js)
    assert [(v.version, v.step) for v in await versions(kv)] == [(0, 0), (1, 1)]  # none for the refusal
    assert_finite_checkpoint((await versions(kv))[-1].path)
    assert trainer.learner is not None
    trainer.learner.check_weights("after the run")

    (step,) = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert step.step == 1 and step.samples == 4 and step.reward_mean == pytest.approx(0.375)
    assert step.extra["skipped_nonfinite"] == 4 and step.extra["dead_letters"] == 1

    dead = await fetch_all(js, S.dlq_subject("trainer"), "DLQ")
    reasons = [m.headers[bus.REASON_HEADER] for m in dead]
    assert reasons[0].startswith("schema: logprobs.25: Input should be a finite number"), reasons
    assert all(r.startswith("nonfinite: loss nan in optimizer update 1/1") for r in reasons[1:]), reasons
    assert sorted(decode(m.data, Sample).sample_id for m in dead[1:]) == sorted(s.sample_id for s in huge)
    durable = S.durable_name("trainer", S.SAMPLES_STREAM, MODEL)
    info = await js.consumer_info(S.SAMPLES_STREAM, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0  # dead-lettered ones acked, not redelivered
    await nc.close()


@pytest.mark.timeout(120)
async def test_nonfinite_weights_are_never_saved_nor_served_and_a_restart_recovers(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    cfg = config(swarm_nats, tiny_model_dir, tmp_path, batch_groups=1, max_steps=1)
    await publish(js, group("g0"))
    # Finite loss and gradients, but one AdamW step takes the weights to ±inf: the trainer stops.
    with pytest.raises(NonFiniteWeights, match="for step-1"):
        await asyncio.wait_for(
            (await Trainer.start(cfg.model_copy(update=OVERFLOWING_ADAMW))).run(), timeout=45
        )
    kv = await bus.models_kv(js)
    assert [(v.version, v.step) for v in await versions(kv)] == [(0, 0)]
    assert not (tmp_path / "run" / "checkpoints" / MODEL).exists()  # not even a .tmp directory
    assert not await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")

    # Its samples were handed back: the restarted trainer resumes from the last good state (here the
    # base model) and trains them.
    await asyncio.wait_for((await Trainer.start(cfg)).run(), timeout=45)
    history = await versions(kv)
    assert [(v.version, v.step) for v in history] == [(0, 0), (0, 0), (1, 1)]
    assert_finite_checkpoint(history[-1].path)
    (step,) = [
        decode(m.data, TrainStep) for m in await fetch_all(js, S.train_metrics_subject(MODEL), "METRICS")
    ]
    assert step.step == 1 and step.samples == 4
    assert not await fetch_all(js, S.dlq_subject("trainer"), "DLQ")
    await nc.close()
