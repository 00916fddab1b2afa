"""Example swarm client: plays a default task against the swarm's OpenAI endpoint with the `openai` SDK.

    SWARMRL_CONNECT_FILE=runs/latest/connect.json python -m swarmrl.agents.runner --task calculator
    ... --task team_calculator --role caller=caller --role reporter=reporter

Each round picks one task instance and plays it `num_repeat` times at once (one GRPO group);
`concurrency` groups run at once. The task streams are seeded (`--seed`); a restarted client
continues where it stopped (`TaskCursor`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import logging
import os
import random
import signal
from dataclasses import dataclass, field
from typing import Any

from swarmrl.agents.sdk import Episode, SwarmClient
from swarmrl.agents.tasks import TaskSpec, get_task, rewards
from swarmrl.core.config import password_on_command_line
from swarmrl.infra.credentials import AgentCredential
from swarmrl.schemas import DEFAULT_GROUP_SIZE, ClientState
from swarmrl.services.common import loop as aio

log = logging.getLogger("swarmrl.client")


@dataclass
class Outcome:
    task_id: str
    reward: float
    success: bool
    turns: int
    metrics: dict[str, float] = field(default_factory=dict)
    """A multi-role task's per-role metrics (e.g. `caller_valid`)."""


def reply_message(choice_message: Any) -> dict[str, Any]:
    """The assistant message of an `openai` response as a plain OpenAI-format dict."""
    msg: dict[str, Any] = {"role": "assistant", "content": choice_message.content}
    if choice_message.tool_calls:
        msg["tool_calls"] = [tc.model_dump() for tc in choice_message.tool_calls]
    return msg


async def model_reply(
    llm: Any,
    model: str,
    messages: list[Any],
    tools: Any,
    temperature: float,
    max_tokens: int | None,
    seed: int | None,
) -> dict[str, Any]:
    """One model call's assistant message; `seed`: its sampling seed (None: the engine's sampler)."""
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    if seed is not None:
        kwargs["seed"] = seed
    resp = await llm.chat.completions.create(
        model=model, messages=messages, temperature=temperature, max_tokens=max_tokens, **kwargs
    )
    return reply_message(resp.choices[0].message)


class ChaosAbort(RuntimeError):
    """Raised on purpose (`--abort-rate`) to simulate an agent that fails mid-episode."""


async def play(
    ep: Episode,
    spec: TaskSpec,
    instance: Any,
    model: str,
    temperature: float,
    max_tokens: int | None,
    abort_rate: float = 0.0,
    tool_actions: bool = False,
    seed: int | None = None,
) -> Outcome:
    """Play a single-agent task inside an open episode and publish its reward. `tool_actions`: tool
    calls run as sandboxed actions (`ep.act`). `seed`: the n-th model call samples with `seed + n`
    (None: the engine's own sampler)."""
    llm = ep.openai(max_retries=0)
    env = spec.make_env(instance)
    messages = env.reset()
    turns = 0
    tools = getattr(env, "tool_specs", None) or spec.tools  # an env task's tools are its own
    while True:
        call_seed = None if seed is None else seed + turns
        reply = await model_reply(llm, model, messages, tools, temperature, max_tokens, call_seed)
        messages.append(reply)
        if tool_actions and spec.tool_actions is not None:
            step = env.step(reply, tool_results=await run_tools(ep, spec.tool_actions(reply)))
        else:
            step = env.step(reply)
        turns += 1
        messages += step.messages
        if step.done:
            break
        if abort_rate and random.random() < abort_rate:
            raise ChaosAbort(f"simulated agent failure after turn {turns}")
    if hasattr(env, "settle"):  # a reward to await (a dataset task's); a RewardError aborts the episode
        await env.settle()
    await ep.reward(env.reward)
    return Outcome(instance.task_id, env.reward, env.success, turns)


async def run_tools(ep: Episode, payloads: list[dict[str, Any] | None]) -> list[str | None]:
    """Run each tool call's python action in the sandbox: its stdout, or `error: ...`."""

    async def one(payload: dict[str, Any] | None) -> str | None:
        if payload is None:
            return None
        res = await ep.act("python", payload, cpu=1, mem_mb=256, timeout_s=10.0)
        if res.status == "ok" and res.result.get("exit_code") == 0:
            return str(res.result.get("stdout", "")).strip()
        return f"error: {res.error or res.status}"

    return list(await asyncio.gather(*(one(p) for p in payloads)))


async def play_team(
    ep: Episode,
    spec: TaskSpec,
    instance: Any,
    roles: dict[str, str],
    temperature: float,
    max_tokens: int | None,
    abort_rate: float = 0.0,
    seed: int | None = None,
) -> Outcome:
    """Play a multi-role task: each role is an agent with its own model, token and reward. `seed` as
    in `play`."""
    llms = {role: ep.openai(agent=role, max_retries=0) for role in roles}
    env = spec.make_env(instance)
    turns = 0
    while (turn := env.turn()) is not None:
        call_seed = None if seed is None else seed + turns
        llm, model = llms[turn.role], roles[turn.role]
        env.step(await model_reply(llm, model, turn.messages, turn.tools, temperature, max_tokens, call_seed))
        turns += 1
        if abort_rate and not env.done and random.random() < abort_rate:
            raise ChaosAbort(f"simulated agent failure after turn {turns}")
    for role, value in env.rewards.items():
        await ep.reward(value, agent=role)
    team = sum(env.rewards.values()) / max(len(env.rewards), 1)
    return Outcome(instance.task_id, team, env.success, turns, dict(env.metrics))


async def play_episode(
    swarm: SwarmClient,
    spec: TaskSpec,
    instance: Any,
    roles: dict[str, str] | str,
    *,
    eval: bool = False,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    group_key: str = "",
    group_size: int = 0,
    abort_rate: float = 0.0,
    tool_actions: bool = False,
    seed: int | None = None,
) -> Outcome:
    """Run one whole episode (begin ... end) of `instance`; `roles` maps each agent to its model
    (or is the model of a single-agent task)."""
    if isinstance(roles, str):
        roles = roles_of(spec, {}, roles)
    max_tokens = spec.max_tokens if max_tokens is None else max_tokens
    async with swarm.episode(
        instance.task_id,
        models=list(dict.fromkeys(roles.values())),
        agents=list(roles),
        agent_models={role: [model] for role, model in roles.items()},
        task={"name": spec.name},
        eval=eval,
        group_key=group_key,
        group_size=group_size,
        heartbeat_s=5.0,
    ) as ep:
        if spec.roles:
            out = await play_team(ep, spec, instance, roles, temperature, max_tokens, abort_rate, seed)
        else:
            (model,) = roles.values()
            out = await play(
                ep, spec, instance, model, temperature, max_tokens, abort_rate, tool_actions, seed
            )
        await ep.end(reward=out.reward, success=float(out.success), turns=float(out.turns), **out.metrics)
    return out


def roles_of(spec: TaskSpec, roles: dict[str, str], model: str) -> dict[str, str]:
    """The role -> model map a client plays `spec` with: `roles` as given, or `{"agent": model}`."""
    if spec.roles:
        missing = sorted(set(spec.roles) - set(roles))
        if missing:
            raise ValueError(f"task {spec.name} needs a model for roles {missing}: --role ROLE=MODEL")
        return {role: roles[role] for role in spec.roles}
    return {"agent": roles.get("agent", model)}


class TaskCursor:
    """A client's place in its task streams, kept in KV `swarm-clients` under its name, so a restarted
    client (same name and seed) continues them: round r's task is drawn from (seed, r), and each
    task's stream skips what was drawn. The place is saved before a group is played: a group a kill
    cuts short is not played again."""

    def __init__(self, swarm: SwarmClient, seed: int, tasks: list[TaskSpec], state: ClientState) -> None:
        self.swarm, self.seed, self.rounds = swarm, seed, state.rounds
        self.drawn = {spec.name: state.drawn.get(spec.name, 0) for spec in tasks}
        self.specs = {spec.name: spec for spec in tasks}
        self.streams = {
            spec.name: itertools.islice(spec.train_tasks(seed), self.drawn[spec.name], None) for spec in tasks
        }
        self.saved = state.rounds
        self._saving = asyncio.Lock()

    @classmethod
    async def resume(cls, swarm: SwarmClient, seed: int, tasks: list[TaskSpec]) -> TaskCursor:
        try:
            state = await swarm.load_state()
        except Exception as exc:  # e.g. a swarm set up before KV swarm-clients existed
            log.warning("no saved place in the task streams (%r): starting them at seed %d", exc, seed)
            state = None
        if state is not None and state.seed != seed:
            log.info("saved place is for seed %d, not %d: starting the task streams over", state.seed, seed)
            state = None
        if state is not None and state.rounds:
            log.info("continuing the task streams after round %d (drawn: %s)", state.rounds, state.drawn)
        return cls(swarm, seed, tasks, state or ClientState(seed=seed, rounds=0))

    async def next(self, weights: dict[str, float]) -> tuple[TaskSpec, Any, int]:
        """The next round's (task, instance, round number); its place is saved before this returns."""
        self.rounds += 1
        rng = random.Random(f"{self.seed}/{self.rounds}")
        name = rng.choices(list(weights), weights=list(weights.values()))[0]
        instance = next(self.streams[name])
        self.drawn[name] += 1
        round_ = self.rounds
        # One save at a time, each of the newest place: an older save never lands after a newer one.
        async with self._saving:
            if self.saved < round_:
                state = ClientState(seed=self.seed, rounds=self.rounds, drawn=dict(self.drawn))
                try:
                    await self.swarm.save_state(state)
                    self.saved = state.rounds
                except Exception as exc:  # the place is best kept, never worth stopping the client for
                    log.warning("could not save the place in the task streams (round %d): %r", round_, exc)
        return self.specs[name], instance, round_


async def run_client(
    nats_url: AgentCredential | str,
    task: str,
    model: str,
    *,
    num_repeat: int,
    concurrency: int,
    seed: int,
    stop: asyncio.Event,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    abort_rate: float = 0.0,
    roles: dict[str, str] | None = None,
    drain_s: float = 30.0,
    tool_actions: bool = False,
) -> None:
    """Play training groups until `stop` is set, then give the groups in flight `drain_s` to end. A
    failed episode is aborted and the client carries on. `task`: one name or several with weights
    (`calculator=0.7,guess_number=0.3`)."""
    from swarmrl.agents.config import parse_task_weights

    swarm = await SwarmClient.connect(nats_url)
    weights = parse_task_weights(task)
    tasks = [get_task(name) for name in weights]
    role_maps = {spec.name: roles_of(spec, roles or {}, model) for spec in tasks}
    cursor = await TaskCursor.resume(swarm, seed, tasks)
    done = 0
    life = os.urandom(4).hex()  # in the group key: a restarted client's groups never join old ones

    async def group_loop() -> None:
        nonlocal done
        while not stop.is_set():
            spec, instance, round_ = await cursor.next(weights)
            key = f"{instance.task_id}@{swarm.client_id}-{life}-{round_}"
            episode = functools.partial(
                play_episode, swarm, spec, instance, role_maps[spec.name], temperature=temperature,
                max_tokens=max_tokens, group_key=key, group_size=num_repeat, abort_rate=abort_rate,
                tool_actions=tool_actions,
            )  # fmt: skip
            with rewards.group(num_repeat):  # a dataset task's reward: one call for the group
                plays = (rewards.member(episode()) for _ in range(num_repeat))
                results = await asyncio.gather(*plays, return_exceptions=True)
            for r in results:
                if isinstance(r, ChaosAbort):
                    log.info("episode aborted on purpose: %s", r)
                elif isinstance(r, BaseException):
                    log.warning("episode failed (aborted): %r", r)
                    await asyncio.sleep(1.0)  # back off while the swarm is not answering
            done += len(results)

    workers = [asyncio.create_task(group_loop()) for _ in range(concurrency)]
    await stop.wait()
    # Drain: what is left after `drain_s` is cancelled, which aborts its episodes.
    _, left = await asyncio.wait(workers, timeout=drain_s) if workers else (set(), set())
    for w in left:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    log.info("client stopping after %d episodes (%d groups cut short by the drain timeout)", done, len(left))
    await swarm.close()


def _pair(text: str) -> tuple[str, str]:
    role, sep, model = text.partition("=")
    if not sep or not role or not model:
        raise argparse.ArgumentTypeError(f"expected ROLE=MODEL, got {text!r}")
    return role, model


def main(argv: list[str] | None = None) -> int:
    from swarmrl.agents.config import RunConf, TaskConf
    from swarmrl.core.config import default_of

    p = argparse.ArgumentParser(
        prog="python -m swarmrl.agents.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--nats",
        default=os.environ.get("SWARMRL_AGENT_NATS", ""),
        help="NATS URL (default $SWARMRL_AGENT_NATS) for servers without agent identities; else the "
        "connect file $SWARMRL_CONNECT_FILE is read. A password is never taken on the command line",
    )
    p.add_argument(
        "--task",
        default=os.environ.get("SWARMRL_TASK", "calculator"),
        help="task name(s), comma-separated, optionally weighted: calculator=0.7,guess_number=0.3",
    )
    p.add_argument("--model", default="policy", help="model to call in a single-agent task")
    # fmt: off
    p.add_argument("--role", type=_pair, action="append", default=[], metavar="ROLE=MODEL",
                   help="model of each role of a multi-role task (repeatable), e.g. --role caller=alpha")
    # defaults: the declarations `swarmrl up` reads (one default per setting)
    p.add_argument("--num-repeat", type=int, default=DEFAULT_GROUP_SIZE,
                   help="episodes per task instance (GRPO group size, declared on `begin`)")
    p.add_argument("--concurrency", type=int, default=default_of(TaskConf, "concurrency"),
                   help="groups played at once")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="max tokens per reply (default: the task's own, `TaskSpec.max_tokens`)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the task streams; a restarted client with the same name and seed "
                   "continues them (its place is kept in KV swarm-clients)")
    p.add_argument("--abort-rate", type=float, default=default_of(RunConf, "abort_rate"),
                   help="chaos: probability per turn of failing the episode on purpose (it is aborted)")
    p.add_argument("--tool-actions", action="store_true",
                   help="run the task's tools as sandboxed python actions (`ep.act`), not in this process")
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="on SIGTERM: seconds the groups in flight get to finish before they are aborted")
    p.add_argument("--tasks-file", default=os.environ.get("SWARMRL_TASKS_FILE", ""),
                   help="JSON of the swarm's dataset and env tasks (`swarmrl up` passes "
                   "$SWARMRL_TASKS_FILE): their rows, rewards and environments are loaded from it")
    # fmt: on
    args = p.parse_args(argv)
    if reason := password_on_command_line(argv):
        p.error(reason)
    if args.tasks_file:
        from swarmrl.agents.tasks.dataset import read_tasks_file

        try:
            read_tasks_file(args.tasks_file)
        except (OSError, ValueError) as exc:  # DatasetError is a ValueError
            p.error(f"--tasks-file {args.tasks_file}: {exc}")
    where: AgentCredential | str = args.nats
    if not where:
        connect_file = os.environ.get("SWARMRL_CONNECT_FILE")
        if not connect_file:
            p.error("no $SWARMRL_CONNECT_FILE (or --nats URL): say where the swarm is")
        where = AgentCredential.read(connect_file)
    from swarmrl.core.log import setup_logging

    setup_logging("client")

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run_client(
            where, args.task, args.model, num_repeat=args.num_repeat, concurrency=args.concurrency,
            seed=args.seed, stop=stop, temperature=args.temperature, max_tokens=args.max_tokens,
            abort_rate=args.abort_rate, roles=dict(args.role), drain_s=args.drain_s,
            tool_actions=args.tool_actions,
        )  # fmt: skip

    aio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
