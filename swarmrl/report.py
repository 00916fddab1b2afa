"""Run report: `report.md` and `curves.png` (reward and eval success) from a run's Parquet ledger."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from swarmrl.machine import describe


def _rows(con: Any, sql: str) -> list[tuple[Any, ...]]:
    return con.execute(sql).fetchall()


def plot_curves(train: list[tuple[Any, ...]], evals: list[tuple[Any, ...]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax1.plot([r[0] for r in train], [r[1] for r in train], marker=".", label="train reward (mean)")
    ax1.set(xlabel="trainer step", ylabel="reward", title="training reward")
    ax1.grid(alpha=0.3)
    for task in sorted({r[0] for r in evals}):
        pts = [(r[1], r[2]) for r in evals if r[0] == task]
        ax2.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=task)
    ax2.set(
        xlabel="model version (trainer step)",
        ylabel="success %",
        title="held-out eval success",
        ylim=(0, 100),
    )
    ax2.grid(alpha=0.3)
    if evals:
        ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_report(run_dir: Path, reason: str = "") -> Path:
    from swarmrl.services.ledger.query import connect

    con = connect(run_dir)
    train = _rows(
        con,
        "SELECT step, reward_mean, loss, samples, tokens, tokens_per_s, staleness_mean, wall_s "
        "FROM train_steps ORDER BY step",
    )
    evals = _rows(con, "SELECT task, step, success_rate, n, temperature, ts FROM evals ORDER BY task, step")
    started = _rows(con, "SELECT min(ts) FROM events")[0][0] or min((r[5] for r in evals), default=0.0)
    episodes = _rows(con, "SELECT status, count(*) FROM episodes GROUP BY status ORDER BY status")
    merges = _rows(
        con,
        "SELECT count(*), sum(calls), sum(timelines_kept), sum(tokens_before), sum(tokens_after) "
        "FROM merges WHERE status = 'merged'",
    )
    dead = _rows(con, "SELECT service, count(*) FROM dead_letters GROUP BY service")
    plot_curves([(r[0], r[1]) for r in train], evals, run_dir / "curves.png")

    lines = [
        f"# swarmrl run `{run_dir.name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')}. Ended: {reason or 'n/a'}.",
        "",
        f"Machine: {describe()}.",
        "",
        "![curves](curves.png)",
        "",
        "## Summary",
        "",
    ]
    lines.append(f"- trainer steps: {len(train)}")
    lines.append(f"- episodes: {', '.join(f'{s}: {n}' for s, n in episodes) or 'none'}")
    if merges and merges[0][0]:
        n, calls, kept, before, after = merges[0]
        lines.append(
            f"- timeline merging: {calls} LLM calls → {kept} samples; tokens {before} → {after} "
            f"({before / max(after, 1):.2f}x fewer)"
        )
    for task in sorted({r[0] for r in evals}):
        pts = [r for r in evals if r[0] == task]
        lines.append(
            f"- eval `{task}`: {100 * pts[0][2]:.1f}% (v{pts[0][1]}) → {100 * pts[-1][2]:.1f}% "
            f"(v{pts[-1][1]}, {(pts[-1][5] - started) / 60:.1f} min), best "
            f"{100 * max(p[2] for p in pts):.1f}%, n={pts[-1][3]} at temperature {pts[-1][4]:g}"
        )
    lines.append(f"- dead letters: {', '.join(f'{s}: {n}' for s, n in dead) or 'none'}")
    lines += [
        "",
        "## Eval",
        "",
        "| task | version | success | n | temperature | minutes into the run |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {t} | {s} | {100 * r:.1f}% | {n} | {temp:g} | {(ts - started) / 60:.1f} |"
        for t, s, r, n, temp, ts in evals
    ]
    lines += [
        "",
        "## Train steps",
        "",
        "| step | reward | loss | samples | tokens | tokens/s | staleness | wall s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r[0]} | {r[1]:.3f} | {r[2]:.4f} | {r[3]} | {r[4]} | {r[5]:.0f} | {r[6]:.2f} | {r[7]:.2f} |"
        for r in train
    ]
    lines += [
        "",
        f'Query the ledger: `swarmrl query "SELECT * FROM episodes LIMIT 5" --run-dir {run_dir}`',
        "",
    ]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out
