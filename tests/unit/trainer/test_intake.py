"""The trainer's intake: what happens to a sample message as it arrives (`SampleIntake.handle`)."""

from __future__ import annotations

import asyncio
from collections import Counter

from nats.aio.msg import Msg

from swarmrl.schemas import encode
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
