"""The trainer's intake: what happens to a sample message as it arrives (`SampleIntake.handle`), and
the one book of the messages it holds (`Unacked`)."""

from __future__ import annotations

import asyncio
from collections import Counter

from nats.aio.msg import Msg

from swarmrl.schemas import LostEpisode, encode
from swarmrl.services.trainer.grouping import GroupBuffer
from swarmrl.services.trainer.intake import SampleIntake, Unacked
from tests.unit.trainer.samples import make_sample


def js_msg(subject: str, data: bytes, seq: int, delivered: int = 1) -> Msg:
    """A JetStream delivery of stream sequence `seq`, unconnected: its ack fails, which intake logs."""
    reply = f"$JS.ACK.SAMPLES.trainer.{delivered}.{seq}.{seq}.0.0"
    return Msg(None, subject=subject, reply=reply, data=data)  # type: ignore[arg-type]


class Letters:  # the dead-letter publisher's interface, recording instead of publishing
    def __init__(self) -> None:
        self.sent: list[tuple[Msg, str]] = []

    async def send(self, msg: Msg, reason: str) -> None:
        self.sent.append((msg, reason))


def intake(buffer: GroupBuffer, letters: Letters) -> tuple[SampleIntake, Unacked]:
    unacked = Unacked(letters, ack_wait_s=30.0, report_s=0.5)  # type: ignore[arg-type]
    return SampleIntake(
        "tiny", buffer, unacked, vocab_size=50, max_tokens=4096, max_staleness=2, counts=Counter()
    ), unacked


def test_a_sample_stale_on_arrival_takes_its_episode_out_of_its_group() -> None:
    """A group whose slowest episode arrived stale completes with the rest at once. Before, the
    stale sample was dropped alone, its group waited for it until the group timeout, and the held
    siblings counted as backlog, so admission control held every new group: the swarm idled for
    minutes (`bench/results/chaos-fault-free.md`: 166 s without a train step, no fault injected)."""
    buffer = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2)
    handler, unacked = intake(buffer, Letters())  # nothing here is dead-lettered

    async def arrive(episode: str, reward: float, version: int, seq: int) -> None:
        data = encode(make_sample(episode, reward, version=version))
        await handler.handle(js_msg("swarm.samples.tiny", data, seq), version=5, now=0.0)

    async def main() -> None:
        for i in range(3):
            await arrive(f"e{i}", float(i % 2), version=4, seq=i + 1)
        await arrive("slow", 1.0, version=1, seq=4)  # 4 versions behind: stale
        ready, _ = buffer.pop_ready(now=1.0)
        assert [g.episodes for g in ready] == [3] and ready[0].partial
        assert [(d.sample.episode_id, d.reason) for d in unacked.dropped.values()] == [("slow", "stale")]
        assert sorted(unacked.msgs) == [1, 2, 3, 4]  # every one held until its step or its report

    asyncio.run(main())


def test_a_lost_record_on_the_lost_subject_counts_its_episode_out() -> None:
    """The merger's `LostEpisode` comes through the same consumer as the samples: the group completes
    without the lost episode and carries the record's message, acked with its samples. A record of
    another model, or bytes that are not one, is a dead letter."""
    buffer = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2)
    letters = Letters()
    handler, unacked = intake(buffer, letters)

    async def main() -> None:
        lost = js_msg("swarm.samples.tiny.lost", encode(LostEpisode(
            episode_id="gone", model="tiny", group_key="g", status="aborted", reason="client killed")), seq=1)  # fmt: skip
        await handler.handle(lost, version=0, now=0.0)
        for i in range(3):
            data = encode(make_sample(f"e{i}", float(i % 2)))
            await handler.handle(js_msg("swarm.samples.tiny", data, seq=2 + i), 0, 0.0)
        (group,), _ = buffer.pop_ready(now=1.0)
        assert group.episodes == 3 and group.lost == [1] and unacked.msgs[1] is lost
        other = LostEpisode(episode_id="x", model="other", group_key="g", status="timeout")
        await handler.handle(js_msg("swarm.samples.tiny.lost", encode(other), seq=5), 0, 0.0)
        await handler.handle(js_msg("swarm.samples.tiny.lost", b"\x93junk", seq=6), 0, 0.0)
        assert [r.split(":")[0] for _, r in letters.sent] == ["subject", "malformed"]
        assert sorted(unacked.msgs) == [1, 2, 3, 4]  # the dead letters are settled, not held

    asyncio.run(main())


def test_a_redelivery_of_a_held_message_only_refreshes_its_handle() -> None:
    """JetStream redelivers a held message whose ack wait ran out: the newest delivery is what acks
    it, and the sample is not taken in a second time (it would join a second group)."""
    buffer = GroupBuffer(num_repeat=4, timeout_s=300.0, min_group_size=2)
    handler, unacked = intake(buffer, Letters())

    async def main() -> None:
        data = encode(make_sample("e0", 1.0))
        await handler.handle(js_msg("swarm.samples.tiny", data, seq=7), 0, 0.0)
        again = js_msg("swarm.samples.tiny", data, seq=7, delivered=2)
        await handler.handle(again, 0, 0.0)
        assert unacked.msgs == {7: again} and len(buffer) == 1
        assert handler.counts["redelivered"] == 1 and handler.counts["duplicate_samples"] == 0

    asyncio.run(main())
