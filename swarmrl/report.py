"""Run report: `report.md` and `curves.png` (reward and eval success) from a run's Parquet ledger."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from swarmrl.core.rundir import PARTS_FILE
from swarmrl.machine import describe


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # to files only, no display
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)


def _rows(con: Any, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    return con.execute(sql, params).fetchall()


def section(title: str, text: str, header: str, align: str) -> list[str]:
    """A report section's title, its text (if any) and its table's header."""
    return ["", f"## {title}", "", *([text, ""] if text else []), header, align]


def _series(row: tuple[Any, ...]) -> str:
    """Curve label of an eval row (task, model, metric, ...): the task's outcome, or a role's own metric."""
    task, model, metric = row[:3]
    if metric == AGENT_METRIC:
        return f"{task} (the agent's own, {model})"
    return task if metric == "success" else f"{task}: {model} {metric}"


AGENT_METRIC = "agent"
AGENT_EVALS = f"""
WITH served AS (SELECT episode_id, max(policy_version) AS version FROM llm_calls GROUP BY ALL)
SELECT e.task || ' @' || e.client_id AS task, e.models[1] AS model, '{AGENT_METRIC}' AS metric, s.version AS step,
       avg(coalesce(TRY_CAST(json_extract_string(e.metrics, '$.success') AS DOUBLE), (e.reward > 0)::DOUBLE)),
       count(*), NULL::DOUBLE AS temperature, max(e.end_ts)
FROM episodes e JOIN served s USING (episode_id)
WHERE e.eval AND e.status = 'ok' AND e.client_id <> 'evaluator'
GROUP BY ALL ORDER BY task, model, step
"""
"""Outside agents' own evaluation episodes (`SwarmClient.evaluate`) per task, client and policy
version: the rate of `end(success=...)`, else of reward > 0; rows shaped as `evals`'."""

CLIENT_GROUPS = """
SELECT client_id, task, count(*), count(*) FILTER (WHERE outcome = 'trained'),
       mode(reason) FILTER (WHERE outcome = 'dropped'), count(*) FILTER (WHERE outcome = 'dropped')
FROM groups GROUP BY ALL ORDER BY client_id, task
"""


def groups_section(con: Any) -> list[str]:
    """Report lines: per client and task, the share of its groups trained (the ledger's `groups`)."""
    rows = _rows(con, CLIENT_GROUPS)
    lines = section(
        "Groups per client", "What became of each client's GRPO groups (`groups` in the ledger).",
        "| client | task | groups | trained | most common drop |", "| --- | --- | ---: | ---: | --- |",
    )  # fmt: skip
    for client, task, n, trained, reason, dropped in rows:
        drop = f"{reason} ({dropped})" if dropped else "-"
        lines.append(f"| {client} | {task or '-'} | {n} | {100 * trained / n:.0f}% | {drop} |")
    return lines if rows else []


def task_rewards(con: Any) -> list[tuple[str, int, float]]:
    """(model task, step, its samples' reward mean), from `reward_mean.<task>` in `train_steps.extra`."""
    out = []
    for model, step, extra in _rows(con, "SELECT model, step, extra FROM train_steps ORDER BY model, step"):
        for key, value in (json.loads(extra) if extra else {}).items():
            if key.startswith("reward_mean."):
                out.append((f"{model} {key.removeprefix('reward_mean.')}", step, float(value)))
    return out


def plot_curves(
    train: list[tuple[Any, ...]],
    evals: list[tuple[Any, ...]],
    out: Path,
    per_task: list[tuple[str, int, float]] | None = None,
) -> None:
    """Left: train reward per model (model, step, reward), and per task when there are several.
    Right: eval curves (task, model, metric, step, success_rate, ...), one per `_series`."""
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4))
    for model in sorted({r[0] for r in train}):
        pts = [(r[1], r[2]) for r in train if r[0] == model]
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{model} reward (mean)")
    labels = sorted({r[0] for r in per_task or []})
    for label in labels if len({lab.split(" ", 1)[1] for lab in labels}) > 1 else []:
        pts = [(r[1], r[2]) for r in per_task or [] if r[0] == label]
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="--", alpha=0.7, label=f"{label} reward")
    ax1.set(xlabel="trainer step", ylabel="reward", title="training reward")
    ax1.grid(alpha=0.3)
    if train:
        ax1.legend()
    for label in sorted({_series(r) for r in evals}):
        pts = [(r[3], r[4]) for r in evals if _series(r) == label]
        ax2.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=label)
    ax2.set(
        xlabel="model version (trainer step)",
        ylabel="success %",
        title="held-out eval success",
        ylim=(0, 100),
    )
    ax2.grid(alpha=0.3)
    if evals:
        ax2.legend()
    save(fig, out)


CLIENT_VERSIONS = """
SELECT coalesce(json_extract_string(b.task, '$.name'), '?') AS task, e.client_version,
       min(e.begin_ts), max(coalesce(e.end_ts, e.last_ts)), count(*),
       count(*) FILTER (WHERE e.status = 'ok'), count(*) FILTER (WHERE e.status = 'aborted'),
       avg(e.reward) FILTER (WHERE e.status = 'ok'),
       avg(TRY_CAST(json_extract_string(e.metrics, '$.success') AS DOUBLE)) FILTER (WHERE e.status = 'ok')
FROM episodes e JOIN (SELECT episode_id, any_value(task) AS task FROM events WHERE kind = 'begin' GROUP BY ALL) b
    USING (episode_id)
WHERE NOT e.eval GROUP BY ALL ORDER BY task, min(e.begin_ts)
"""
"""Training episodes per task and client version (`swarmrl clients restart` starts a new one)."""


def client_versions_section(con: Any, started: float) -> list[str]:
    """Report lines: reward by client version over time (one row per task and `client_version`)."""
    rows = _rows(con, CLIENT_VERSIONS)
    lines = section(
        "Client versions",
        "Training episodes by the client code that played them (`client_version`; a new one per "
        "`swarmrl clients restart`). Reward and success are over ended episodes.",
        "| task | client version | first min | last min | episodes | ended | aborted | mean reward | success |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    )
    for task, version, first, last, n, ok, aborted, reward, success in rows:
        lines.append(
            f"| {task} | `{version}` | {(first - started) / 60:.1f} | {(last - started) / 60:.1f} | {n} | {ok} "
            f"| {aborted} | {'-' if reward is None else f'{reward:.3f}'} "
            f"| {'-' if success is None else f'{100 * success:.1f}%'} |"
        )
    return lines


DISTINCT_WINDOW_S = 180
DISTINCT_BY_WINDOW = """
SELECT coalesce(json_extract_string(b.task, '$.name'), '-') AS task,
       floor((e.begin_ts - $1) / $2)::BIGINT AS w, count(*), count(DISTINCT e.task_id)
FROM episodes e JOIN (SELECT episode_id, any_value(task) AS task FROM events WHERE kind = 'begin' GROUP BY ALL) b
    USING (episode_id)
WHERE NOT e.eval GROUP BY ALL ORDER BY task, w
"""
"""Per task and window of the run: training episodes begun and the distinct instances they played."""


def distribution_section(con: Any, started: float) -> list[str]:
    """Report lines: distinct training instances per window and task (a narrowing training
    distribution shows as a falling share)."""
    rows = _rows(con, DISTINCT_BY_WINDOW, [float(started), DISTINCT_WINDOW_S])
    if not rows:
        return []
    lines = section(
        "Training distribution",
        f"Distinct task instances (`task_id`) the training episodes played, per {DISTINCT_WINDOW_S // 60}-minute "
        "window of the run. A GRPO group plays one instance `num_repeat` times, so the most a window can "
        "have is 1 / `num_repeat` per episode; a window under half its task's best is marked.",
        "| task | minutes | episodes | distinct instances | per episode |",
        "| --- | --- | ---: | ---: | ---: |",
    )
    best: dict[str, float] = {}
    for task, _, n, distinct in rows:
        best[task] = max(best.get(task, 0.0), distinct / n)
    for task, w, n, distinct in rows:
        low = " **narrow**" if distinct / n < 0.5 * best[task] else ""
        span = f"{w * DISTINCT_WINDOW_S / 60:g}-{(w + 1) * DISTINCT_WINDOW_S / 60:g}"
        lines.append(f"| {task} | {span} | {n} | {distinct} | {distinct / n:.3f}{low} |")
    return lines


ACTIONS_BY_MINUTE = """
SELECT kind, floor((ts - $1) / 60)::BIGINT AS minute, count(*), count(*) FILTER (WHERE status = 'ok'),
       avg(act_s), quantile_cont(act_s, 0.5), quantile_cont(act_s, 0.99), avg(queued_s), max(units)
FROM actions GROUP BY ALL ORDER BY kind, minute
"""
"""Per action kind and minute of the run: count, ok, mean / p50 / p99 ACT, mean queueing, most units."""


def actions_section(con: Any, started: float) -> list[str]:
    """Report lines: the actions service's ACT and pool units over the run (none without actions)."""
    rows = _rows(con, ACTIONS_BY_MINUTE, [float(started)])
    if not rows:
        return []
    statuses = _rows(con, "SELECT status, count(*) FROM actions GROUP BY status ORDER BY status")
    policy = _rows(con, "SELECT any_value(policy) FROM actions")[0][0]
    lines = section(
        "Actions",
        f"Tool calls run as sandboxed actions (`services/actions/`, policy `{policy}`): "
        + ", ".join(f"{s}: {n}" for s, n in statuses)
        + ". ACT = action completion time (arrival to result); units = the pool's size when one started.",
        "| kind | minute | actions | ok | mean ACT ms | p50 ms | p99 ms | mean queued ms | most units |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    )
    for kind, minute, n, ok, mean, p50, p99, queued, units in rows:
        lines.append(
            f"| {kind} | {minute} | {n} | {ok} | {1000 * mean:.1f} | {1000 * p50:.1f} | {1000 * p99:.1f} "
            f"| {1000 * queued:.1f} | {units} |"
        )
    return lines


def restart_counts(run_dir: Path) -> dict[str, int]:
    """Restarts `swarmrl up` made, by process name, from the supervisor's journal in the logs."""
    from swarmrl.supervisor import RESTARTS_FILE

    records = _jsonl(run_dir / "logs" / RESTARTS_FILE)
    return dict(Counter(r["name"] for r in records if r.get("event") == "restart"))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, if it exists (a line cut short by a killed `up` is skipped)."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def write_report(run_dir: Path, reason: str = "") -> Path:
    from swarmrl.services.ledger.query import connect

    con = connect(run_dir)
    train = _rows(con, "SELECT model, step, reward_mean, loss, samples, tokens, tokens_per_s, "
                       "staleness_mean, wall_s FROM train_steps ORDER BY model, step")  # fmt: skip
    evals = _rows(con, "SELECT task, model, coalesce(metric, 'success') AS metric, step, success_rate, n, "
                       "temperature, ts FROM evals ORDER BY task, metric, model, step")  # fmt: skip
    evals += _rows(con, AGENT_EVALS)
    started = _rows(con, "SELECT min(ts) FROM events")[0][0] or min((r[7] for r in evals), default=0.0)
    episodes = _rows(con, "SELECT status, count(*) FROM episodes GROUP BY status ORDER BY status")
    merges = _rows(con, "SELECT count(*), sum(calls), sum(timelines_kept), sum(tokens_before), "
                        "sum(tokens_after) FROM merges WHERE status = 'merged'")  # fmt: skip
    computed_sql = "json_extract(extra, '$.computed_tokens')"
    shared = _rows(con, f"SELECT sum(tokens), sum(CAST({computed_sql} AS DOUBLE)) FROM train_steps "
                        f"WHERE {computed_sql} IS NOT NULL")  # fmt: skip
    dead = _rows(con, "SELECT service, count(*) FROM dead_letters GROUP BY service")
    plot_curves([(r[0], r[1], r[2]) for r in train], evals, run_dir / "curves.png", task_rewards(con))
    models = sorted({r[0] for r in train})
    # A crash-loop reason carries the log lines of the process that gave up: shown as a block.
    reason_line, _, reason_detail = (reason or "n/a").partition("\n")

    lines = [
        f"# swarmrl run `{run_dir.name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')}. Ended: {reason_line.rstrip(':')}.",
        "",
        *(["```", reason_detail, "```", ""] if reason_detail else []),
        f"Machine: {describe()}.",
        "",
        "![curves](curves.png)",
        "",
        "## Summary",
        "",
        "- trainer steps: " + (", ".join(f"{m} {sum(r[0] == m for r in train)}" for m in models) or "0"),
        f"- episodes: {', '.join(f'{s}: {n}' for s, n in episodes) or 'none'}",
    ]
    if merges and merges[0][0]:
        n, calls, kept, before, after = merges[0]
        lines.append(
            f"- timeline merging: {calls} LLM calls → {kept} samples; tokens {before} → {after} "
            f"({before / max(after, 1):.2f}x fewer)"
        )
    if shared and shared[0][1]:
        sample_tokens, computed = shared[0]
        lines.append(
            f"- prefix sharing: the trainer computed {int(computed)} tokens for {sample_tokens} sample tokens "
            f"({sample_tokens / max(computed, 1):.2f}x fewer)"
        )
    for label in sorted({_series(r) for r in evals}):
        pts = [r for r in evals if _series(r) == label]
        lines.append(
            f"- eval `{label}`: {100 * pts[0][4]:.1f}% (v{pts[0][3]}) → {100 * pts[-1][4]:.1f}% "
            f"(v{pts[-1][3]}, {(pts[-1][7] - started) / 60:.1f} min), best "
            f"{100 * max(p[4] for p in pts):.1f}%, n={pts[-1][5]}"
            + ("" if pts[-1][6] is None else f" at temperature {pts[-1][6]:g}")
        )
    if len(parts := _jsonl(run_dir / PARTS_FILE)) > 1:  # one per `swarmrl up`, the first and each `--resume`
        lines.append(
            f"- parts: {len(parts)} (`swarmrl up --resume`): "
            + "; ".join(
                f"{(p['started'] - started) / 60:.1f}-{(p['ended'] - started) / 60:.1f} min "
                f"({p['reason'].splitlines()[0] if p.get('reason') else 'n/a'})"
                for p in parts
            )
        )
    lines.append(f"- dead letters: {', '.join(f'{s}: {n}' for s, n in dead) or 'none'}")
    restarts = restart_counts(run_dir)
    lines.append(f"- restarts: {', '.join(f'{n} {k}' for n, k in sorted(restarts.items())) or 'none'}")
    lines += section(
        "Eval", "", "| task | model | metric | version | rate | n | temperature | minutes into the run |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    )  # fmt: skip
    lines += [
        f"| {t} | {m} | {metric} | {s} | {100 * r:.1f}% | {n} | {'-' if temp is None else f'{temp:g}'} "
        f"| {(ts - started) / 60:.1f} |"
        for t, m, metric, s, r, n, temp, ts in evals
    ]
    lines += section(
        "Train steps", "",
        "| model | step | reward | loss | samples | tokens | tokens/s | staleness | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    )  # fmt: skip
    lines += [
        f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.4f} | {r[4]} | {r[5]} | {r[6]:.0f} | {r[7]:.2f} | {r[8]:.2f} |"
        for r in train
    ]
    lines += groups_section(con)
    lines += distribution_section(con, started)
    lines += client_versions_section(con, started)
    lines += actions_section(con, started)
    lines += [
        "",
        f'Query the ledger: `swarmrl query "SELECT * FROM episodes LIMIT 5" --run-dir {run_dir}`',
        "",
    ]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out
