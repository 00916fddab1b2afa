"""The trainer's intake: what happens to a sample message as it arrives (`SampleIntake.handle`)."""

from __future__ import annotations

import asyncio
from collections import Counter

from nats.aio.msg import Msg

from swarmrl.schemas import LostEpisode, encode
from swarmrl.services.trainer.grouping import GroupBuffer, Held
from swarmrl.services.trainer.intake import SampleIntake
from tests.unit.trainer.samples import make_sample


def test_a_sample_stale_on_arrival_takes_its_episode_out_of_its_group() -> None:
    """A group whose slowest episode arrived stale completes with the rest at once. Before, the
    stale sample was dropped alone, its group waited for it until the group timeout, and the held
    siblings counted as backlog, so admission control held every new group: the swarm idled for
    minutes (`bench/results/chaos-fault-free.md`: 166 s without a train step, no fault injected)."""
    buffer = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2)
    dropped: list[tuple[Held, str]] = []
    intake = SampleIntake(
        "tiny", buffer, None,  # type: ignore[arg-type]  # nothing here is dead-lettered
        vocab_size=50, max_tokens=4096, max_staleness=2, counts=Counter(),
        drop=lambda held, why: dropped.extend((h, why) for h in held),
    )  # fmt: skip

    async def arrive(episode: str, reward: float, version: int) -> None:
        data = encode(make_sample(episode, reward, version=version))
        msg = Msg(None, subject="swarm.samples.tiny", data=data)  # type: ignore[arg-type]
        await intake.handle(msg, version=5, now=0.0)

    async def main() -> None:
        for i in range(3):
            await arrive(f"e{i}", float(i % 2), version=4)
        await arrive("slow", 1.0, version=1)  # 4 versions behind: stale
        ready, _ = buffer.pop_ready(now=1.0)
        assert [g.episodes for g in ready] == [3] and ready[0].partial
        assert [(h.sample.episode_id, why) for h, why in dropped] == [("slow", "stale")]

    asyncio.run(main())


def test_a_lost_record_on_the_lost_subject_counts_its_episode_out() -> None:
    """The merger's `LostEpisode` comes through the same consumer as the samples: the group completes
    without the lost episode and carries the record's message, acked with its samples. A record of
    another model, or bytes that are not one, is a dead letter."""
    buffer = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2)
    dead: list[tuple[Msg, str]] = []

    class Letters:  # the dead-letter publisher's interface, recording instead of publishing
        async def send(self, msg: Msg, reason: str) -> None:
            dead.append((msg, reason))

    intake = SampleIntake(
        "tiny", buffer, Letters(),  # type: ignore[arg-type]
        vocab_size=50, max_tokens=4096, max_staleness=2, counts=Counter(), drop=lambda held, why: None,
    )  # fmt: skip

    def msg(subject: str, data: bytes) -> Msg:  # unconnected: its ack fails, which intake logs
        return Msg(None, subject=subject, data=data)  # type: ignore[arg-type]

    async def main() -> None:
        lost = msg("swarm.samples.tiny.lost", encode(LostEpisode(
            episode_id="gone", model="tiny", group_key="g", status="aborted", reason="client killed")))  # fmt: skip
        await intake.handle(lost, version=0, now=0.0)
        for i in range(3):
            await intake.handle(msg("swarm.samples.tiny", encode(make_sample(f"e{i}", float(i % 2)))), 0, 0.0)
        (group,), _ = buffer.pop_ready(now=1.0)
        assert group.episodes == 3 and group.lost == [lost]
        other = LostEpisode(episode_id="x", model="other", group_key="g", status="timeout")
        await intake.handle(msg("swarm.samples.tiny.lost", encode(other)), 0, 0.0)
        await intake.handle(msg("swarm.samples.tiny.lost", b"\x93junk"), 0, 0.0)
        assert [r.split(":")[0] for _, r in dead] == ["subject", "malformed"]

    asyncio.run(main())
