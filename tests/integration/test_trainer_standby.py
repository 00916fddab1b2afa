"""Two trainer processes of one model (`[replicas] trainer = 2`) against a real nats-server: one leads
and trains, the other waits with the model loaded; SIGKILL the lead and the standby takes over from
its newest checkpoint and trains the next step, with no step taken twice and no sample trained twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import TrainStep, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.trainer.lead import Lead, LostLead
from tests.conftest import wait_for
from tests.integration.test_trainer import MODEL, group, publish

ROOT = Path(__file__).resolve().parents[2]


def start(server: NatsServer, model_dir: Path, run_dir: Path, replica: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "swarmrl.cli", "serve", "trainer",
        "--model", MODEL, "--model-path", str(model_dir), "--run-dir", str(run_dir), "--replica", replica,
        "--num-repeat", "4", "--batch-groups", "1", "--lr", "1e-3", "--max-tokens-per-micro-batch", "256",
    ]  # fmt: skip
    log = (run_dir / f"{replica}.log").open("wb")
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "SWARMRL_NATS": server.url("trainer")},
    )


@pytest.mark.timeout(300)
async def test_a_standby_trainer_takes_over_within_seconds(
    swarm_nats: NatsServer, tiny_model_dir: Path, tmp_path: Path
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    procs = {r: start(swarm_nats, tiny_model_dir, run_dir, r) for r in ("trainer-0", "trainer-1")}
    nc = await nats.connect(swarm_nats.service_url)
    js = nc.jetstream()
    steps: list[tuple[float, TrainStep]] = []

    async def on_step(msg: nats.aio.msg.Msg) -> None:
        steps.append((time.monotonic(), decode(msg.data, TrainStep)))

    await nc.subscribe(S.train_metrics_subject(MODEL), cb=on_step)
    kv = await js.key_value(S.LEASES_BUCKET)
    try:
        await publish(js, group("g1"))

        def stepped(n: int) -> bool:
            dead = {r: p.returncode for r, p in procs.items() if p.poll() is not None and p.returncode != -9}
            assert not dead, f"trainer exited: {dead}; see {run_dir}/*.log"
            return len(steps) >= n

        await wait_for(lambda: stepped(1), timeout=180, what="the lead's first step")
        lead = (await kv.get(S.lead_key(MODEL))).value.decode()
        standby = next(r for r in procs if r != lead)
        # the standby is ready (model loaded), waiting: it has trained nothing
        await wait_for(
            lambda: b"standing by" in (run_dir / f"{standby}.log").read_bytes(),
            timeout=120,
            what="standby ready",
        )
        killed = time.monotonic()
        procs[lead].send_signal(signal.SIGKILL)
        procs[lead].wait()
        await publish(js, group("g2", version=1))
        await wait_for(lambda: stepped(2), timeout=60, what="the standby's step")
        took = steps[1][0] - killed
        print(f"standby {standby} trained step 2 {took:.1f}s after the lead's SIGKILL")
        assert (await kv.get(S.lead_key(MODEL))).value.decode() == standby
        assert [s.step for _, s in steps] == [1, 2], "a step was taken twice or skipped"
        assert procs[standby].poll() is None
        log = (run_dir / f"{standby}.log").read_text()
        assert f"lead {lead} does not answer: replica {standby} takes over" in log
        assert "starting at step 1 from" in log  # from the dead lead's step-1 checkpoint, restored
        # each group trained once: g1 by the lead (acked), g2 by the standby
        assert [s.samples for _, s in steps] == [4, 4]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        await bus.close(nc)


async def test_renewals_at_once_keep_the_lead_and_a_deposed_lead_knows(swarm_nats: NatsServer):
    """`hold`'s renewal and a step's `confirm` may run together: neither may read the other's write as
    a lost lead (the lead would stop, and a standby take over, with nothing wrong). Once a standby has
    deposed a silent lead, that lead's next confirm says it lost the lead."""
    nc = await nats.connect(swarm_nats.url("trainer"))
    kv = await nc.jetstream().key_value(S.LEASES_BUCKET)
    stop = asyncio.Event()
    lead = Lead(nc, kv, MODEL, "trainer-0")
    assert await lead.acquire(stop)
    await asyncio.gather(*(lead.confirm() for _ in range(20)))
    other = Lead(nc, kv, MODEL, "trainer-1")
    await other.depose()  # what a standby does after GONE_S without an answer
    assert await other.take()
    with pytest.raises(LostLead):
        await lead.confirm()
    await bus.close(nc)
