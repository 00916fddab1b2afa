"""Gateway benchmark: per-call overhead of the gateway over calling the engine directly, and engine
generated tokens/s at batch 1 and 16. Side by side in one run, on the same engine.

    python bench/gateway.py [--calls 30] [--out bench/results]

Overhead: the same prompt, greedy, same max_tokens, through (a) `EngineClient.generate` with the
gateway's own prompt ids and (b) the `openai` SDK against the gateway (token check, chat template,
prompt reuse, generation, `llm` event made durable in JetStream, response). Calls alternate so both
see the same machine load; medians are reported.
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
from engine_throughput import measure_throughput

from swarmrl.agents import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.common import bus
from swarmrl.services.engine.client import EngineClient
from tests.support.localstack import generation_stack

MODEL = "policy"
MESSAGES = [
    {"role": "system", "content": "You are playing a number guessing game. Reply with one integer only."},
    {"role": "user", "content": "I am thinking of an integer between 1 and 64. Your guess?"},
]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from swarmrl.bootstrap import ensure_default_model

    model_dir = Path(args.model) if args.model else ensure_default_model()
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        nc = await bus.connect(server.service_url, "bench-setup")
        await bus.ensure_streams(nc.jetstream())
        await nc.close()
        async with generation_stack(server, model_dir, MODEL) as stack:
            handle = stack.gateway.gateway.models[MODEL]
            prompt_ids = handle.builder.encode(handle.builder.render(MESSAGES, [], gen_prompt=True))
            engine = EngineClient(stack.engine_url)
            swarm = await SwarmClient.connect(server.agent)
            ep = await swarm.episode("bench", models=[MODEL], heartbeat_s=0).begin()
            llm = ep.openai(max_retries=0)
            params = {"temperature": 0.0, "max_new_tokens": args.max_tokens, "stop_token_ids": handle.stops}
            direct: list[float] = []
            via: list[float] = []
            for i in range(args.calls + 2):  # two warm-up rounds
                t = time.perf_counter()
                res = await engine.generate(prompt_ids, params)
                d = time.perf_counter() - t
                t = time.perf_counter()
                # a fresh conversation each time (same prompt), so both paths do identical work
                out = await llm.chat.completions.create(
                    model=MODEL, messages=MESSAGES, temperature=0.0, max_tokens=args.max_tokens
                )
                g = time.perf_counter() - t
                assert out.usage.completion_tokens == len(res.output_ids), "paths generated different lengths"
                if i >= 2:
                    direct.append(d)
                    via.append(g)
            await ep.end()
            await swarm.close()
            throughput = await measure_throughput(
                engine, prompt_len=args.prompt_len, new_tokens=args.new_tokens, batch_sizes=(1, 16)
            )
            await engine.aclose()
    d_med, g_med = statistics.median(direct), statistics.median(via)
    tps = throughput["tokens_per_s"]
    return {
        "benchmark": "gateway",
        "model_dir": str(model_dir),
        "calls": args.calls,
        "max_tokens": args.max_tokens,
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(res.output_ids),
        "engine_direct_ms_median": round(1000 * d_med, 2),
        "gateway_ms_median": round(1000 * g_med, 2),
        "gateway_overhead_ms_median": round(1000 * (g_med - d_med), 2),
        "ratio_gateway_to_direct": round(g_med / d_med, 3),
        "engine_throughput": throughput,
        "engine_tokens_per_s_batch1": tps.get(1, tps.get("1")),
        "engine_tokens_per_s_batch16": tps.get(16, tps.get("16")),
        "machine": machine(),
    }


def write_md(r: dict[str, Any], out: Path) -> None:
    m = r["machine"]
    text = f"""# Gateway benchmark

{m["cpu"]}, {m["cores"]} cores, torch {m["torch"]}, {m["date"]} (load average {m["load_average"]}).
Embedded CPU engine with `{r["model_dir"]}`.

| path | median latency per call |
| --- | ---: |
| engine `/generate` directly | {r["engine_direct_ms_median"]} ms |
| gateway (`openai` SDK → token check → template → engine → `llm` event in JetStream) | {r["gateway_ms_median"]} ms |
| **gateway overhead** | **{r["gateway_overhead_ms_median"]} ms** ({r["ratio_gateway_to_direct"]}x) |

{r["calls"]} calls each, interleaved, greedy, {r["prompt_tokens"]} prompt tokens, {r["completion_tokens"]} generated.

| engine generated tokens/s | batch 1 | batch 16 |
| --- | ---: | ---: |
| embedded engine | {r["engine_tokens_per_s_batch1"]:.1f} | {r["engine_tokens_per_s_batch16"]:.1f} |
"""
    (out / "gateway.md").write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=30, help="timed calls per path")
    p.add_argument("--max-tokens", type=int, default=8, help="max tokens per call in the overhead test")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens in the throughput test")
    p.add_argument(
        "--new-tokens", type=int, default=64, help="generated tokens per request in the throughput test"
    )
    p.add_argument("--model", default="", help="HF model dir (default: the bootstrapped tiny model)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    result = asyncio.run(run(args))
    write_json("gateway", result, args.out)
    write_md(result, args.out)
    print(
        f"gateway overhead {result['gateway_overhead_ms_median']} ms/call; engine "
        f"{result['engine_tokens_per_s_batch1']:.0f} / {result['engine_tokens_per_s_batch16']:.0f} tok/s "
        "at batch 1 / 16",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
