"""The tracker against a real nats-server: metric records published to JetStream come out of each
tracker's files, read back with the tracker's own reader (`tests/unit/tracker/readers.py`); a
restarted exporter goes on in the same run, at the steps its counts had reached."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import ActionResult, EvalResult, MergeStats, SampleDrops, encode
from swarmrl.schemas import subjects as S
from swarmrl.schemas.events import Record
from swarmrl.services.tracker.config import TRACKERS, TrackerConfig
from swarmrl.services.tracker.service import Tracker
from tests.conftest import wait_for
from tests.unit.ledger.factories import train_step
from tests.unit.tracker.readers import Points, mlflow_points, tensorboard_points, wandb_points


async def publish(js: JetStreamContext, subject: str, record: Record | bytes, msg_id: str) -> int:
    data = record if isinstance(record, bytes) else encode(record)
    return (await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})).seq


async def export(cfg: TrackerConfig, last_seq: int) -> None:
    """Run the exporter until it has written everything up to `last_seq`, then stop it."""
    tracker = Tracker(cfg)
    await tracker.start()
    try:
        await wait_for(lambda: tracker.state.seq >= last_seq, timeout=30, what=f"export up to seq {last_seq}")
    finally:
        await tracker.stop()


def read(tracker: str, track_dir: Path) -> tuple[list[str], Points]:
    """(the tracker's run ids, its points)."""
    if tracker == "tensorboard":
        return [], tensorboard_points(track_dir / "tensorboard")
    if tracker == "wandb":
        return wandb_points(track_dir)
    return mlflow_points(track_dir / "mlflow.db")


@pytest.mark.parametrize("tracker", list(TRACKERS))
async def test_every_metric_reaches_the_tracker_and_a_restart_goes_on(
    tracker: str, swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    for module in TRACKERS[tracker]:
        pytest.importorskip(module, reason=f"--track {tracker} needs {module}: pip install 'swarmrl[track]'")
    cfg = TrackerConfig(nats=swarm_nats.service_url, run_dir=tmp_path / "run", track=[tracker],
                        poll_interval_s=0.05, stop_drain_s=0.5)  # fmt: skip
    t0 = 1.7e9
    drops = SampleDrops(model="policy", step=1, dropped={"s1": "stale"}, ts=t0 + 1)
    result = EvalResult(model="policy", step=2, task="calculator", success_rate=0.75, n=8, ts=t0 + 3)
    await publish(js, S.train_metrics_subject("policy"), train_step(step=1, loss=0.5, ts=t0), "t1")
    await publish(js, S.drops_metrics_subject("policy"), drops, "d1")
    await publish(js, S.train_metrics_subject("policy"), b"\xc1 not msgpack", "bad")
    await publish(js, S.train_metrics_subject("policy"), train_step(step=2, loss=0.25, ts=t0 + 2), "t2")
    await publish(js, S.eval_metrics_subject("policy"), result, "e2")
    for i, status in enumerate(["merged", "aborted", "merged"]):
        stats = MergeStats(
            episode_id=f"ep{i}", status=status, tokens_before=8 * (i + 1), tokens_after=4, ts=t0 + 4 + i
        )
        await publish(js, S.MERGE_METRICS_SUBJECT, stats, f"m{i}")
    action = ActionResult(action_id="a1", episode_id="ep0", kind="python", status="ok", act_s=0.5, ts=t0 + 7)
    last = await publish(js, S.ACTION_METRICS_SUBJECT, action, "a1")
    await export(cfg, last)

    dead = await js.get_last_msg(S.DLQ_STREAM, S.dlq_subject("tracker"))
    assert dead.data == b"\xc1 not msgpack" and (dead.headers or {})["Swarm-Reason"].startswith("malformed")

    # a restart: the counts go on, into the same run
    stats = MergeStats(episode_id="ep3", status="merged", tokens_before=32, tokens_after=4, ts=t0 + 8)
    await publish(js, S.MERGE_METRICS_SUBJECT, stats, "m3")
    action = ActionResult(
        action_id="a2", episode_id="ep3", kind="python", status="error", act_s=1.5, ts=t0 + 9
    )
    last = await publish(js, S.ACTION_METRICS_SUBJECT, action, "a2")
    await export(cfg, last)

    run_ids, points = read(tracker, cfg.track_dir())
    if tracker != "tensorboard":
        assert len(set(run_ids)) == 1, f"a restart logs into the same {tracker} run: {run_ids}"
    assert points["train/policy/loss"] == [(1, 0.5), (2, 0.25)]
    assert points["train/policy/dropped/stale"] == [(1, 1.0)]
    assert points["eval/policy/calculator/success"] == [(2, 0.75)]
    assert points["eval/policy/calculator/success_n"] == [(2, 8.0)]
    assert points["merge/tokens_before"] == [(1, 8.0), (2, 16.0), (3, 24.0), (4, 32.0)]
    assert points["merge/merged"] == [(1, 1.0), (3, 2.0), (4, 3.0)]
    assert points["action/python/act_s"] == [(1, 0.5), (2, 1.5)]
    assert points["action/python/error"] == [(2, 1.0)]
