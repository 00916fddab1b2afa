"""The JavaScript example agent (`agents/examples/js`, written from `schemas/README.md` alone) against a
real swarm: nats-server, embedded engine + gateway, and merger. Its events must pass the contract (no
dead letters), its calls must be captured token-exact by the gateway, and its groups must come out
of the merger as samples of `policy` carrying the agent's own code version."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js import JetStreamContext

from swarmrl.agents.tasks.calculator import TOOLS, Calculator, CalculatorEnv, eval_tasks, train_tasks
from swarmrl.infra.credentials import AgentCredential
from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import (
    AbortEvent,
    BeginEvent,
    EndEvent,
    GroupOutcome,
    LlmEvent,
    RewardEvent,
    decode_event,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.merger.service import Merger
from tests.conftest import wait_for
from tests.integration.merger_support import read_stream, samples, stream_count
from tests.support.localstack import generation_stack

JS_DIR = Path(__file__).resolve().parents[2] / "agents" / "examples" / "js"


def _missing() -> str:
    node = shutil.which("node")
    if node is None:
        return "node not found on PATH (the JS example agent needs Node.js >= 20.3)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if tuple(int(x) for x in version.lstrip("v").split(".")[:2]) < (20, 3):
        return f"node {version} is too old: the JS example agent needs Node.js >= 20.3"
    if not (JS_DIR / "node_modules").is_dir():
        return "agents/examples/js/node_modules missing: run `npm ci --prefix agents/examples/js`"
    return ""


pytestmark = pytest.mark.skipif(bool(_missing()), reason=_missing())


def agent_env(**extra: str) -> dict[str, str]:
    """The test's environment without any SWARMRL_* setting of the developer's shell, plus `extra`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SWARMRL_")} | extra


@pytest.fixture
async def start_agent() -> AsyncIterator[Callable[..., Awaitable[asyncio.subprocess.Process]]]:
    """Start `node agent.mjs --max-tokens 8 FLAGS...`; an agent still running at teardown is killed."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(env: dict[str, str], *flags: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            "node",
            str(JS_DIR / "agent.mjs"),
            "--max-tokens",
            "8",
            *flags,
            cwd=JS_DIR,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def merger(start_merger: Callable[..., Merger]) -> Merger:
    return start_merger(episode_timeout_s=30.0, ack_wait_s=4.0)


async def episode_events(js: JetStreamContext) -> dict[str, list]:
    """Every event in EPISODES, decoded, grouped by kind."""
    out: dict[str, list] = defaultdict(list)
    for m in await read_stream(js, S.EPISODES_STREAM):
        ev = decode_event(m.data)
        out[ev.kind].append(ev)
    return out


def test_js_calculator_is_the_python_task() -> None:
    """Same held-out set, same seeded question stream, same tool answers and rewards."""
    replies = [
        {"role": "assistant", "content": "The answer is 1,044."},
        {"role": "assistant", "content": "44"},
        {"role": "assistant", "content": None},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "7 * 4 + 8"}'}},
                {"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 * (3 - 9)"}'}},
                {"id": "c3", "type": "function", "function": {"name": "calculator", "arguments": "not json"}},
                {"type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
    ]  # fmt: skip
    script = """
import * as c from "./calculator.mjs";
const replies = JSON.parse(process.argv[1]);
const g = c.trainTasks(1000);
const steps = replies.map((r) => { const e = new c.CalculatorEnv("4 * 9 + 8"); const s = e.step(r); return [s.messages, s.done, e.reward]; });
process.stdout.write(JSON.stringify({ eval: c.evalTasks(), train: Array.from({ length: 50 }, () => g.next().value), steps }));
"""
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, json.dumps(replies)],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    got = json.loads(done.stdout)
    assert got["eval"] == [t.expression for t in eval_tasks()]
    stream = train_tasks(1000)
    assert got["train"] == [next(stream).expression for _ in range(50)]
    for reply, (messages, is_done, reward) in zip(replies, got["steps"], strict=True):
        env = CalculatorEnv(Calculator("4 * 9 + 8"))
        env.reset()
        step = env.step(reply)
        assert (is_done, reward) == (step.done, env.reward)
        want = [m["content"] for m in step.messages]
        have = [m["content"] for m in messages]
        # Error texts differ between the two evaluators; results and which calls fail must not.
        assert [h if not h.startswith("error") else "error" for h in have] == [
            w if not w.startswith("error") else "error" for w in want
        ]
        assert [m["tool_call_id"] for m in messages] == [m["tool_call_id"] for m in step.messages]


async def test_js_agent_groups_become_merged_samples(
    swarm_nats: NatsServer,
    tiny_model_dir: Path,
    js: JetStreamContext,
    merger: Merger,
    start_agent: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # A gateway that mixes tasks (as `swarmrl up` with several tasks runs it) refuses a token request
    # without the task's name: the agent must send it.
    monkeypatch.setenv("SWARMRL_TASK_WEIGHT", "calculator=0.7,guess_number=0.3")
    cred = swarm_nats.mint_agent("js-calc")
    env = agent_env(SWARMRL_CONNECT_FILE=str(cred.write(tmp_path / "js-calc.json")))
    async with generation_stack(swarm_nats, tiny_model_dir):
        proc = await start_agent(env, "--episodes", "4", "--num-repeat", "2", "--concurrency", "2")
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()[-3000:]
        events = await episode_events(js)

    begins: list[BeginEvent] = events["begin"]
    ends: list[EndEvent] = events["end"]
    assert len(begins) == 4 and not events["abort"], err.decode()[-3000:]
    ids = {b.episode_id for b in begins}
    assert all(i.startswith("js-calc_") for i in ids)  # its own identity owns its episodes
    assert {e.episode_id for e in ends} == ids
    [version] = {e.client_version for kind in ("begin", "reward", "end") for e in events[kind]}
    assert version.startswith("js-")
    groups = defaultdict(list)
    for b in begins:
        assert (b.seq, b.models, b.agents, b.eval, b.task) == (
            0,
            ["policy"],
            ["agent"],
            False,
            {"name": "calculator"},
        )
        assert b.task_id.startswith("calculator/") and b.group_key.startswith(b.task_id + "@")
        groups[b.group_key].append(b)
    assert sorted(len(g) for g in groups.values()) == [2, 2]  # two GRPO groups of two
    rewards: dict[str, float] = {}
    for r in events["reward"]:
        assert isinstance(r, RewardEvent) and r.value in (0.0, 1.0)
        rewards[r.episode_id] = r.value
    assert {e.episode_id: e.metrics["reward"] for e in ends} == rewards

    begin_of = {b.episode_id: b for b in begins}
    calls: dict[str, list[LlmEvent]] = defaultdict(list)
    for ev in events["llm"]:
        calls[ev.episode_id].append(ev)
    assert set(calls) == ids
    for ev in events["llm"]:
        assert (ev.agent, ev.model, ev.client_version) == ("agent", "policy", version)
        assert ev.prompt_ids and ev.output_ids and len(ev.output_logprobs) == len(ev.output_ids)
        # The prompts the model was warm-started on: the Python task's, word for word.
        expression = " ".join(begin_of[ev.episode_id].task_id.removeprefix("calculator/"))
        assert ev.messages[:2] == CalculatorEnv(Calculator(expression)).reset() and ev.tools == TOOLS
    for e in ends:
        assert e.metrics["turns"] == len(calls[e.episode_id])

    await wait_for(
        lambda: _sampled(js, ids),
        timeout=20,
        what="merged samples of every JS episode on swarm.samples.policy",
    )
    for s in await samples(js):
        assert (s.model, s.client_version, s.client_id) == (
            "policy",
            version,
            begin_of[s.episode_id].client_id,
        )
        assert (s.task_id, s.group_key) == (
            begin_of[s.episode_id].task_id,
            begin_of[s.episode_id].group_key,
        )
        assert s.reward == rewards[s.episode_id] and sum(s.loss_mask) > 0
    assert all(m.subject == S.samples_subject("policy") for m in await read_stream(js, S.SAMPLES_STREAM))
    assert await stream_count(js, S.DLQ_STREAM) == 0


async def _sampled(js: JetStreamContext, ids: set[str]) -> bool:
    return {s.episode_id for s in await samples(js)} == ids


async def test_js_agent_drains_or_aborts_on_sigterm(
    swarm_nats: NatsServer,
    tiny_model_dir: Path,
    js: JetStreamContext,
    merger: Merger,
    start_agent: Any,
    tmp_path: Path,
) -> None:
    """Connection from a connect file. On SIGTERM the groups in flight finish (default drain) or are
    aborted (`--drain-s 0`); either way every begun episode is closed and the agent exits 0."""
    cred = swarm_nats.mint_agent("js-drainer")
    connect_file = AgentCredential(cred.name, cred.seed, cred.servers, {"models": ["policy"]}).write(
        tmp_path / "connect.json"
    )
    env = agent_env(SWARMRL_CONNECT_FILE=str(connect_file), SWARMRL_CODE_VERSION="js-test-7")

    async def run_until_sigterm(client_id: str, drain: str) -> dict[str, list]:
        """Start an agent, SIGTERM it after two ended episodes; its begin, end and abort events."""
        proc = await start_agent(
            env, "--num-repeat", "2", "--concurrency", "2", "--client-id", client_id, "--drain-s", drain
        )

        async def two_ended() -> bool:
            assert proc.returncode is None, "the agent exited before SIGTERM"
            ends = (await episode_events(js))["end"]
            return sum(e.client_id == client_id for e in ends) >= 2

        await wait_for(two_ended, timeout=30, interval=0.2, what=f"{client_id} to finish two episodes")
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
        assert proc.returncode == 0, err.decode()[-3000:]
        events = await episode_events(js)
        return {
            kind: [e for e in events[kind] if e.client_id == client_id] for kind in ("begin", "end", "abort")
        }

    closed: dict[str, dict[str, list]] = {}
    async with generation_stack(swarm_nats, tiny_model_dir):
        # The engine batches the agent's four episodes, so they call the model in lockstep; a SIGTERM
        # that lands in the few milliseconds while all four publish their rewards and ends (or the next
        # begins) finds nothing to abort. A fresh agent then tries again: an agent that never aborts on
        # `--drain-s 0` fails all five.
        for attempt in range(5):
            closed[f"js-abort-{attempt}"] = await run_until_sigterm(f"js-abort-{attempt}", "0")
            if closed[f"js-abort-{attempt}"]["abort"]:
                break
        aborted = closed[f"js-abort-{attempt}"]["abort"]
        closed["js-drain"] = await run_until_sigterm("js-drain", "30")

    for client_id, events in closed.items():
        begun = sorted(b.episode_id for b in events["begin"])
        assert sorted(e.episode_id for e in [*events["end"], *events["abort"]]) == begun, client_id
        assert {e.client_version for e in events["begin"]} == {"js-test-7"}
    # The test's model answers at once: a 30 s drain ends every group, no drain aborts what is in flight.
    assert closed["js-drain"]["abort"] == [] and aborted
    for ab in aborted:
        assert isinstance(ab, AbortEvent) and "SIGTERM" in ab.reason
    assert await stream_count(js, S.DLQ_STREAM) == 0


async def test_the_js_client_hears_what_became_of_its_group_and_only_its_own(
    swarm_nats: NatsServer, tmp_path: Path
) -> None:
    """`SwarmClient.outcome` of `swarm.mjs`: the trainer's `GroupOutcome` for the client's own
    identity reaches it; another identity's is never delivered to it."""
    cred = swarm_nats.mint_agent("js-out")
    script = """
import { readFileSync } from "node:fs";
import { SwarmClient } from "./swarm.mjs";
const f = JSON.parse(readFileSync(process.env.SWARMRL_CONNECT_FILE, "utf8"));
const swarm = await SwarmClient.connect({ servers: f.nats_url.split(","), name: f.name, seed: f.seed,
  inboxPrefix: f.inbox_prefix, clientId: "js", clientVersion: "t" });
process.stdout.write("ready\\n");
const out = await swarm.outcome("g-1", { timeoutMs: 20000 });
const other = await swarm.outcome("g-other", { timeoutMs: 1500 }).catch((e) => e.message);
process.stdout.write(JSON.stringify({ out, other }) + "\\n");
await swarm.close();
"""
    env = agent_env(SWARMRL_CONNECT_FILE=str(cred.write(tmp_path / "js-out.json")))
    proc = await asyncio.create_subprocess_exec(
        "node", "--input-type=module", "-e", script, cwd=JS_DIR, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), timeout=30) == b"ready\n"
    nc = await nats.connect(swarm_nats.service_url)
    try:
        for owner, key in (("agent", "g-other"), ("js-out", "g-1")):  # as a trainer publishes them
            outcome = GroupOutcome(
                model="policy", owner=owner, group_key=key, outcome="dropped", reason="zero_adv", step=3
            )
            await nc.jetstream().publish(S.outcome_subject(owner, "policy"), encode(outcome))
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
    finally:
        await nc.close()
        await proc.wait()
    got = json.loads(line)
    assert (got["out"]["outcome"], got["out"]["reason"], got["out"]["step"]) == ("dropped", "zero_adv", 3)
    assert got["other"] == "no outcome of group g-other within 1.5s"
