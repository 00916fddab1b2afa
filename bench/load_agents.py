"""The load process of `bench/load.py`: `SwarmClient`s, many agent coroutines, JSON lines for the parent.

`bench/load.py` spawns it as `bench/load.py --agent-proc NAME --control FILE --records FILE ...` (load.py
parses those flags and hands over to `agent_proc`), with `SWARMRL_CONNECT_FILES` naming this process's
connect files (a JSON list: one NATS identity and one `SwarmClient` connection each). It follows the
parent's control file (how many agents this process runs, or stop), runs that many agent coroutines
spread round robin over its clients, drains them at the stop, and appends every call and episode to
its records file (`Recorder`), which the parent reads as it grows (`load.Records`).

An agent loops over training episodes: begin, with a GRPO group key its team shares; `--calls` chat
completions through `ep.openai()`; reward; end. With `--think-median-s` it is a thinking agent: before each call it waits a lognormal time (that median, `--think-sigma`), as
tools and environments take; it begins its first episode at a random moment of `--ramp-s` (a stage
that adds a thousand agents opens their episodes over that time, not all at once), and at the stop
it ends its episode at once, its remaining calls skipped. Every second the process records how many
of its agents have an episode open.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

MODEL, TASK = "policy", "calculator"
PROMPT = "What is 7 * 4 + 8? Answer with a number."


class Recorder:
    """JSON lines for the parent: ["c", start, end, ok, tokens or error] per call, ["e", start,
    begun, end, status, detail] per episode, ["o", time, open episodes] every second, ["final",
    counts] at exit. Buffered, flushed by `flush`."""

    def __init__(self, path: Path) -> None:
        self.f = path.open("a")
        self.lines: list[str] = []
        self.counts = {"ended": 0, "aborted": 0, "errors": 0, "calls": 0}
        self.open = 0
        """Agents of this process with an episode open now."""

    def add(self, *rec: Any) -> None:
        self.lines.append(json.dumps(rec))

    def flush(self) -> None:
        if self.lines:
            self.f.write("\n".join(self.lines) + "\n")
            self.f.flush()
            self.lines.clear()


async def agent(
    i: int, client: Any, args: argparse.Namespace, draining: asyncio.Event, rec: Recorder
) -> None:
    """Play episodes until `draining`: begin, `--calls` completions (with `--think-median-s`, each after a
    lognormal think, and the episode ended at once by a stop), reward, end."""
    rng = random.Random(f"{args.agent_proc}-{i}")
    team, rnd = i // args.num_repeat, 0
    thinking = args.think_median_s > 0

    async def think(s: float) -> bool:
        """Wait `s` seconds, or less if the stop comes first (then False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(draining.wait(), s)
        return not draining.is_set()

    if thinking and not await think(rng.uniform(0, args.ramp_s)):
        return
    while not draining.is_set():
        key, rnd = f"{args.agent_proc}-t{team}-r{rnd}", rnd + 1
        t0, begun = time.time(), 0.0
        try:
            async with client.episode(
                key, models=[MODEL], group_key=key, group_size=args.num_repeat, task={"name": TASK}
            ) as ep:
                begun = time.time()
                rec.open += 1
                try:
                    llm = ep.openai(max_retries=args.openai_retries, timeout=args.call_timeout_s)
                    messages: list[dict[str, str]] = [{"role": "user", "content": PROMPT}]
                    for _ in range(args.calls):
                        wait = (
                            rng.lognormvariate(math.log(args.think_median_s), args.think_sigma)
                            if thinking
                            else 0
                        )
                        if wait and not await think(wait):
                            break
                        s = time.time()
                        try:
                            r = await llm.chat.completions.create(
                                model=MODEL, messages=messages, max_tokens=args.max_tokens
                            )
                        except Exception as exc:
                            rec.add("c", s, time.time(), False, type(exc).__name__)
                            raise
                        rec.add("c", s, time.time(), True, r.usage.completion_tokens if r.usage else 0)
                        rec.counts["calls"] += 1
                        messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                                     {"role": "user", "content": "Check it once more."}]  # fmt: skip
                    await ep.reward(float(rng.random() < 0.5))
                finally:
                    rec.open -= 1
            rec.counts["ended"] += 1
            rec.add("e", t0, begun, time.time(), "ended", "")
        except asyncio.CancelledError:  # the drain timed out: `async with` published abort
            rec.counts["aborted"] += 1
            rec.add("e", t0, begun, time.time(), "cancelled", "")
            raise
        except Exception as exc:
            rec.counts["errors"] += 1
            rec.add("e", t0, begun, time.time(), "error", f"{type(exc).__name__}: {exc}"[:300])
            await think(5.0 if thinking else 1.0)  # no hot loop against a refusing service


async def agent_proc(args: argparse.Namespace) -> int:
    """Follow the parent's control file (this process's agent target, or stop), then drain."""
    from swarmrl.agents import SwarmClient
    from swarmrl.infra.credentials import AgentCredential

    assert args.control is not None and args.records is not None
    rec = Recorder(args.records)
    clients = [
        await SwarmClient.connect(AgentCredential.read(path), code_version="bench-load")
        for path in json.loads(os.environ["SWARMRL_CONNECT_FILES"])
    ]
    stop, draining = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    rec.add("ready", time.time())  # imported and connected: the ramp may begin
    tasks: list[asyncio.Task[None]] = []
    last_gauge = 0.0
    while not stop.is_set():
        with contextlib.suppress(OSError, ValueError):  # not written yet, or being replaced
            ctl = json.loads(args.control.read_text())
            if ctl.get("stop"):
                break
            while len(tasks) < int(ctl["targets"].get(args.agent_proc, 0)):
                i = len(tasks)  # whole teams share a client: a group's episodes on one connection
                client = clients[(i // args.num_repeat) % len(clients)]
                tasks.append(asyncio.create_task(agent(i, client, args, draining, rec)))
        if time.time() - last_gauge >= 1.0:
            last_gauge = time.time()
            rec.add("o", last_gauge, rec.open)
        rec.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)
    draining.set()
    deadline = time.monotonic() + args.drain_s
    while tasks and time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.25)
        rec.flush()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    rec.add("final", rec.counts)
    rec.flush()
    for client in clients:
        await client.close()
    return 0
