"""Example swarm client: plays a default task against the swarm's OpenAI endpoint with the `openai` SDK.

    python -m swarmrl.agents.runner --nats nats://agent:PW@host:4222 --task guess_number --concurrency 8

Each round picks one task instance and plays it `num_repeat` times concurrently (one GRPO group);
`concurrency` groups' worth of episodes run at once. Any other framework works the same way: all a
client needs is the SDK's episode (or the plain NATS subjects) and an OpenAI client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
from dataclasses import dataclass
from typing import Any

from swarmrl.agents.sdk import Episode, SwarmClient
from swarmrl.agents.tasks import TaskSpec, get_task

log = logging.getLogger("swarmrl.client")


@dataclass
class Outcome:
    task_id: str
    reward: float
    success: bool
    turns: int


def reply_message(choice_message: Any) -> dict[str, Any]:
    """The assistant message of an `openai` response as a plain OpenAI-format dict."""
    msg: dict[str, Any] = {"role": "assistant", "content": choice_message.content}
    if choice_message.tool_calls:
        msg["tool_calls"] = [tc.model_dump() for tc in choice_message.tool_calls]
    return msg


class ChaosAbort(RuntimeError):
    """Raised on purpose (`--abort-rate`) to simulate an agent that fails mid-episode."""


async def play(
    ep: Episode,
    spec: TaskSpec,
    instance: Any,
    model: str,
    temperature: float,
    max_tokens: int,
    abort_rate: float = 0.0,
) -> Outcome:
    """Play one episode of `instance` inside an open episode; publishes env steps and the reward."""
    llm = ep.openai(max_retries=0)
    env = spec.make_env(instance)
    messages = env.reset()
    turns = 0
    while True:
        kwargs: dict[str, Any] = {"tools": spec.tools} if spec.tools else {}
        resp = await llm.chat.completions.create(
            model=model, messages=messages, temperature=temperature, max_tokens=max_tokens, **kwargs
        )
        reply = reply_message(resp.choices[0].message)
        messages.append(reply)
        step = env.step(reply)
        turns += 1
        messages += step.messages
        if step.done:
            break
        if abort_rate and random.random() < abort_rate:
            raise ChaosAbort(f"simulated agent failure after turn {turns}")
    await ep.reward(env.reward)
    return Outcome(instance.task_id, env.reward, env.success, turns)


async def play_episode(
    swarm: SwarmClient,
    spec: TaskSpec,
    instance: Any,
    model: str,
    *,
    eval: bool = False,
    temperature: float = 1.0,
    max_tokens: int = 64,
    group_key: str = "",
    abort_rate: float = 0.0,
) -> Outcome:
    """Run one whole episode (begin ... end) of `instance` with `model`."""
    async with swarm.episode(
        instance.task_id,
        models=[model],
        task={"name": spec.name},
        eval=eval,
        group_key=group_key,
        heartbeat_s=5.0,
    ) as ep:
        out = await play(ep, spec, instance, model, temperature, max_tokens, abort_rate)
        await ep.end(reward=out.reward, success=float(out.success), turns=float(out.turns))
    return out


async def run_client(
    nats_url: str,
    task: str,
    model: str,
    *,
    num_repeat: int,
    concurrency: int,
    seed: int,
    stop: asyncio.Event,
    temperature: float = 1.0,
    max_tokens: int = 64,
    abort_rate: float = 0.0,
) -> None:
    """Play training groups until `stop` is set. A failed episode is aborted and the client carries on."""
    swarm = await SwarmClient.connect(nats_url)
    tasks = [get_task(name) for name in task.split(",")]
    rng = random.Random(seed)
    streams = {spec.name: spec.train_tasks(seed) for spec in tasks}
    done = rounds = 0

    async def group_loop(worker: int) -> None:
        nonlocal done, rounds
        while not stop.is_set():
            spec = rng.choice(tasks)
            instance = next(streams[spec.name])
            rounds += 1
            # One GRPO group per round: a unique key keeps groups of different clients apart.
            key = f"{instance.task_id}@{swarm.client_id}-{rounds}"
            results = await asyncio.gather(
                *(
                    play_episode(
                        swarm,
                        spec,
                        instance,
                        model,
                        temperature=temperature,
                        max_tokens=max_tokens,
                        group_key=key,
                        abort_rate=abort_rate,
                    )
                    for _ in range(num_repeat)
                ),
                return_exceptions=True,
            )
            for r in results:
                if isinstance(r, ChaosAbort):
                    log.info("episode aborted on purpose: %s", r)
                elif isinstance(r, BaseException):
                    log.warning("episode failed (aborted): %r", r)
                    await asyncio.sleep(1.0)  # back off while the swarm is not answering
            done += len(results)

    workers = [asyncio.create_task(group_loop(i)) for i in range(concurrency)]
    await stop.wait()
    for w in workers:
        w.cancel()
    for w in workers:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await w
    log.info("client stopping after %d episodes", done)
    await swarm.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m swarmrl.agents.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nats", required=True, help="NATS URL with agent credentials")
    p.add_argument(
        "--task", default="guess_number", help="task name(s), comma-separated: guess_number, calculator"
    )
    p.add_argument("--model", default="policy", help="trainable model name to call")
    p.add_argument("--num-repeat", type=int, default=8, help="episodes per task instance (GRPO group size)")
    p.add_argument("--concurrency", type=int, default=2, help="groups played at once")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-tokens", type=int, default=64, help="max tokens per reply")
    p.add_argument("--seed", type=int, default=0, help="seed of the task stream")
    p.add_argument(
        "--abort-rate",
        type=float,
        default=0.0,
        help="chaos: probability per turn of failing the episode on purpose (it is aborted)",
    )
    args = p.parse_args(argv)
    from swarmrl.log import setup_logging

    setup_logging("client")

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await run_client(
            args.nats,
            args.task,
            args.model,
            num_repeat=args.num_repeat,
            concurrency=args.concurrency,
            seed=args.seed,
            stop=stop,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            abort_rate=args.abort_rate,
        )

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
