"""Pipeline benchmark: raw JetStream publish throughput vs end-to-end throughput into the ledger.

    python bench/pipeline.py [--out bench/results] [--publishers N] [--events N] [--in-flight K,K] [--rounds R]
                             [--baseline GITREF] [--variant="FLAGS"]

Starts its own nats-server with swarmrl's streams and measures, on the same server in the same run,
alternating R rounds of, for each publish mode K:

(a) raw: N concurrent publishers (one NATS connection each, in this process) publish a realistic
    episode-event mix to EPISODES with plain nats-py JetStream: K=1 awaits every ack (as the SDK
    and the gateway do); K>1 publishes async with at most K unacked per publisher;
(b) end to end: the same mix, published the same way, while `swarmrl serve ledger` (its own process,
    default settings, fsync on) consumes it; timed from the first publish until every row is in a
    Parquet file;
and once, (c): the ledger alone draining a stream published beforehand (its capacity without
publishers competing for the CPU). `--baseline GITREF` runs (b) and (c) a second time with the ledger
of that commit (exported with `git archive`, imported ahead of the installed package), alternating
with today's on the same server and workload (each round starts with the next ledger in turn: the
first (b) after (a) ran measurably slower than the next): the before/after comparison in one run.
`--variant="FLAGS"` does the same with today's ledger given other flags (`--variant="--nice 0"`:
what its CPU priority is worth).

CPU seconds of the publishers, nats-server and the ledger are recorded per phase, so the result can
be read on a machine shared with other work. The ledger's headroom is (c) against the event rate of the
largest swarm whose stream counts are recorded (`swarm_rate`: every stream's messages over the run's
wall time, from the chaos benchmark's results). Writes `<out>/pipeline.json` and `<out>/pipeline.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from benchutil import baseline_tree, machine, proc_cpu_s

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import BeginEvent, EndEvent, EnvEvent, LlmEvent, RewardEvent, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger.config import LedgerConfig

Message = tuple[str, bytes, str]  # subject, payload, Nats-Msg-Id
REPO = Path(__file__).resolve().parents[1]
VOCAB = range(32_000)
SYSTEM_PROMPT = random.Random(0).choices(VOCAB, k=170)
"""System prompt and tool specs, the same in every episode (calculator's are about 170 tokens)."""


def episode_messages(episode_id: str, turns: int = 2) -> list[Message]:
    """One episode as an agent and the gateway publish it: begin, per turn an llm call and an env
    step, a reward and an end (7 events). Token counts are those of a short tool-using agent; ids
    and logprobs are random (seeded by the episode id) after a system prompt every episode shares,
    as a real run's are: constant values would flatter the ledger's Parquet encoding."""
    client, gw = "agent-bench", "gateway-bench"
    events: list = [
        BeginEvent(
            episode_id=episode_id,
            seq=0,
            client_id=client,
            client_version="bench",
            task_id="arith-7",
            task={"name": "arith", "digits": 7},
            models=["policy"],
            agents=["solver"],
        )
    ]
    rng = random.Random(episode_id)
    prompt = SYSTEM_PROMPT + rng.choices(VOCAB, k=130)  # a 300-token prompt that grows by each turn
    for turn in range(turns):
        output = rng.choices(VOCAB, k=60)  # 60 generated tokens
        events.append(
            LlmEvent(
                episode_id=episode_id,
                seq=turn,
                client_id=gw,
                call_id=f"chatcmpl-{episode_id}-{turn}",
                agent="solver",
                model="policy",
                prompt_ids=prompt,
                output_ids=output,
                output_logprobs=[-rng.expovariate(2.0) for _ in output],
                policy_version=3,
                messages=[{"role": "user", "content": "What is 1234567 + 7654321? " * 4}],
                output_text="The answer is 8888888. " * 6,
            )
        )
        events.append(
            EnvEvent(
                episode_id=episode_id,
                seq=1 + turn,
                client_id=client,
                agent="solver",
                name="tool",
                data={"tool": "calculator", "result": 8888888},
            )
        )
        prompt = prompt + output + rng.choices(VOCAB, k=20)  # the tool's answer
    events.append(RewardEvent(episode_id=episode_id, seq=turns + 1, client_id=client, value=1.0))
    events.append(EndEvent(episode_id=episode_id, seq=turns + 2, client_id=client, metrics={"turns": 2.0}))
    return [(S.episode_subject(ev.episode_id, ev.kind), encode(ev), ev.msg_id) for ev in events]


def workload(prefix: str, n_events: int, publishers: int) -> list[list[Message]]:
    """Whole episodes, dealt to publishers round-robin; each publisher keeps its episodes in order."""
    work: list[list[Message]] = [[] for _ in range(publishers)]
    total = i = 0
    while total < n_events:
        msgs = episode_messages(f"{prefix}{i}")
        work[i % publishers].extend(msgs)
        total, i = total + len(msgs), i + 1
    return work


async def publish_all(url: str, work: list[list[Message]], in_flight: int) -> tuple[float, float]:
    """Publish with one connection per publisher; return (first publish, last ack) times."""
    conns = [await bus.connect(url, f"bench-pub-{i}") for i in range(len(work))]

    async def one(nc, msgs: list[Message]) -> None:
        js = nc.jetstream(publish_async_max_pending=max(in_flight, 1))
        if in_flight <= 1:
            for subject, data, msg_id in msgs:
                await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})
            return
        acks = [
            await js.publish_async(subject, data, headers={"Nats-Msg-Id": msg_id})
            for subject, data, msg_id in msgs
        ]
        for ack in await asyncio.gather(*acks):  # every message stored (a failed ack raises here)
            assert ack.stream == S.EPISODES_STREAM and not ack.duplicate, ack

    gc.collect()  # what this process made before (the workload) is not walked during the phase
    t0 = time.perf_counter()
    await asyncio.gather(*(one(nc, msgs) for nc, msgs in zip(conns, work, strict=True)))
    t1 = time.perf_counter()
    for nc in conns:
        await nc.close()
    return t0, t1


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of `pid` (read from /proc)."""
    if pid is None:
        return time.process_time()
    return proc_cpu_s(pid)


class RowCounter:
    """Rows durable in the ledger's events + llm_calls Parquet files (reads each file's footer once)."""

    def __init__(self, run_dir: Path) -> None:
        self.dirs = [run_dir / "ledger" / "events", run_dir / "ledger" / "llm_calls"]
        self.seen: dict[Path, int] = {}

    def __call__(self) -> int:
        for d in self.dirs:
            for path in d.glob("part-*.parquet"):
                if path not in self.seen:
                    self.seen[path] = pq.read_metadata(path).num_rows
        return sum(self.seen.values())


async def raw_phase(server: NatsServer, work: list[list[Message]], in_flight: int) -> dict:
    n = sum(map(len, work))
    cpu0 = cpu_s(), cpu_s(server.proc.pid)
    t0, t1 = await publish_all(server.service_url, work, in_flight)
    cpu1 = cpu_s(), cpu_s(server.proc.pid)
    return {
        "seconds": t1 - t0,
        "events_per_s": n / (t1 - t0),
        "cpu_us_per_event": {
            "publishers": (cpu1[0] - cpu0[0]) / n * 1e6,
            "nats_server": (cpu1[1] - cpu0[1]) / n * 1e6,
        },
    }


@dataclass(frozen=True)
class Other:
    """A ledger measured beside today's in (b) and (c): an older commit's, or today's with other flags."""

    key: str
    """`baseline` or `variant`: the prefix of its fields in pipeline.json."""
    label: str
    """How the report names it."""
    code: Path | None = None
    """Its import tree (`baseline_tree`); None: the installed package."""
    flags: tuple[str, ...] = ()
    reproduce: str = ""
    """The benchmark's option that measures it (`--baseline REF`, `--variant "FLAGS"`)."""


async def ledger_phase(
    server: NatsServer,
    work: list[list[Message]],
    in_flight: int,
    tmp: Path,
    drain: bool = False,
    other: Other | None = None,
) -> dict:
    """(b): publish while the ledger runs. `drain`: publish first, then time the ledger alone.
    `other`: run that ledger instead of today's with its defaults."""
    code = other.code if other else None
    n, run_dir = sum(map(len, work)), tmp / "run"
    if drain:
        await publish_all(server.service_url, work, in_flight)
    cmd = [
        sys.executable,
        "-m",
        "swarmrl.cli",
        "serve",
        "ledger",
        "--run-dir",
        str(run_dir),
        "--stats-interval-s",
        "600",
        *(other.flags if other else ()),
    ]
    with (tmp / "ledger.log").open("wb") as log:
        env = os.environ | {"SWARMRL_NATS": server.service_url}  # credentials never on the command line
        if code is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # `cwd`: `python -m` puts it first on sys.path, ahead of PYTHONPATH (this repo's root has `swarmrl/`)
        proc = subprocess.Popen(cmd, stderr=log, env=env, cwd=code or None)  # noqa: ASYNC220 (started once, before the clock)
    try:
        nc = await bus.connect(server.service_url, "bench-probe")
        deadline = time.monotonic() + 60
        while True:  # ready once its EPISODES consumer exists (it starts reading at once)
            try:
                await nc.jetstream().consumer_info(
                    S.EPISODES_STREAM, S.durable_name("ledger", S.EPISODES_STREAM)
                )
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ledger did not start; see {tmp / 'ledger.log'}") from None
                await asyncio.sleep(0.01)
        await nc.close()
        counter = RowCounter(run_dir)
        cpu0 = cpu_s(), cpu_s(server.proc.pid), cpu_s(proc.pid)
        t0 = t_acked = time.perf_counter()
        if not drain:
            publishing = asyncio.create_task(publish_all(server.service_url, work, in_flight))
        while counter() < n:
            if proc.poll() is not None:
                raise RuntimeError(f"ledger exited with {proc.returncode}; see {tmp / 'ledger.log'}")
            await asyncio.sleep(0.02)
        t_durable = time.perf_counter()
        cpu1 = cpu_s(), cpu_s(server.proc.pid), cpu_s(proc.pid)
        if not drain:
            t0, t_acked = await publishing
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for line in (tmp / "ledger.log").read_text().splitlines():
            if "ledger stopped" in line:  # its row, dead-letter and pull-request counts
                name = f"{other.key} " if other else ""
                print(name + line.split("swarmrl.ledger: ", 1)[-1], file=sys.stderr)
    cpu = [(b - a) / n * 1e6 for a, b in zip(cpu0, cpu1, strict=True)]
    return {
        "seconds": t_durable - t0,
        "events_per_s": n / (t_durable - t0),
        "publish_seconds": t_acked - t0,
        "tail_after_last_ack_s": t_durable - t_acked,
        "cpu_us_per_event": {"publishers": cpu[0], "nats_server": cpu[1], "ledger": cpu[2]},
    }


async def fresh_episodes(js) -> None:
    """An empty EPISODES stream. Deleted and recreated rather than purged: reading a stream after a
    purge measurably cost the next consumer more CPU on the reference machine."""
    await js.delete_stream(S.EPISODES_STREAM)
    await bus.ensure_streams(js)


def ledger_settings() -> str:
    """The ledger's defaults that shape this benchmark (it runs with no flags)."""
    fields = LedgerConfig.model_fields
    names = (
        "flush_rows",
        "flush_interval_s",
        "flush_idle_rows",
        "fetch_batch",
        "poll_interval_s",
        "compression",
        "nice",
    )
    defaults = ", ".join(f"{name}={fields[name].default}" for name in names)
    return f"defaults: {defaults}, fsync={fields['fsync'].default}"


def mode_name(in_flight: int) -> str:
    return "await each ack" if in_flight <= 1 else f"async, <= {in_flight} unacked per publisher"


async def bench(args: argparse.Namespace) -> dict:
    rounds: dict[int, list[dict]] = {k: [] for k in args.in_flight}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="swarmrl-bench-") as tmp_name:
        tmp = Path(tmp_name)
        others = []
        if args.baseline:
            others.append(Other("baseline", f"the ledger of `{args.baseline}` ({_commit(args.baseline)})",
                                code=baseline_tree(args.baseline, tmp), reproduce=f"--baseline {args.baseline}"))  # fmt: skip
        if args.variant:
            others.append(Other("variant", f"today's ledger with `{args.variant}`", flags=tuple(args.variant.split()),
                                reproduce=f'--variant="{args.variant}"'))  # fmt: skip
        ledgers: list[Other | None] = [None, *others]  # None: today's, with its defaults
        server = NatsServer(store_dir=tmp / "nats").start()
        try:
            nc = await bus.connect(server.service_url, "bench-setup")
            js = nc.jetstream()
            await bus.ensure_streams(js)
            for r in range(args.rounds):
                for k in args.in_flight:  # modes alternate too, so a load change hits them all alike
                    tag = f"r{r}k{k}"
                    raw = await raw_phase(server, workload(f"raw{tag}-", args.events, args.publishers), k)
                    await fresh_episodes(js)  # (b) starts from an empty stream
                    e2e_work = workload(f"e2e{tag}-", args.events, args.publishers)
                    run: dict = {"raw_publish": raw}
                    line = ""
                    # Each round starts with the next ledger: the (b) right after (a) ran measurably
                    # slower (publishers and server alike) than the ones after it.
                    for other in ledgers[r % len(ledgers) :] + ledgers[: r % len(ledgers)]:
                        name = other.key if other else "today"
                        prefix = f"{name}_" if other else ""  # today's fields have none (pipeline.json)
                        (tmp / f"{tag}-{name}").mkdir()
                        res = await ledger_phase(server, e2e_work, k, tmp / f"{tag}-{name}", other=other)
                        await fresh_episodes(js)
                        ratio = res["events_per_s"] / raw["events_per_s"]
                        run |= {f"{prefix}end_to_end": res, f"{prefix}ratio": ratio}
                        line += f"; {name} {res['events_per_s']:.0f}/s, ratio {ratio:.2f}"
                    rounds[k].append(run)
                    print(
                        f"round {r}, {mode_name(k)}: raw {raw['events_per_s']:.0f}/s{line}", file=sys.stderr
                    )
            # Each ledger alone on a full stream: its own capacity, with no publisher beside it.
            drains: dict[Other | None, dict] = {}
            for other in ledgers:
                name = other.key if other else "today"
                (tmp / f"drain-{name}").mkdir()
                drains[other] = res = await ledger_phase(
                    server,
                    workload("drain-", args.events, args.publishers),
                    256,
                    tmp / f"drain-{name}",
                    drain=True,
                    other=other,
                )
                await fresh_episodes(js)
                print(
                    f"{name} ledger alone, draining a full stream: {res['events_per_s']:.0f}/s",
                    file=sys.stderr,
                )
            await nc.close()
        finally:
            server.stop()
    sizes = [len(data) for msgs in e2e_work for _, data, _ in msgs]
    by_kind: dict[str, list[int]] = {}
    for msgs in e2e_work:
        for subject, data, _ in msgs:
            by_kind.setdefault(subject.rsplit(".", 1)[1], []).append(len(data))
    configs = []
    for k, runs in rounds.items():
        raw_eps = statistics.median(run["raw_publish"]["events_per_s"] for run in runs)
        e2e_eps = statistics.median(run["end_to_end"]["events_per_s"] for run in runs)
        config = {
            "publish_mode": mode_name(k),
            "in_flight": k,
            "raw_events_per_s": round(raw_eps),
            "end_to_end_events_per_s": round(e2e_eps),
            "ratio_end_to_end_over_raw": round(e2e_eps / raw_eps, 3),
            "ledger_cpu_us_per_event": _median_cpu(runs, "end_to_end"),
        }
        for other in others:
            eps = statistics.median(run[f"{other.key}_end_to_end"]["events_per_s"] for run in runs)
            config |= {
                f"{other.key}_end_to_end_events_per_s": round(eps),
                f"{other.key}_ratio_end_to_end_over_raw": round(eps / raw_eps, 3),
                f"{other.key}_ledger_cpu_us_per_event": _median_cpu(runs, f"{other.key}_end_to_end"),
            }
        configs.append(config | {"per_round": runs})
    return {
        "publishers": args.publishers,
        "events_per_phase": len(sizes),
        "rounds": args.rounds,
        "event_bytes": {
            "mean": round(statistics.mean(sizes)),
            "min": min(sizes),
            "max": max(sizes),
            "by_kind": {k: round(statistics.mean(v)) for k, v in sorted(by_kind.items())},
        },
        "configs": configs,
        "ledger_alone_drain": _drain_summary(drains[None]),
        "largest_swarm": (swarm := swarm_rate(REPO / "bench" / "results")),
        "headroom": round(drains[None]["events_per_s"] / swarm["events_per_s"], 1) if swarm else None,
        "others": [
            {
                "key": other.key,
                "label": other.label,
                "reproduce": other.reproduce,
                "ledger_alone_drain": _drain_summary(drains[other]),
            }
            for other in others
        ],  # fmt: skip
        "ledger_settings": ledger_settings(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "machine": machine(),
    }


def swarm_rate(results: Path) -> dict | None:
    """The highest event rate, all streams together, of a recorded swarm run: the chaos benchmark's
    results count every stream's messages (3 clients playing 8 groups each on 2 cores)."""
    best = None
    for path in sorted(results.glob("chaos*.json")):
        r = json.loads(path.read_text())
        messages = sum(s["stream_messages"] for s in r["accounting"]["ledger"].values())
        rate = messages / r["wall_s"]
        if best is None or rate > best["events_per_s"]:
            best = {
                "events_per_s": round(rate, 1),
                "messages": messages,
                "wall_s": r["wall_s"],
                "source": path.name,
            }
    return best


def _median_cpu(runs: list[dict], phase: str) -> float:
    return round(statistics.median(run[phase]["cpu_us_per_event"]["ledger"] for run in runs), 1)


def _drain_summary(drain: dict) -> dict:
    return {
        "events_per_s": round(drain["events_per_s"]),
        "seconds": round(drain["seconds"], 3),
        "cpu_us_per_event": round(drain["cpu_us_per_event"]["ledger"], 1),
    }


def _commit(ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", ref], check=True, capture_output=True, text=True
    ).stdout.strip()


def write_report(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    m, b, others = result["machine"], result["event_bytes"], result["others"]
    drain = result["ledger_alone_drain"]
    head = "".join(f" (b) with {o['label']}, events/s | its b / a |" for o in others)
    summary = "\n".join(
        f"| {c['publish_mode']} | {c['raw_events_per_s']} | {c['end_to_end_events_per_s']} "
        f"| **{c['ratio_end_to_end_over_raw']:.2f}** |"
        + "".join(
            f" {c[o['key'] + '_end_to_end_events_per_s']} | {c[o['key'] + '_ratio_end_to_end_over_raw']:.2f} |"
            for o in others
        )
        for c in result["configs"]
    )
    drain_extra = "".join(f" {o['ledger_alone_drain']['events_per_s']} | |" for o in others)

    def row(c: dict, i: int, run: dict) -> str:
        raw, e2e = run["raw_publish"], run["end_to_end"]
        cells = [
            c["publish_mode"], str(i), f"{raw['events_per_s']:.0f}", f"{e2e['events_per_s']:.0f}", f"{run['ratio']:.2f}",
            f"{raw['cpu_us_per_event']['publishers']:.0f}", f"{e2e['cpu_us_per_event']['nats_server']:.0f}",
            f"{e2e['cpu_us_per_event']['ledger']:.0f}", f"{e2e['tail_after_last_ack_s']:.2f}",
        ]  # fmt: skip
        for o in others:
            theirs = run[f"{o['key']}_end_to_end"]
            cells += [
                f"{theirs['events_per_s']:.0f}",
                f"{run[o['key'] + '_ratio']:.2f}",
                f"{theirs['cpu_us_per_event']['ledger']:.0f}",
                f"{theirs['tail_after_last_ack_s']:.2f}",
            ]
        return "| " + " | ".join(cells) + " |"

    detail = "\n".join(row(c, i, run) for c in result["configs"] for i, run in enumerate(c["per_round"]))
    detail_head = (
        "| mode | round | (a) events/s | (b) events/s | b / a | CPU µs/event: publishers (a) | nats-server (b) "
        "| ledger (b) | (b) ledger done after last ack, s |"
        + "".join(
            f" {o['key']}: (b) events/s | its b / a | its ledger CPU µs/event | its tail, s |" for o in others
        )
    )
    cpu_line = (
        f"in (c) the ledger used {drain['cpu_us_per_event']} µs of CPU per event"
        + "".join(f", {o['label']} {o['ledger_alone_drain']['cpu_us_per_event']} µs" for o in others)
        + "; in (b), medians over the rounds: "
        + "; ".join(
            f"{c['publish_mode']}: {c['ledger_cpu_us_per_event']} µs"
            + "".join(f" ({o['key']}: {c[o['key'] + '_ledger_cpu_us_per_event']} µs)" for o in others)
            for c in result["configs"]
        )
    )
    flags = "".join(f" {o['reproduce']}" for o in others)
    swarm = result.get("largest_swarm")
    headroom = (
        f"**Headroom: {result['headroom']}x.** The ledger alone drains {drain['events_per_s']} events/s; the largest "
        f"recorded swarm published {swarm['events_per_s']} events/s across all streams ({swarm['messages']} messages "
        f"in {swarm['wall_s']:.0f} s, `bench/results/{swarm['source']}`)."
        if swarm
        else "Headroom: no recorded swarm with stream counts (`bench/results/chaos*.json`) to compare with."
    )
    md = f"""# Pipeline benchmark: JetStream publish vs. the ledger, end to end

{headroom}

| publishers publish with | (a) raw JetStream publish, events/s | (b) publish → ledger → durable Parquet, events/s | b / a |{head}
| --- | ---: | ---: | ---: |{" ---: | ---: |" * len(others)}
{summary}
| (c) the ledger alone, draining a full stream | | {drain["events_per_s"]} | |{drain_extra}

{result["publishers"]} concurrent publishers (one connection each), {result["events_per_phase"]} events per phase, medians
of {result["rounds"]} alternating rounds; 7-event episodes (begin, 2 × llm, 2 × env, reward, end), mean {b["mean"]}
bytes, llm events {b["by_kind"]["llm"]} bytes, token ids and logprobs random after a shared system prompt.
"Await each ack" is how the SDK and the gateway publish; the async mode shows how the ledger fares
against pipelined publishers. (a) and (b) run on the same nats-server; in (b) the ledger is its own
process with its {result["ledger_settings"]}, and the clock stops when the last row is in a renamed,
fsynced Parquet file. Machine: {m["cpu"]}, {m["cores"]} cores, {m["ram_gib"]} GiB RAM, {m["os"]}, Python
{m["python"]}, {m["nats_server"]}, {m["date"]}. The machine was shared (load average
{result["load_average_before_after"][0]} before, {result["load_average_before_after"][1]} after), so the CPU columns are the
steadier measure: {cpu_line}. Reproduce: `python bench/pipeline.py{flags}`.

{detail_head}
|{" --- |" * 2}{" ---: |" * (7 + 4 * len(others))}
{detail}
"""
    (out / "pipeline.md").write_text(md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--publishers", type=int, default=8, help="concurrent publishers (default 8)")
    parser.add_argument(
        "--events",
        type=int,
        default=60_000,
        help="events per phase (default 60000: about 2 s of raw publishing, so a phase measures a "
        "rate rather than the ledger's fixed last flush)",
    )
    parser.add_argument(
        "--in-flight",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 256],
        help="publish modes to measure: unacked publishes per publisher, 1 = await each ack "
        "(default 1,256; the first is the headline)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating (a)/(b) rounds; medians reported")
    parser.add_argument(
        "--baseline",
        metavar="GITREF",
        help="also run (b) and (c) with the ledger of this commit, side by side (e.g. 3cba855^: before issue 11)",
    )
    parser.add_argument(
        "--variant",
        metavar="FLAGS",
        help='also run (b) and (c) with today\'s ledger given these flags, side by side (e.g. --variant="--nice 0": the value starts with a dash, hence the =)',
    )
    args = parser.parse_args(argv)
    result = asyncio.run(bench(args))
    write_report(result, args.out)
    keys = ("publish_mode", "raw_events_per_s", "end_to_end_events_per_s", "ratio_end_to_end_over_raw")
    for config in result["configs"]:
        print(json.dumps({k: config[k] for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
