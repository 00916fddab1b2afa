"""Timeline merging benchmark: samples, tokens and trainer step time per episode, merging on vs off.

Episodes are played through the real stack (SDK → gateway → embedded engine, events on JetStream),
so prompts are built exactly as in a run. The same recorded episodes are then assembled by the
merger's code with merging on and off, and the trainer's `Learner` takes one step on each sample
set, interleaved, side by side in one run.

    python bench/merging.py [--episodes 8] [--out bench/results]

Workloads: guess_number with 8 and with 16 turns (one agent), and a 2-agent team (a guesser and an
advisor, each with its own growing context, 6 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import RESULTS, machine, write_json

from swarmrl.agents import SwarmClient
from swarmrl.agents.runner import play, reply_message
from swarmrl.agents.tasks.guess_number import SPEC, GuessNumber, GuessNumberEnv
from swarmrl.infra.nats_server import NatsServer
from swarmrl.machine import describe
from swarmrl.schemas import BeginEvent, LlmEvent, RewardEvent, decode_event
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.merger.assembler import assemble
from swarmrl.services.merger.timelines import MergeOptions
from tests.support.localstack import generation_stack

MODEL = "policy"


async def single_agent(swarm: SwarmClient, turns: int, secret: int, max_tokens: int) -> str:
    task = GuessNumber(secret=secret, n=2**turns * 4, max_turns=turns)  # too wide to finish early by chance
    async with swarm.episode(task.task_id, models=[MODEL], heartbeat_s=0) as ep:
        await play(ep, SPEC, task, MODEL, temperature=1.0, max_tokens=max_tokens)
    return ep.episode_id


async def team(swarm: SwarmClient, rounds: int, secret: int, max_tokens: int) -> str:
    """A guesser and an advisor: each keeps its own conversation; both grow every round."""
    task = GuessNumber(secret=secret, n=2**rounds * 4, max_turns=rounds)
    env = GuessNumberEnv(task)
    async with swarm.episode(
        task.task_id, models=[MODEL], agents=["guesser", "advisor"], heartbeat_s=0
    ) as ep:
        guesser, advisor = ep.openai("guesser"), ep.openai("advisor")
        g_msgs = env.reset()
        a_msgs = [
            {
                "role": "system",
                "content": "You advise a player in a number guessing game. Suggest one integer.",
            },
            {"role": "user", "content": task.user_prompt()},
        ]
        for _ in range(rounds):
            a = await advisor.chat.completions.create(model=MODEL, messages=a_msgs, max_tokens=max_tokens)
            a_msgs.append(reply_message(a.choices[0].message))
            g_msgs.append({"role": "user", "content": f"Advisor suggests: {a.choices[0].message.content}"})
            g = await guesser.chat.completions.create(model=MODEL, messages=g_msgs, max_tokens=max_tokens)
            reply = reply_message(g.choices[0].message)
            g_msgs.append(reply)
            step = env.step(reply)
            g_msgs += step.messages
            a_msgs.append(
                {
                    "role": "user",
                    "content": f"The player said {reply['content']!r}: {step.messages[0]['content'] if step.messages else 'done'}",
                }
            )
            if step.done:
                break
        await ep.reward(env.reward)
    return ep.episode_id


async def recorded(
    server: NatsServer, episode_ids: list[str]
) -> list[tuple[BeginEvent, list[LlmEvent], list[RewardEvent]]]:
    nc = await bus.connect(server.service_url, "bench")
    sub = await nc.jetstream().subscribe(f"{S.EPISODE_PREFIX}.>", ordered_consumer=True)
    events: dict[str, list[Any]] = {e: [] for e in episode_ids}
    while True:
        try:
            msg = await sub.next_msg(timeout=1.0)
        except TimeoutError:
            break
        ev = decode_event(msg.data)
        if ev.episode_id in events:
            events[ev.episode_id].append(ev)
    await nc.close()
    out = []
    for eid in episode_ids:
        evs = events[eid]
        begin = next(e for e in evs if e.kind == "begin")
        out.append((begin, [e for e in evs if e.kind == "llm"], [e for e in evs if e.kind == "reward"]))
    return out


def step_times(learner: Any, sets: dict[str, list[Any]], repeats: int) -> dict[str, float]:
    from swarmrl.services.trainer.batching import Scored

    items = {k: [Scored(s, 1.0 if i % 2 else -1.0) for i, s in enumerate(v)] for k, v in sets.items()}
    times: dict[str, list[float]] = {k: [] for k in sets}
    learner.train_step(items["on"], version=0)  # warm-up (allocator, first-call costs)
    for _ in range(repeats):
        for k in sets:  # interleaved, so machine load hits both alike
            t = time.perf_counter()
            learner.train_step(items[k], version=0)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from swarmrl.bootstrap import ensure_default_model
    from swarmrl.services.trainer.config import TrainerConfig
    from swarmrl.services.trainer.learner import Learner

    model_dir = Path(args.model) if args.model else ensure_default_model()
    workloads = {
        "guess_number_8_turns": (single_agent, 8),
        "guess_number_16_turns": (single_agent, 16),
        "team_2_agents_6_rounds": (team, 6),
    }
    cfg = TrainerConfig(
        model=MODEL,
        model_path=str(model_dir),
        max_tokens_per_micro_batch=args.micro_tokens,
        prefix_sharing=False,  # measure merging alone; bench/trainer.py measures prefix sharing
        run_dir=tempfile.mkdtemp(),
    )
    learner = Learner(cfg, model_dir)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        nc = await bus.connect(server.service_url, "bench-setup")
        await bus.ensure_streams(nc.jetstream())
        await nc.close()
        async with generation_stack(server, model_dir, MODEL):
            swarm = await SwarmClient.connect(server.agent)
            for name, (play_fn, turns) in workloads.items():
                t0 = time.perf_counter()
                ids = await asyncio.gather(
                    *(play_fn(swarm, turns, 1 + i, args.max_tokens) for i in range(args.episodes))
                )
                play_s = time.perf_counter() - t0
                episodes = await recorded(server, list(ids))
                sets: dict[str, list[Any]] = {}
                stats: dict[str, Any] = {}
                for mode, merge in (("on", True), ("off", False)):
                    samples = [
                        s for b, c, r in episodes for s in assemble(b, c, r, MergeOptions(merge=merge))[0]
                    ]
                    sets[mode] = samples
                    stats[mode] = {
                        "samples_per_episode": len(samples) / len(episodes),
                        "tokens_per_episode": sum(len(s.token_ids) for s in samples) / len(episodes),
                        "generated_tokens_per_episode": sum(sum(s.loss_mask) for s in samples)
                        / len(episodes),
                    }
                times = step_times(learner, sets, args.repeats)
                for mode in sets:
                    stats[mode]["trainer_step_s"] = round(times[mode], 4)
                calls = sum(len(c) for _, c, _ in episodes) / len(episodes)
                results[name] = {
                    "episodes": len(episodes),
                    "llm_calls_per_episode": calls,
                    "play_s": round(play_s, 2),
                    "merging_on": stats["on"],
                    "merging_off": stats["off"],
                    "ratio_samples": stats["off"]["samples_per_episode"] / stats["on"]["samples_per_episode"],
                    "ratio_tokens": stats["off"]["tokens_per_episode"] / stats["on"]["tokens_per_episode"],
                    "ratio_step_time": times["off"] / times["on"],
                }
                print(
                    f"{name}: tokens {results[name]['ratio_tokens']:.2f}x fewer, step "
                    f"{results[name]['ratio_step_time']:.2f}x faster with merging",
                    file=sys.stderr,
                )
            await swarm.close()
    return {
        "benchmark": "merging",
        "model_dir": str(model_dir),
        "max_tokens": args.max_tokens,
        "micro_batch_tokens": args.micro_tokens,
        "repeats": args.repeats,
        "workloads": results,
        "machine": machine(),
    }


def write_md(result: dict[str, Any], out: Path) -> None:
    m = result["machine"]
    lines = [
        "# Timeline merging benchmark",
        "",
        f"{describe(m)}; {m['date']}.",
        "",
        "Same recorded episodes (real gateway + embedded engine), assembled with merging on and off; one "
        "trainer step (`Learner.train_step`) on each sample set, median of interleaved repeats.",
        "",
        "| workload | calls/ep | samples/ep off → on | tokens/ep off → on | step s off → on | tokens ratio | step-time ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in result["workloads"].items():
        on, off = r["merging_on"], r["merging_off"]
        lines.append(
            f"| {name} | {r['llm_calls_per_episode']:.1f} | {off['samples_per_episode']:.1f} → "
            f"{on['samples_per_episode']:.1f} | {off['tokens_per_episode']:.0f} → {on['tokens_per_episode']:.0f} | "
            f"{off['trainer_step_s']:.3f} → {on['trainer_step_s']:.3f} | {r['ratio_tokens']:.2f}x | "
            f"{r['ratio_step_time']:.2f}x |"
        )
    lines += [
        "",
        "Generated (trained-on) tokens are identical in both modes; merging removes the repeated context.",
        "",
    ]
    (out / "merging.md").write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=8, help="episodes per workload")
    p.add_argument("--max-tokens", type=int, default=8, help="max tokens per reply")
    p.add_argument("--repeats", type=int, default=3, help="timed trainer steps per mode")
    p.add_argument("--micro-tokens", type=int, default=1024, help="trainer micro-batch size in tokens")
    p.add_argument("--model", default="", help="HF model dir (default: the bootstrapped tiny model)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    result = asyncio.run(run(args))
    write_json("merging", result, args.out)
    write_md(result, args.out)
    print(f"wrote {args.out / 'merging.json'} and merging.md", file=sys.stderr)


if __name__ == "__main__":
    main()
