"""One episode, two trainable models (alpha, beta), a real nats-server: samples for both or for none.

The merger dies after alpha's sample is confirmed by JetStream and before beta's is published, once
as a killed process (no ack, nak or flush) and once as an error raised out of the publish; a fresh
merger on the same durable consumer then replays the episode. See `services/merger/README.md`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import AbortEvent, EndEvent, Event, Sample, decode_sample
from swarmrl.schemas import subjects as S
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.service import Merger
from tests.conftest import wait_for
from tests.integration.merger_support import (
    lost_episodes,
    merge_stats,
    merger_settled,
    publish,
    read_stream,
    stream_count,
)
from tests.unit.merger.factories import begin, chain, reward

ROOT = Path(__file__).resolve().parents[2]
KILLED = 86
"""Exit status of the merger process killed between the two models' publishes."""
KILL_SCRIPT = """
import asyncio, sys
from tests.integration.test_merger_models import DiesBetweenModels, config
asyncio.run(DiesBetweenModels(config(sys.argv[1]), kill=True).run())
"""


class Crash(Exception):
    """The failure injected between the two models' publishes."""


class DiesBetweenModels(Merger):
    """Dies once alpha's sample is confirmed and before beta's is published: `kill` ends the process
    on the spot (like SIGKILL), else the publish raises `Crash`."""

    def __init__(self, cfg: MergerConfig, kill: bool = False) -> None:
        super().__init__(cfg)
        self.kill = kill
        self.alpha_confirmed = asyncio.Event()

    async def publish(self, subject: str, data: bytes, msg_id: str) -> None:
        if subject == S.samples_subject("beta"):
            await self.alpha_confirmed.wait()
            if self.kill:
                os._exit(KILLED)
            raise Crash(f"injected before publishing {msg_id}")
        await super().publish(subject, data, msg_id)  # returns once JetStream confirmed it
        if subject == S.samples_subject("alpha"):
            self.alpha_confirmed.set()


MERGER = {"episode_timeout_s": 1.5, "ack_wait_s": 2.0}


def config(url: str) -> MergerConfig:
    return MergerConfig(nats=url, **MERGER)


def two_model_episode(episode_id: str, outcome: str = "end") -> list[Event]:
    """Agent a plays alpha for two chained turns, agent b plays beta for two; each its own reward."""
    # The agents take turns; the gateway numbers the calls of the episode 0, 1, 2, 3.
    a = [
        c.model_copy(update={"seq": 2 * c.seq, "call_id": f"chatcmpl-a{c.seq}"})
        for c in chain(2, agent="a", model="alpha", episode_id=episode_id)
    ]
    b = [
        c.model_copy(update={"seq": 2 * c.seq + 1, "call_id": f"chatcmpl-b{c.seq}"})
        for c in chain(2, agent="b", model="beta", episode_id=episode_id, base=1000)
    ]
    last: Event
    if outcome == "end":
        last = EndEvent(episode_id=episode_id, seq=3, client_id="agent-proc")
    else:
        last = AbortEvent(episode_id=episode_id, seq=3, client_id="agent-proc", reason="team gave up")
    return [
        begin(episode_id, agents=["a", "b"], models=["alpha", "beta"], task={"name": "duet"}),
        a[0],
        b[0],
        a[1],
        b[1],
        reward(1.0, agent="a", episode_id=episode_id, seq=1),
        reward(-1.0, agent="b", episode_id=episode_id, seq=2),
        last,
    ]


async def samples_by_model(js: JetStreamContext) -> dict[str, list[Sample]]:
    """Every stored sample, by the model of the subject it was stored under."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for m in await read_stream(js, S.SAMPLES_STREAM):
        if not m.subject.endswith(".lost"):
            out[m.subject.rsplit(".", 1)[-1]].append(decode_sample(m.data))
    return dict(out)


def ids(by_model: dict[str, list[Sample]]) -> dict[str, list[str]]:
    return {model: sorted(s.sample_id for s in samples) for model, samples in by_model.items()}


async def crash_between_models(how: str, url: str, js: JetStreamContext, tmp_path: Path) -> None:
    if how == "kill":
        log = tmp_path / "killed-merger.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", KILL_SCRIPT, url, cwd=ROOT, stderr=err
            )
        try:
            rc = await asyncio.wait_for(proc.wait(), timeout=60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert rc == KILLED, log.read_text()[-3000:]
    else:
        merger = DiesBetweenModels(config(url))
        with pytest.raises(Crash):  # a failed publish ends the merger like a crash, never a drop
            await asyncio.wait_for(merger.run(), timeout=30)
        assert merger.dlq is not None and not merger.dlq.counts
        assert merger.counts["aborted"] == 0


@pytest.mark.parametrize("how", ["kill", "raise"])
async def test_a_merger_dying_between_two_models_publishes_is_healed_by_the_replay(
    how: str,
    js: JetStreamContext,
    swarm_nats: NatsServer,
    start_merger: Callable[..., Merger],
    tmp_path: Path,
) -> None:
    for ev in two_model_episode("duo"):
        await publish(js, ev)
    await crash_between_models(how, swarm_nats.service_url, js, tmp_path)

    # Half-published: alpha's sample is stored, beta's is not, and the episode is still unacked.
    assert ids(await samples_by_model(js)) == {"alpha": ["duo.a.alpha.0"]}
    assert not await merger_settled(js)

    successor = start_merger(**MERGER)
    await wait_for(
        lambda: merger_settled(js), timeout=30, what="the successor replayed and acked the episode"
    )
    by_model = await samples_by_model(js)
    # The successor published both again; the duplicate window dropped alpha's second copy.
    assert successor.counts["samples"] == 2 and successor.counts["merged"] == 1
    assert ids(by_model) == {"alpha": ["duo.a.alpha.0"], "beta": ["duo.b.beta.0"]}
    [alpha], [beta] = by_model["alpha"], by_model["beta"]
    assert (alpha.agent, alpha.reward, alpha.n_calls, alpha.index, alpha.n_samples) == ("a", 1.0, 2, 0, 1)
    assert (beta.agent, beta.reward, beta.n_calls, beta.index, beta.n_samples) == ("b", -1.0, 2, 0, 1)
    assert alpha.task == beta.task == "duet"
    [stats] = await merge_stats(js)  # one MergeStats, though both mergers may have published it
    assert (stats.episode_id, stats.status, stats.timelines_kept, stats.models) == ("duo", "merged", 2,
                                                                                  ["alpha", "beta"])  # fmt: skip
    assert await stream_count(js, S.DLQ_STREAM) == 0


async def test_an_aborted_or_timed_out_two_model_episode_yields_no_sample_for_either_model(
    js: JetStreamContext, start_merger: Callable[..., Merger]
) -> None:
    merger = start_merger(**MERGER)
    for ev in two_model_episode("ended") + two_model_episode("gave-up", outcome="abort"):
        await publish(js, ev)
    for ev in two_model_episode("silent")[:-1]:  # both models called, then the team went silent
        await publish(js, ev)

    await wait_for(lambda: merger.counts["timeout"] == 1, what="the silent episode timed out")
    await wait_for(lambda: merger_settled(js), what="merger acked every event")
    stats = {s.episode_id: (s.status, s.calls, s.timelines_kept, s.models) for s in await merge_stats(js)}
    assert stats == {
        "ended": ("merged", 4, 2, ["alpha", "beta"]),
        "gave-up": ("aborted", 4, 0, ["alpha", "beta"]),
        "silent": ("timeout", 4, 0, ["alpha", "beta"]),
    }
    assert ids(await samples_by_model(js)) == {"alpha": ["ended.a.alpha.0"], "beta": ["ended.b.beta.0"]}
    # each model's trainer is told, on its own samples subject, that the dropped episodes send it nothing
    lost = sorted((r.episode_id, r.model, r.status) for r in await lost_episodes(js))
    assert lost == [
        (e, m, st) for e, st in (("gave-up", "aborted"), ("silent", "timeout")) for m in ("alpha", "beta")
    ]
    assert await stream_count(js, S.DLQ_STREAM) == 0
