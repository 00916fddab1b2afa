"""Exact accounting of a chaos run (`bench/chaos.py`), from the streams and from the ledger.

Reads every message of EPISODES, SAMPLES, METRICS and DLQ with the service credentials (an
ephemeral consumer per stream, nothing acked), the trainer's durable consumer, and the ledger's
Parquet files, and checks:

- every ended training episode (an `end`, not eval) has its merge stats, and its samples exactly
  once: as many as the stats kept, sample ids unique, every token the model generated in it on a
  loss-masked position of its samples; an ended episode without samples must have a reason in its
  stats (`empty`, `aborted: merge failed`, ...), else it is *lost*; every model of a dropped
  training episode has its lost-episode record (`swarm.samples.<model>.lost`), once;
- aborted and never-ended episodes (their client killed: timed out by the merger) have no samples;
- each sample id, train step (model, step) and merge stats record once (*doubled* otherwise);
- how many distinct task instances (`task_id`) the training episodes played, per episode begun, and
  whether a restarted built-in client began a round (group) its earlier lifetime had begun: one that
  starts its task stream over replays its first rounds and questions;
- each sample trained at most once, and every untrained one accounted for: dropped by the trainer
  with a reason, or still pending in the trainer's consumer when the run stopped (needs
  `TrainStep.sample_ids` / `TrainStep.dropped` / `SampleDrops`; without them the check is "not measured");
- the ledger holds one row per stream message (or the ledger's own dead letter of it), no more;
- dead letters, by service and reason.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchutil  # noqa: F401  # puts the repository on the path, for tests.support

from swarmrl.launch import client_name
from swarmrl.schemas import (
    EvalResult,
    LlmEvent,
    LostEpisode,
    MergeStats,
    SampleDrops,
    TrainStep,
    decode,
    decode_event,
    decode_sample,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.tables import TABLES
from tests.support.streams import Msg, queued_events, read_stream


@dataclass
class Episode:
    owner: str
    begin_ts: float | None = None
    task_id: str = ""
    group_key: str = ""
    eval: bool = False
    outcome: str = ""
    """`end`, `abort`, or "" (never closed)."""
    outcome_ts: float | None = None
    abort_reason: str = ""
    generated: int = 0
    """Tokens the model generated in the episode's LLM calls."""


@dataclass
class Streams:
    """What the streams hold, decoded."""

    episodes: dict[str, Episode] = field(default_factory=dict)
    llm_ts: list[float] = field(default_factory=list)
    samples: dict[str, list[tuple[int, str, str, int]]] = field(default_factory=dict)
    """sample id -> [(SAMPLES seq, episode id, model, trained tokens)], one entry per copy."""
    merges: dict[str, list[MergeStats]] = field(default_factory=dict)
    lost: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(episode id, model) -> copies of its lost-episode record (`swarm.samples.<model>.lost`)."""
    steps: list[TrainStep] = field(default_factory=list)
    drops: list[SampleDrops] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    seqs: dict[str, list[int]] = field(default_factory=dict)
    """Stream -> sequence numbers of the messages it holds."""
    queued: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Episode id -> (partition, events) left unmerged in EPISODE_PARTS at the stop (`queued_events`)."""
    undecodable: Counter[str] = field(default_factory=Counter)


async def read_streams(url: str) -> tuple[Streams, dict[str, Any]]:
    """Decode the four streams; also returns the trainers' durable consumers (model -> info)."""
    nc = await bus.connect(url, "chaos-audit")
    js = nc.jetstream()
    out = Streams()
    try:
        for stream in (S.EPISODES_STREAM, S.SAMPLES_STREAM, S.METRICS_STREAM, S.DLQ_STREAM):
            msgs = await read_stream(js, stream)
            out.seqs[stream] = [m.seq for m in msgs]
            for m in msgs:
                try:
                    _add(out, stream, m)
                except Exception as exc:  # counted and reported: the accounting must see everything
                    out.undecodable[f"{stream}: {type(exc).__name__}"] += 1
        out.queued = await queued_events(js)
        consumers = {}
        for model in sorted({s[2] for copies in out.samples.values() for s in copies}):
            durable = S.durable_name("trainer", S.SAMPLES_STREAM, model)
            try:
                consumers[model] = await js.consumer_info(S.SAMPLES_STREAM, durable)
            except Exception:  # no trainer consumer: every sample counts as pending
                consumers[model] = None
    finally:
        await nc.close()
    return out, consumers


def _add(out: Streams, stream: str, m: Msg) -> None:
    if stream == S.EPISODES_STREAM:
        ev = decode_event(m.data)
        ep = out.episodes.setdefault(ev.episode_id, Episode(owner=m.subject.split(".")[2]))
        if ev.kind == "begin":
            ep.begin_ts, ep.eval, ep.task_id, ep.group_key = ev.ts, ev.eval, ev.task_id, ev.group_key
        elif ev.kind in ("end", "abort") and not ep.outcome:
            ep.outcome, ep.outcome_ts = ev.kind, ev.ts
            ep.abort_reason = str(getattr(ev, "reason", ""))
        elif isinstance(ev, LlmEvent):
            ep.generated += len(ev.output_ids)
            out.llm_ts.append(ev.ts)
    elif stream == S.SAMPLES_STREAM and m.subject.endswith(".lost"):
        lost = decode(m.data, LostEpisode)
        out.lost[(lost.episode_id, lost.model)] += 1
    elif stream == S.SAMPLES_STREAM:
        s = decode_sample(m.data)
        out.samples.setdefault(s.sample_id, []).append((m.seq, s.episode_id, s.model, sum(s.loss_mask)))
    elif stream == S.METRICS_STREAM:
        kind = m.subject.split(".")[2]
        if kind == "merge":
            ms = decode(m.data, MergeStats)
            out.merges.setdefault(ms.episode_id, []).append(ms)
        elif kind == "train":
            out.steps.append(decode(m.data, TrainStep))
        elif kind == "eval":
            out.evals.append(decode(m.data, EvalResult))
        elif kind == "drops":
            out.drops.append(decode(m.data, SampleDrops))
    else:
        reason = m.headers.get(bus.REASON_HEADER, "")
        out.dead_letters.append(
            {
                "seq": m.seq,
                "service": m.headers.get(bus.SERVICE_HEADER, m.subject.split(".")[-1]),
                "code": reason.split(":", 1)[0],
                "reason": reason[:300],
                "subject": m.headers.get(bus.SUBJECT_HEADER, ""),
                "msg_id": m.headers.get("Nats-Msg-Id", ""),
            }
        )


def _touched(st: Streams, faults: list[dict[str, Any]]) -> tuple[set[str], dict[int, int]]:
    """Training episodes open when their client was killed (never closed, begun before the kill and
    after that client's previous kill), and how many each client kill touched (fault index -> n)."""
    kills: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for i, f in enumerate(faults):
        if f["kind"] == "client":
            kills[client_name(f["target"])].append((f["ts"], i))
    touched: set[str] = set()
    per_kill: dict[int, int] = Counter()
    for eid, ep in st.episodes.items():
        if ep.eval or ep.outcome or ep.begin_ts is None:
            continue
        later = [(ts, i) for ts, i in sorted(kills.get(ep.owner, [])) if ts > ep.begin_ts]
        if later:
            touched.add(eid)
            per_kill[later[0][1]] += 1
    return touched, dict(per_kill)


RUNNER_GROUP = re.compile(r"@(?P<client>.+)-(?P<life>[0-9a-f]{8})-(?P<round>\d+)$")
"""The built-in runner's group key: `<task_id>@<client id>-<process lifetime>-<round>`."""


def rounds_replayed(st: Streams) -> dict[str, int]:
    """Per client, groups begun on a round an earlier lifetime of the same client had begun: a client
    restarted with its seed that starts its task stream over replays its first rounds."""
    lives: dict[tuple[str, str], dict[str, float]] = defaultdict(
        dict
    )  # (client, round) -> life -> first begin
    for ep in st.episodes.values():
        m = RUNNER_GROUP.search(ep.group_key)
        if ep.eval or ep.begin_ts is None or m is None:
            continue
        seen = lives[(m["client"], m["round"])]
        seen[m["life"]] = min(seen.get(m["life"], ep.begin_ts), ep.begin_ts)
    replayed: Counter[str] = Counter()
    for (client, _), seen in lives.items():
        replayed[client] += len(seen) - 1
    return {c: n for c, n in sorted(replayed.items())}


def account_streams(st: Streams, consumers: dict[str, Any], faults: list[dict[str, Any]]) -> dict[str, Any]:
    """The checks of the module docstring on what the streams hold."""
    by_episode: dict[str, list[str]] = defaultdict(list)
    trained_tokens: Counter[str] = Counter()
    for sid, copies in st.samples.items():
        by_episode[copies[0][1]].append(sid)
        trained_tokens[copies[0][1]] += copies[0][3]
    training = {eid: ep for eid, ep in st.episodes.items() if not ep.eval and ep.begin_ts is not None}
    ended = {eid for eid, ep in training.items() if ep.outcome == "end"}
    aborted = {eid for eid, ep in training.items() if ep.outcome == "abort"}
    never = {eid for eid, ep in training.items() if not ep.outcome}
    touched, per_kill = _touched(st, faults)
    distinct = len({ep.task_id for ep in training.values()})

    exactly_once, accounted, lost, token_mismatch = 0, Counter[str](), [], []
    t0 = min((ep.begin_ts for ep in training.values() if ep.begin_ts is not None), default=0.0)
    for eid in sorted(ended):
        stats = st.merges.get(eid, [])
        n = len(by_episode.get(eid, []))
        if stats and stats[0].status == "merged" and n == stats[0].timelines_kept >= 1:
            exactly_once += 1
            if trained_tokens[eid] != st.episodes[eid].generated:
                token_mismatch.append((eid, st.episodes[eid].generated, trained_tokens[eid]))
        elif stats and stats[0].status != "merged" and n == 0:
            accounted[f"{stats[0].status}: {stats[0].reason[:60]}"] += 1
        else:
            lost.append({"episode": eid, "samples": n, "stats": [s.status for s in stats],
                         "ended_t": round((st.episodes[eid].outcome_ts or 0) - t0, 1),
                         "queued": st.queued.get(eid)})  # fmt: skip
    with_samples = lambda ids: sorted(e for e in ids if by_episode.get(e))  # noqa: E731
    eval_samples = with_samples(eid for eid, ep in st.episodes.items() if ep.eval)
    orphan_samples = sorted(e for e in by_episode if e not in st.episodes)
    never_status = Counter(
        st.merges[e][0].status if e in st.merges else "no stats (open at stop)" for e in never
    )

    doubled = {
        "samples": sum(len(c) - 1 for c in st.samples.values()),
        "train_steps": sum(n - 1 for n in Counter((t.model, t.step) for t in st.steps).values()),
        "merge_stats": sum(len(v) - 1 for v in st.merges.values()),
        "lost_records": sum(n - 1 for n in st.lost.values()),
    }
    # Every model a dropped training episode sends no sample must have been told (its trainer
    # counts the episode out of its group with that record).
    untold = sorted(
        (eid, m)
        for eid, stats in st.merges.items()
        if eid in training and stats[0].status != "merged"
        for m in stats[0].models
        if (eid, m) not in st.lost
    )
    training_acct = _trained(st, consumers)
    if training_acct.get("measured"):
        doubled["trained_samples"] = training_acct["trained_twice"]
    dl = Counter(f"{d['service']}: {d['code']}" for d in st.dead_letters)
    return {
        "episodes": {
            "training": len(training),
            "ended": len(ended),
            "aborted": len(aborted),
            "never_ended": len(never),
            "never_ended_by_merge_status": dict(never_status),
            "eval": sum(ep.eval for ep in st.episodes.values()),
            "distinct_task_ids": distinct,
            "distinct_per_episode": round(distinct / max(len(training), 1), 4),
            "rounds_replayed": rounds_replayed(st),
            "touched_by_client_kills": len(touched),
            "touched_fraction": round(len(touched) / max(len(training), 1), 4),
            "never_ended_untouched": sorted(never - touched)[:20],
            "never_ended_untouched_count": len(never - touched),
        },
        "touched_per_kill": per_kill,
        "ended_samples_exactly_once": exactly_once,
        "ended_without_samples_with_reason": dict(accounted),
        "lost": lost,
        "lost_summary": lost_summary(lost, st.queued),
        "lost_records_missing": untold[:20],
        "lost_records_missing_count": len(untold),
        "token_mismatch": token_mismatch[:20],
        "aborted_with_samples": with_samples(aborted),
        "never_ended_with_samples": with_samples(never),
        "eval_with_samples": eval_samples,
        "samples_without_episode": orphan_samples[:20],
        "samples": len(st.samples),
        "doubled": doubled,
        "training": training_acct,
        "dead_letters": dict(dl),
        "dead_letter_list": st.dead_letters[:50],
        "undecodable": dict(st.undecodable),
    }


def lost_summary(lost: list[dict[str, Any]], queued: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Where the lost episodes are, to tell a stalled merger partition (their events still queued in
    EPISODE_PARTS, in one partition, ending over a stretch of the run) from events that never reached
    it: when they ended (seconds from the first episode's begin) and which partitions hold them."""
    ended = [x["ended_t"] for x in lost]
    return {
        "count": len(lost),
        "ended_t": [min(ended), max(ended)] if ended else [],
        "queued_at_stop": sum(x["queued"] is not None for x in lost),
        "queued_by_partition": dict(Counter(x["queued"][0] for x in lost if x["queued"] is not None)),
        "episodes_queued_at_stop": len(queued),
    }


def _trained(st: Streams, consumers: dict[str, Any]) -> dict[str, Any]:
    """Each sample trained at most once; every other one dropped with a reason or pending at stop."""
    ack_floor = {m: (c.ack_floor.stream_seq if c else 0) for m, c in consumers.items()}
    pending_reported = {m: (c.num_ack_pending + c.num_pending if c else None) for m, c in consumers.items()}
    if not {"sample_ids", "dropped"} <= set(TrainStep.model_fields):
        return {
            "measured": False,
            "why": "TrainStep has no sample_ids/dropped yet: trained-at-most-once not measured",
            "trainer_ack_floor": ack_floor,
            "trainer_pending_reported": pending_reported,
        }
    trained: Counter[str] = Counter()
    dropped: dict[str, str] = {}
    for t in st.steps:
        trained.update(getattr(t, "sample_ids", []) or [])
        dropped.update(getattr(t, "dropped", {}) or {})
    for d in st.drops:  # reported between steps (`SampleDrops`)
        dropped.update(d.dropped)
    reasons = Counter(r.split(":", 1)[0] for sid, r in dropped.items() if sid not in trained)
    pending, unaccounted = 0, []
    for sid, copies in st.samples.items():
        if sid in trained or sid in dropped:
            continue
        seq, _, model, _ = copies[0]
        if seq > ack_floor.get(model, 0):
            pending += 1
        else:
            unaccounted.append(sid)
    return {
        "measured": True,
        "trained": len(trained),
        "trained_twice": sum(n - 1 for n in trained.values()),
        "trained_unknown": sorted(set(trained) - set(st.samples))[:20],
        "dropped_by_reason": dict(reasons),
        "dropped_and_trained": len(set(dropped) & set(trained)),
        "pending_at_stop": pending,
        "trainer_pending_reported": pending_reported,
        "unaccounted": len(unaccounted),
        "unaccounted_ids": unaccounted[:20],
    }


def account_ledger(run_dir: Path, st: Streams) -> dict[str, Any]:
    """Ledger rows per stream against the stream's messages: each message one row, or one dead
    letter the ledger itself wrote for it (`dlq.ledger.<stream>.<seq>`), never two."""
    con = connect(run_dir)
    rows: dict[str, Counter[int]] = defaultdict(Counter)
    for table in TABLES:
        for stream, seq, n in con.execute(
            f"SELECT stream, stream_seq, count(*) FROM {table} GROUP BY ALL"
        ).fetchall():
            rows[stream][int(seq)] += int(n)
    by_ledger: dict[str, set[int]] = defaultdict(set)
    for d in st.dead_letters:
        parts = d["msg_id"].split(".")
        if d["service"] == "ledger" and len(parts) == 4:
            by_ledger[parts[2]].add(int(parts[3]))
    out = {}
    for stream, seqs in st.seqs.items():
        have = rows.get(stream, Counter())
        missing = [s for s in seqs if not have.get(s) and s not in by_ledger[stream]]
        extra = sorted(set(have) - set(seqs))
        out[stream] = {
            "stream_messages": len(seqs),
            "ledger_rows": sum(have.values()),
            "ledger_dead_letters": len(by_ledger[stream]),
            "missing": len(missing),
            "missing_seqs": missing[:20],
            "duplicate_rows": sum(n - 1 for n in have.values() if n > 1),
            "rows_not_in_stream": len(extra),
        }
    con.close()
    return out


LEASE_LINE = re.compile(
    r"^(\S+ \S+) .*swarmrl\.leases: (?:merger|ledger) \S+: took \[([\d, ]*)\], lost \[([\d, ]*)\], "
    r"giving back \[([\d, ]*)\]"
)
START_LINE = re.compile(r"^(\S+ \S+) .*swarmrl\.(?:merger|ledger): replica \S+ consuming")
Lease = tuple[float, str, set[int] | None, set[int]]
"""(time, merger process, partitions taken or None for a (re)start, partitions lost or given back)."""


def lease_log(logs: Path, service: str = "merger") -> list[Lease]:
    """Every `service` process's (merger, ledger replica) starts and partition lease changes in time
    order, from the lines it and `services/common/leases.py` log (`<process>.log`, local time)."""
    out: list[Lease] = []
    for path in sorted(logs.glob(f"{service}*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if (m := LEASE_LINE.match(line)) or (m := START_LINE.match(line)):
                ts = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                nums = [{int(x) for x in g.split(",") if x.strip()} for g in m.groups()[1:]]
                out.append(
                    (ts, path.stem, nums[0], nums[1] | nums[2]) if nums else (ts, path.stem, None, set())
                )
    return sorted(out, key=lambda t: t[0])


def covered_at(log: list[Lease], process: str, kill_ts: float) -> float | None:
    """When every partition merger process `process` held at `kill_ts` had been taken again (by a
    surviving replica or by its own restart), from `lease_log`; None if some never were."""
    held: set[int] = set()
    for ts, proc, taken, dropped in log:
        if ts > kill_ts:
            break
        if proc == process:
            held = set() if taken is None else (held | taken) - dropped
    if not held:  # it held nothing: nothing to cover
        return kill_ts
    for ts, _, taken, _ in log:
        if ts > kill_ts and taken:
            held -= taken
            if not held:
                return ts
    return None


def recovery_times(
    st: Streams, faults: list[dict[str, Any]], restarts: list[dict[str, Any]], run_dir: Path
) -> list[dict[str, Any]]:
    """Per fault: seconds from the kill to the restart (`restarts.jsonl`) and to the restarted
    process's next observable output. Node faults carry their own (measured live by the injector)."""
    parts = sorted(  # a restarted ledger writes its `part-empty` schema files at once: not an output
        p.stat().st_mtime for p in (run_dir / "ledger").rglob("part-*.parquet") if p.stem != "part-empty"
    )
    outputs: dict[str, list[float]] = {
        "merger": sorted(m.ts for v in st.merges.values() for m in v),
        "trainer": sorted(t.ts for t in st.steps),
        "gateway": sorted(st.llm_ts),
        "engine": sorted(st.llm_ts),
        "ledger": parts,
    }
    begins: dict[str, list[float]] = defaultdict(list)
    for ep in st.episodes.values():
        if ep.begin_ts is not None:
            begins[ep.owner].append(ep.begin_ts)
    for v in begins.values():
        v.sort()
    takes = {kind: lease_log(run_dir / "logs", kind) for kind in ("merger", "ledger")}
    out = []
    for f in faults:
        row = dict(f)
        restart = next(
            (
                r["ts"]
                for r in restarts
                if r.get("event") == "restart" and r["name"] == f["target"] and r["ts"] > f["ts"]
            ),
            None,
        )
        replica = re.search(r"-\d+$", f["target"]) is not None  # `<service>-<i>`: one of several
        if f["kind"] in takes and (f["kind"] == "merger" or replica):
            # replicas (mergers always lease): another one may go on at once, so wait for the takeover
            covered = covered_at(takes[f["kind"]], f["target"], f["ts"])
            row["covered_after_s"] = None if covered is None else round(covered - f["ts"], 2)
            nxt = next((t for t in outputs[f["kind"]] if covered is not None and t > covered), None)
            row["restarted_after_s"] = None if restart is None else round(restart - f["ts"], 2)
            row["recovered_after_s"] = None if nxt is None else round(nxt - f["ts"], 2)
        elif f["kind"] in ("gateway", "engine", "trainer") and replica:
            # one of several: the others serve the calls at once, a standby trainer takes the lead;
            # covered = the next llm event (train step)
            nxt = next((t for t in outputs[f["kind"]] if t > f["ts"]), None)
            row["covered_after_s"] = None if nxt is None else round(nxt - f["ts"], 2)
            row["restarted_after_s"] = None if restart is None else round(restart - f["ts"], 2)
            row["recovered_after_s"] = row["covered_after_s"]
        elif f["kind"] != "nats-node":
            series = begins[client_name(f["target"])] if f["kind"] == "client" else outputs[f["kind"]]
            after = restart if restart is not None else f["ts"]
            nxt = next((t for t in series if t > after), None)
            row["restarted_after_s"] = None if restart is None else round(restart - f["ts"], 2)
            row["recovered_after_s"] = None if nxt is None or restart is None else round(nxt - f["ts"], 2)
        out.append(row)
    return out


def eval_curve(st: Streams) -> list[dict[str, Any]]:
    """Held-out success per (model, task, metric) and step, in step order (the last record wins)."""
    latest: dict[tuple[str, str, str, int], EvalResult] = {}
    for e in sorted(st.evals, key=lambda e: e.ts):
        latest[(e.model, e.task, e.metric, e.step)] = e
    return [
        {"model": k[0], "task": k[1], "metric": k[2], "step": k[3], "success": round(e.success_rate, 4),
         "n": e.n, "ts": e.ts}
        for k, e in sorted(latest.items())
    ]  # fmt: skip


def checks_table(checks: dict[str, bool | None]) -> list[str]:
    """The `checks` of an accounting as markdown table lines (None: not measured in this run)."""
    rows = [
        f"| {k} | {'yes' if v else ('not measured' if v is None else '**NO**')} |" for k, v in checks.items()
    ]
    return ["| check | result |", "| --- | --- |", *rows]


async def account(
    url: str, run_dir: Path, faults: list[dict[str, Any]], restarts: list[dict[str, Any]]
) -> dict[str, Any]:
    st, consumers = await read_streams(url)
    result = account_streams(st, consumers, faults)
    result["ledger"] = await asyncio.to_thread(account_ledger, run_dir, st)
    result["recovery"] = recovery_times(st, faults, restarts, run_dir)
    result["eval_curve"] = eval_curve(st)
    result["train_step_ts"] = sorted(t.ts for t in st.steps)
    last: dict[str, TrainStep] = {}
    for t in sorted(st.steps, key=lambda t: t.step):
        last[t.model] = t
    # The trainers' cumulative counters at their last step (dropped_stale, short_groups, ...).
    result["trainer_counters"] = {
        m: {k: v for k, v in t.extra.items() if "." not in k} | {"step": t.step} for m, t in last.items()
    }
    return result
