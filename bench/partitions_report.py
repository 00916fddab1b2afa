"""What `bench/partitions.py` reports: per fault, what each host did during it and how it recovered; the md.

`activity` counts what each side made in a window (records carry the time their maker stamped, so
work done during a cut counts there even when it reached the others after the heal); `recovery` is
the time from a heal to the next of each; `log_digest` sums the warnings and errors every process
(and NATS node) logged during each fault, with a few distinct lines; `write_md` writes the page.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from pathlib import Path
from typing import Any

from chaos_accounting import checks_table

NODES = ("A", "B", "C")


def _count(series: list[float], a: float, b: float) -> int:
    return sum(a <= t < b for t in series)


def series(streams: Any, parts: list[float]) -> dict[str, list[float]]:
    """Every kind of record the swarm makes, by the host that makes it, as sorted times."""
    eps = [e for e in streams.episodes.values() if not e.eval]
    return {
        "A trainer: train steps": sorted(t.ts for t in streams.steps),
        "B gateway: llm calls": sorted(streams.llm_ts),
        "C agents: episodes begun": sorted(e.begin_ts for e in eps if e.begin_ts is not None),
        "C agents: episodes ended": sorted(e.outcome_ts for e in eps if e.outcome == "end" and e.outcome_ts),
        "C agents: episodes aborted": sorted(
            e.outcome_ts for e in eps if e.outcome == "abort" and e.outcome_ts
        ),
        "C merger: episodes merged or dropped": sorted(m.ts for v in streams.merges.values() for m in v),
        "C ledger: Parquet parts written": parts,
    }


def activity(
    a: float, b: float, streams: Any, parts: list[float], samples: list[dict[str, Any]]
) -> dict[str, Any]:
    """What was made in [a, b), per kind, and each NATS node's health and meta leader over it."""
    out: dict[str, Any] = {k: _count(v, a, b) for k, v in series(streams, parts).items()}
    window = [s for s in samples if a <= s["t"] < b]
    for node in NODES:
        seen = [s[node] for s in window if node in s]
        out[f"node {node}: healthy share"] = (
            round(sum(x["healthy"] for x in seen) / len(seen), 2) if seen else None
        )
        out[f"node {node}: meta leaders seen"] = sorted({x["leader"] or "none" for x in seen})
    return out


def recovery(
    f: dict[str, Any], streams: Any, parts: list[float], samples: list[dict[str, Any]]
) -> dict[str, Any]:
    """Seconds from the heal to the next record of each kind, and to every node healthy again."""
    heal = f["heal"]
    s = series(streams, parts)

    def after(key: str) -> float | None:
        nxt = next((t for t in s[key] if t > heal), None)
        return None if nxt is None else round(nxt - heal, 1)

    healthy = next(
        (x["t"] for x in samples if x["t"] > heal and all(x[n]["healthy"] for n in NODES if n in x)), None
    )
    return {
        "next_train_step_s": after("A trainer: train steps"),
        "next_ledger_part_s": after("C ledger: Parquet parts written"),
        "next_llm_call_s": after("B gateway: llm calls"),
        "next_merge_s": after("C merger: episodes merged or dropped"),
        "next_begin_s": after("C agents: episodes begun"),
        "nodes_healthy_s": None if healthy is None else round(healthy - heal, 1),
    }


PY_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (WARNING|ERROR|CRITICAL) (.*)$")
NATS_LINE = re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \[(WRN|ERR|FTL)\] (.*)$")
NOISE = re.compile(r"[0-9a-f]{8,}|\d+(\.\d+)?")


def _lines(path: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if m := PY_LINE.match(line):
            ts = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        elif m := NATS_LINE.match(line):
            ts = dt.datetime.strptime(m[1], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        else:
            continue
        out.append((ts, m[2][:3].upper().replace("WAR", "WRN"), m[3]))
    return out


def log_digest(root: Path, faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fault (from its start to 10 s after its heal): each process's warnings and errors, counted,
    with up to 3 distinct lines (numbers and ids blanked)."""
    logs = {p.stem.replace("-", ":", 1): p for p in sorted((root / "logs").glob("*.log"))}
    logs |= {f"{h.upper()}:nats-server": root / h / "nats" / "nats-server.log" for h in "abc"}
    parsed = {name: _lines(p) for name, p in logs.items() if p.exists()}
    out = []
    for f in faults:
        per: dict[str, Any] = {}
        for name, lines in parsed.items():
            hits = [(lvl, msg) for ts, lvl, msg in lines if f["start"] <= ts < f["heal"] + 10]
            if hits:
                kinds = Counter(NOISE.sub("#", msg)[:160] for _, msg in hits)
                per[name] = {"warnings": sum(lvl == "WRN" for lvl, _ in hits),
                             "errors": sum(lvl != "WRN" for lvl, _ in hits),
                             "examples": [f"{n}x {m}" for m, n in kinds.most_common(3)]}  # fmt: skip
        out.append(per)
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _what(f: dict[str, Any]) -> str:
    if f["kind"] == "cut":
        return f"host {f['target'].upper()} cut off from the others"
    if f["kind"] == "degrade":
        return f"{f['latency_ms']:g} +- {f['jitter_ms']:g} ms and {f['loss_pct']}% loss between {f['target'].upper()}"
    return f"trainer's host A cut from the engines' host B ({f['target'].upper()})"


def write_md(r: dict[str, Any], path: Path) -> None:
    m, a, cfg = r["machine"], r["accounting"], r["config"]
    lines = [
        "# Network faults between three hosts while the swarm trains",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, torch {m['torch']}, {m['nats_server']}, {m['date']} "
        f"(load average {m['load_average']} at the end). Command: `{r['command']}` ({r['wall_s']:.0f} s; first "
        f"train step {r['first_step_after_s']:.0f} s after the start).",
        "",
        "Three hosts are network namespaces of this machine, each with its own address and directory "
        f"(`tests/support/netns.py`); the swarm is `{r['recipe']}` run as written (NATS node and trainer "
        "on A; node, engine and gateway on B; node, merger, ledger and agents on C; streams with 3 replicas). A cut drops every packet "
        "between a host and the others, both ways (nftables); latency is a relay that holds every byte of the "
        f"pair's TCP connections (they go through it from the start, delay 0 until then; no `netem` on this "
        "kernel); loss is nftables' `numgen random mod 100 < N drop`, each way. Each fault is followed by "
        f"{cfg['gap_s']:g} s to recover before the next.",
        "",
        "## Checks",
        "",
        *checks_table(r["checks"]),
        "",
        f"**lost = {r['lost']}, doubled = {r['doubled']}.** Episodes never ended: {r['never_ended']} "
        f"(each begun during, or up to 120 s before, a fault: its agent could not end it, and the merger timed it out).",
        "",
        "## Faults and recovery",
        "",
        "Seconds from the heal to the next record of each kind (its maker's time stamp), and to every NATS node "
        "healthy again (`/healthz`).",
        "",
        "| fault | s | next train step | next ledger part | next llm call | next merge | next begin | nodes healthy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for f in r["faults"]:
        rec = f["recovery"]
        lines.append(f"| {_what(f)} | {f['s']:g} | {_f(rec['next_train_step_s'])} | {_f(rec['next_ledger_part_s'])} | "
                     f"{_f(rec['next_llm_call_s'])} | {_f(rec['next_merge_s'])} | {_f(rec['next_begin_s'])} | "
                     f"{_f(rec['nodes_healthy_s'])} |")  # fmt: skip
    lines += ["", "## What each side did during each fault", "",
              "Records made during the fault, against the same length of time just before it:", ""]  # fmt: skip
    kinds = [k for k in r["faults"][0]["during"] if not k.startswith("node ")] if r["faults"] else []
    lines += ["| fault | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
    for f in r["faults"]:
        cells = [f"{f['during'][k]} ({f['before'][k]})" for k in kinds]
        lines.append(f"| {_what(f)} | " + " | ".join(cells) + " |")
    for f in r["faults"]:
        d = f["during"]
        nodes = "; ".join(f"{n}: healthy {d[f'node {n}: healthy share']}, leaders seen {d[f'node {n}: meta leaders seen']}"
                          for n in NODES)  # fmt: skip
        lines += ["", f"### {_what(f)}, {f['s']:g} s", "", f"NATS nodes during it: {nodes}.", ""]
        if "link_ms_during" in f:
            lines += [f"Measured on the link (connect to the peer's NATS port to its first byte, median of 7): "
                      f"{_f(f['link_ms_before'])} ms before, {_f(f['link_ms_during'])} ms during.", ""]  # fmt: skip
        if not f["logs"]:
            lines.append("No process logged a warning or an error.")
        for name, v in f["logs"].items():
            lines.append(
                f"- {name}: {v['warnings']} warnings, {v['errors']} errors: "
                + "; ".join(f"`{e}`" for e in v["examples"])
            )
    ep, tr = a["episodes"], a["training"]
    lines += [
        "", "## Accounting (streams and ledger)", "",
        "| what | count |", "| --- | ---: |",
        f"| training episodes begun | {ep['training']} |",
        f"| ended (`end`) | {ep['ended']} |",
        f"| ended, samples present exactly once | {a['ended_samples_exactly_once']} |",
        *[f"| ended, no samples: {k} | {v} |" for k, v in a["ended_without_samples_with_reason"].items()],
        f"| ended, lost (no samples and no reason) | {len(a['lost'])} |",
        f"| aborted (`abort`) | {ep['aborted']} (with samples: {len(a['aborted_with_samples'])}) |",
        f"| never ended | {ep['never_ended']} (with samples: {len(a['never_ended_with_samples'])}; merge status {ep['never_ended_by_merge_status']}) |",
        f"| samples | {a['samples']} |",
        *[f"| doubled {k} | {v} |" for k, v in a["doubled"].items()],
        f"| ended episodes whose generated tokens != trainable tokens | {len(a['token_mismatch'])} |",
    ]  # fmt: skip
    if tr["measured"]:
        lines += [f"| samples trained | {tr['trained']} (twice: {tr['trained_twice']}) |",
                  *[f"| samples not trained: {k} | {v} |" for k, v in tr["dropped_by_reason"].items()],
                  f"| samples pending in the trainer's consumer at stop | {tr['pending_at_stop']} |",
                  f"| samples neither trained, dropped nor pending | {tr['unaccounted']} |"]  # fmt: skip
    lines += [f"| dead letters | {sum(a['dead_letters'].values())} {a['dead_letters'] or ''} |", "",
              "| stream | messages | ledger rows | missing | duplicate rows |", "| --- | ---: | ---: | ---: | ---: |",
              *[f"| {s} | {v['stream_messages']} | {v['ledger_rows']} | {v['missing']} | "
                f"{v['duplicate_rows'] + v['rows_not_in_stream']} |" for s, v in a["ledger"].items()]]  # fmt: skip
    lines += ["", f"Exit codes at the stop: {r['exit_codes']}."]
    path.write_text("\n".join(lines) + "\n")
