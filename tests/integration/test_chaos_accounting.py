"""The chaos benchmark's stream reads (`tests/support/streams.py`) against a real nats-server: a
read of a stream comes back whole, and the episodes whose events no merger took are found where they
wait, in their partition of EPISODE_PARTS."""

from __future__ import annotations

from nats.js import JetStreamContext

from swarmrl.schemas import subjects as S
from tests.conftest import wait_for
from tests.support.streams import queued_events, read_stream


async def test_read_stream_is_whole_and_queued_events_name_their_episodes(js: JetStreamContext) -> None:
    episodes = [f"client-{k % 3}_{k:04d}" for k in range(40)]
    for eid in episodes:
        for kind in ("begin", "end"):
            await js.publish(S.episode_subject(eid, kind), eid.encode())

    msgs = await read_stream(js, S.EPISODES_STREAM, batch=7)
    assert [m.seq for m in msgs] == list(range(1, 81))
    assert [m.data.decode() for m in msgs[::2]] == episodes

    async def sourced() -> bool:  # EPISODE_PARTS sources EPISODES asynchronously
        return (await js.stream_info(S.EPISODE_PARTS_STREAM)).state.messages == 80

    await wait_for(sourced, what="EPISODE_PARTS to source every event")
    queued = await queued_events(js)
    assert set(queued) == set(episodes)
    assert all(n == 2 and 0 <= p < S.EPISODE_PARTITIONS for p, n in queued.values())
    # JetStream spreads the episodes over its partitions (a hash of owner and episode id)
    assert len({p for p, _ in queued.values()}) > 1
