"""The actions service on a real nats-server with real sandboxes: agents' `ep.act` calls, bad input
answered and dead-lettered, retries answered once, records for the ledger, remote workers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import msgpack
import nats
import pytest

from swarmrl.agents.sdk import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import ActionRequest, ActionResult, decode, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.actions.config import ActionsConfig, WorkerConfig
from swarmrl.services.actions.service import ActionsService
from swarmrl.services.actions.workers import WorkerLoop
from swarmrl.services.common import bus
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def start_actions(
    swarm_nats: NatsServer,
) -> AsyncIterator[Callable[..., asyncio.Future[ActionsService]]]:
    """Start an actions service in this process (`start(**config overrides)`); all stop at the end."""
    running: list[tuple[ActionsService, asyncio.Task[None], nats.NATS]] = []

    async def start(**overrides: object) -> ActionsService:
        fields = {"nats": swarm_nats.service_url, "cpu_ceiling": 2, "wall_s": 5.0, "cpu_s": 2.0} | overrides
        cfg = ActionsConfig(**fields)  # type: ignore[arg-type]
        nc = await bus.connect(cfg.nats, "actions-test")
        service = ActionsService(cfg, nc, nc.jetstream())
        running.append((service, asyncio.create_task(service.run()), nc))
        await nc.flush()
        await asyncio.sleep(0.2)  # its subscriptions are made at the start of run()
        return service

    yield start  # type: ignore[misc]
    for service, task, nc in running:
        service.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        await nc.close()


async def dead_letters(swarm_nats: NatsServer) -> list[nats.aio.msg.Msg]:
    nc = await bus.connect(swarm_nats.service_url, "test")
    sub = await nc.jetstream().pull_subscribe(S.dlq_subject("actions"), stream=S.DLQ_STREAM)
    try:
        return await sub.fetch(20, timeout=2)
    except nats.errors.TimeoutError:
        return []
    finally:
        await nc.close()


async def records(swarm_nats: NatsServer) -> list[ActionResult]:
    nc = await bus.connect(swarm_nats.service_url, "test")
    sub = await nc.jetstream().pull_subscribe(S.ACTION_METRICS_SUBJECT, stream=S.METRICS_STREAM)
    try:
        return [decode(m.data, ActionResult) for m in await sub.fetch(100, timeout=2)]
    except nats.errors.TimeoutError:
        return []
    finally:
        await nc.close()


@pytest.mark.parametrize("policy", ["elastic", "fifo", "static"])
async def test_an_agent_runs_python_in_the_sandbox_under_every_policy(
    start_actions, swarm: SwarmClient, swarm_nats: NatsServer, policy: str
) -> None:
    await start_actions(policy=policy)
    ep = swarm.episode("t")
    results = await asyncio.gather(*(ep.act("python", {"code": f"print({i} * 7)"}) for i in range(6)))
    assert [r.status for r in results] == ["ok"] * 6, results
    assert [r.result["stdout"].strip() for r in results] == [str(i * 7) for i in range(6)]
    assert all(r.result["exit_code"] == 0 and r.act_s >= r.run_s > 0 and r.policy == policy for r in results)
    failed = await ep.act(
        "python", {"code": "import sys\nsys.stdin.read()\nraise ValueError('boom')", "stdin": "x"}
    )
    assert (
        failed.status == "ok"
        and failed.result["exit_code"] != 0
        and "ValueError: boom" in failed.result["stderr"]
    )
    await ep.end()
    recs = await wait_for_records(swarm_nats, 7)
    assert {(r.episode_id, r.action_id) for r in recs} == {(ep.episode_id, f"a{i}") for i in range(1, 8)}
    assert all(r.owner == "agent" and r.units >= 1 for r in recs)


SUITE_CODE = "import time\nt0 = time.monotonic()\ntime.sleep(0.3)\n"
"""Each case prints when it ran (the system-wide monotonic clock, the same in every sandbox)."""


@pytest.mark.parametrize("policy", ["elastic", "fifo"])
async def test_a_test_suite_runs_each_case_in_its_own_sandbox(
    start_actions, swarm: SwarmClient, policy: str
) -> None:
    await start_actions(policy=policy, cpu_floor=2, cpu_ceiling=2)
    ep = swarm.episode("t")
    cases = [f"print(t0, time.monotonic())\nassert {i} != 2, 'case two fails'" for i in range(4)]
    res = await ep.act("python", {"code": SUITE_CODE, "cases": cases})
    assert res.status == "ok" and res.result["passed"] == 3, res
    got = res.result["cases"]
    assert [c["exit_code"] == 0 for c in got] == [True, True, False, True]
    assert "case two fails" in got[2]["stderr"] and res.run_s == pytest.approx(sum(c["run_s"] for c in got))
    spans = sorted(tuple(map(float, c["stdout"].split())) for c in got)
    overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    # fifo holds the suite's one unit and runs its cases one after another; elastic spreads them
    # over the idle unit too.
    assert overlap is (policy == "elastic"), spans
    bad = await ep.act("python", {"code": "", "cases": ["print(1)", 7]})
    assert bad.status == "rejected" and "'cases' must be a list of 1 to 256 code strings" in bad.error


async def test_a_suite_of_an_ended_episode_runs_no_more_cases(start_actions, swarm: SwarmClient) -> None:
    await start_actions(policy="fifo", cpu_floor=1, cpu_ceiling=1)
    ep = swarm.episode("t")
    task = asyncio.create_task(ep.act("python", {"code": SUITE_CODE, "cases": ["print(1)"] * 4}))
    await asyncio.sleep(0.15)  # its first case is released (it sleeps 0.3 s)
    end = ActionRequest(op="end", action_id="end", episode_id=ep.episode_id)
    await swarm.nc.publish(S.act_subject("agent"), encode(end))
    res = await task
    assert [c["status"] for c in res.result["cases"]] == ["ok", "error", "error", "error"], res
    assert res.status == "error" and "3 of 4 cases: the episode ended before it ran" in res.error


async def wait_for_records(swarm_nats: NatsServer, n: int) -> list[ActionResult]:
    got: list[ActionResult] = []

    async def enough() -> bool:
        got[:] = await records(swarm_nats)
        return len(got) >= n

    await wait_for(enough, timeout=20, what=f"{n} action records")
    return got


async def test_runaway_code_is_contained_and_the_service_keeps_going(
    start_actions, swarm: SwarmClient
) -> None:
    service = await start_actions(policy="elastic", cpu_ceiling=2)
    ep = swarm.episode("t")
    spin, sleep = await asyncio.gather(
        ep.act("python", {"code": "while True: pass"}),
        ep.act("python", {"code": "import time\ntime.sleep(60)"}, timeout_s=1.0),
    )
    assert spin.status == "killed" and spin.run_s < 5.0, spin  # CPU limit 2 s, well before the wall
    assert sleep.status == "timeout", sleep
    after = await ep.act("python", {"code": "print('still here')"})
    assert after.status == "ok" and after.result["stdout"].strip() == "still here"
    assert service.counts.by_status["killed"] == 1 and service.counts.by_status["timeout"] == 1


async def test_bad_requests_are_rejected_and_dead_lettered_with_their_bytes(
    start_actions, swarm: SwarmClient, swarm_nats: NatsServer
) -> None:
    service = await start_actions(max_payload_bytes=4096)
    ep = swarm.episode("t")
    unknown = await ep.act("shell", {"cmd": "ls"})
    assert unknown.status == "rejected" and unknown.error.startswith("unknown_kind"), unknown
    too_big = await ep.act("python", {"code": "#" * 5000})
    assert too_big.status == "rejected" and too_big.error.startswith("oversized"), too_big
    greedy = await ep.act("python", {"code": "print(1)"}, cpu=3)  # the pool's ceiling is 2
    assert (
        greedy.status == "rejected" and greedy.error.startswith("demand") and "ceiling of 2" in greedy.error
    )

    nc = swarm.nc
    subject = S.act_subject("agent")
    garbage = b"\xc1 not msgpack"
    reply = decode((await nc.request(subject, garbage, timeout=5)).data, ActionResult)
    assert reply.status == "rejected" and reply.error.startswith("malformed")
    theirs = ActionRequest(action_id="a1", episode_id="someone-else_x", payload={"code": "print(1)"})
    reply = decode((await nc.request(subject, encode(theirs), timeout=5)).data, ActionResult)
    assert reply.status == "rejected" and reply.error.startswith("not_owner")

    dlq = await dead_letters(swarm_nats)
    codes = sorted(m.headers[bus.REASON_HEADER].split(":")[0] for m in dlq)
    assert codes == ["demand", "malformed", "not_owner", "oversized", "unknown_kind"], codes
    assert any(m.data == garbage for m in dlq)  # the original bytes, for a post-mortem
    assert sum(service.counts.rejected.values()) == 5
    ok = await ep.act("python", {"code": "print(2)"})
    assert ok.status == "ok"


async def test_a_retried_request_is_answered_with_the_first_run(start_actions, swarm: SwarmClient) -> None:
    await start_actions()
    request = ActionRequest(
        action_id="once", episode_id="agent_r", payload={"code": "import os\nprint(os.urandom(8).hex())"}
    )
    first, second = await asyncio.gather(
        *(swarm.nc.request(S.act_subject("agent"), encode(request), timeout=20) for _ in range(2))
    )
    third = await swarm.nc.request(S.act_subject("agent"), encode(request), timeout=20)
    outs = [decode(m.data, ActionResult).result["stdout"] for m in (first, second, third)]
    assert outs[0] == outs[1] == outs[2] and len(outs[0].strip()) == 16


async def test_a_remote_worker_runs_actions_for_a_service_without_local_units(
    start_actions, swarm: SwarmClient, swarm_nats: NatsServer
) -> None:
    service = await start_actions(local_workers=False)
    nc = await bus.connect(swarm_nats.service_url, "worker")
    limits = WorkerConfig(nats=swarm_nats.service_url)
    worker = WorkerLoop(nc.jetstream(), nc, "python", limits, 2, "far-1")
    await worker.start()
    beat = {"name": "far-1", "kind": "python", "units": 2, "period_s": 1.0}
    await nc.publish(S.ACTION_WORKERS_SUBJECT, msgpack.packb(beat))
    await wait_for(lambda: "far-1" in service.remotes, what="the worker's heartbeat")
    ep = swarm.episode("t")
    res = await ep.act("python", {"code": "print('far away')"})
    assert res.status == "ok" and res.result["stdout"].strip() == "far away"
    assert worker.counts["ok"] == 1 and not service.workers
    await worker.close()
    await nc.close()


async def test_an_action_lost_with_its_service_is_asked_again_of_the_next(
    start_actions, swarm: SwarmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service dies with the request in flight (only it knew of it): the SDK repeats the request
    with the same action id and the restarted service runs it."""
    from swarmrl.agents import episode

    monkeypatch.setattr(episode, "ACT_ASK_S", 1.0)
    first = await start_actions()
    ep = swarm.episode("t")
    call = asyncio.create_task(ep.act("python", {"code": "import time\ntime.sleep(3)\nprint('late')"}))
    await wait_for(lambda: first.pending, what="the action to arrive")
    first.request_stop()  # leaves what it holds unanswered, like a crash
    await start_actions()
    res = await asyncio.wait_for(call, 30)
    assert res.action_id == "a1" and res.status == "ok" and res.result["stdout"] == "late\n", res


async def test_an_env_tasks_sandboxed_tool_runs_in_the_actions_sandbox(
    start_actions, swarm: SwarmClient, tmp_path
) -> None:
    """`sandbox = true`: the runner's route for an environment's tool calls, through the real service."""
    import json

    from swarmrl.agents.config import TaskConf
    from swarmrl.agents.runner import run_tools
    from swarmrl.agents.tasks.environment import env_task
    from tests.unit.agents.test_environment import SANDBOXED

    (tmp_path / "adder.py").write_text(SANDBOXED)
    spec = env_task("adder", TaskConf(env="adder.py:Adder", sandbox=True).resolve_paths(tmp_path))
    assert spec.tool_actions is not None
    await start_actions()
    ep = swarm.episode("t")
    calls = [{"a": 20, "b": 22}, {"a": 1}]
    reply = {"tool_calls": [{"function": {"name": "add", "arguments": json.dumps(a)}} for a in calls]}
    assert await run_tools(ep, spec.tool_actions(reply)) == [
        "42",
        "error: TypeError: add() missing 1 required positional argument: 'b'",
    ]
    await ep.end()
