"""The study report: `report.md`, `curves.png` and `forest.png` in the study directory.

The numbers come from the runs' ledgers (the study's metric and curve SQL), not from the values the
runner kept, so a report can be written again at any time (`swarmrl research report DIR`), also
while the study runs. The findings are written from those numbers by the program: an arm is called
better or worse only when the bootstrap CI of the difference to the baseline excludes 0 *and* the
permutation test gives p < 0.05; a CI that excludes 0 with a larger p is reported as a hint. With few
seeds the smallest p-value the permutation test can reach is stated too.
"""

from __future__ import annotations

import itertools
import math
import shlex
import time
from pathlib import Path

import numpy as np

from swarmrl.report import pyplot, save, section
from swarmrl.research.state import StudyState
from swarmrl.research.stats import ArmStats, bootstrap_ci, mean, summarize
from swarmrl.research.study import DEFAULT_CURVE, MetricError, curve, metric_value, sql_columns

ALPHA = 0.05
GRID_POINTS = 40
"""Points of the common grid that per-seed curves with their own x values (minutes) are read at."""
Curves = dict[str, dict[int, list[tuple[float, float]]]]
"""arm -> seed -> (x, y) points."""


def fmt(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else f"{x:+.3f}" if signed else f"{x:.3f}"


def fmt_ci(ci: tuple[float, float] | None, signed: bool = False) -> str:
    return "-" if ci is None else f"[{fmt(ci[0], signed)}, {fmt(ci[1], signed)}]"


def fmt_p(p: float | None) -> str:
    return "-" if p is None else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def min_permutation_p(n: int, m: int) -> float:
    """The smallest two-sided p-value an exact permutation test of n vs m values can give."""
    return (2 if n == m else 1) / math.comb(n + m, n)


def verdict(s: ArmStats, goal: str) -> str:
    """`better`, `worse`, `hint better`, `hint worse` or `no difference` (see the module docstring)."""
    if s.diff is None or s.diff_ci is None:
        return "no comparison"
    lo, hi = s.diff_ci
    if lo <= 0 <= hi:
        return "no difference"
    word = "better" if (lo > 0) == (goal == "max") else "worse"
    return word if s.p_perm is not None and s.p_perm < ALPHA else f"hint {word}"


def findings(
    stats: list[ArmStats],
    baseline: str,
    metric: str,
    goal: str,
    stopped: dict[str, str] | None = None,
    missing: dict[str, int] | None = None,
) -> list[str]:
    """Markdown bullets. `stopped`: arm -> why early stopping dropped it; `missing`: arm -> runs that
    gave no metric (failed, skipped, or NULL)."""
    if not stats:
        return ["- No run has a metric yet: nothing to compare."]
    by_arm = {s.arm: s for s in stats}
    best = (max if goal == "max" else min)(stats, key=lambda s: s.mean)
    out = [
        f"- Best mean {metric}: `{best.arm}` with {fmt(best.mean)} (95% CI {fmt_ci(best.ci)}, {best.n} seed(s))"
        + (" - the baseline itself." if best.arm == baseline else ".")
    ]
    base = by_arm.get(baseline)
    if base is None:
        out.append(f"- The baseline `{baseline}` has no metric: no arm can be compared with it.")
    for s in stats:
        if s.diff is None or base is None:
            continue
        v = verdict(s, goal)
        numbers = (
            f"{fmt(s.diff, True)} vs the baseline (95% CI {fmt_ci(s.diff_ci, True)}, permutation p "
            f"{fmt_p(s.p_perm)}, Welch p {fmt_p(s.welch.p) if s.welch else 'n/a'}, {s.n} vs {base.n} seeds)"
        )
        if v in ("better", "worse"):
            out.append(f"- `{s.arm}` is {v} than the baseline: {numbers}.")
        elif v.startswith("hint"):
            out.append(
                f"- `{s.arm}` looks {v.split()[1]} than the baseline, not significantly: {numbers}. The CI of "
                "the difference excludes 0, but with these seeds the permutation test cannot go below "
                f"p = {min_permutation_p(s.n, base.n):.3f}."
            )
        else:
            out.append(
                f"- `{s.arm}`: no difference from the baseline detected: {numbers}; the CI includes 0."
            )
    out += [
        f"- `{arm}` was stopped early ({why}); its numbers rest on fewer seeds."
        for arm, why in (stopped or {}).items()
    ]
    out += [
        f"- `{arm}`: {n} run(s) gave no metric (failed, skipped or empty) and are left out."
        for arm, n in (missing or {}).items()
        if n
    ]
    if base is not None and any(s.arm != baseline for s in stats):
        n = max(s.n for s in stats if s.arm != baseline)  # the best-placed comparison
        floor = min_permutation_p(n, base.n)
        if floor >= ALPHA:
            seeds_needed = next(k for k in itertools.count(1) if min_permutation_p(k, k) < ALPHA)
            out.append(
                f"- With {n} seed(s) per arm no difference can reach p < {ALPHA} in the permutation test (its "
                f"floor is {floor:.3f}); {seeds_needed} seeds per arm can. Bootstrap CIs over so few seeds "
                "are narrow by construction (with 2 seeds they span the two values): read them as ranges seen."
            )
    return out


def collect(state: StudyState) -> tuple[dict[str, list[float]], dict[str, float | None], Curves]:
    """Per arm the metric of its finished runs, per run its metric (by run id), and the curves."""
    study = state.study
    values: dict[str, list[float]] = {arm: [] for arm in study.arm_names}
    per_run: dict[str, float | None] = {}
    curves: Curves = {arm: {} for arm in study.arm_names}
    for run in state.ordered():
        if run.status != "done":
            continue
        run_dir = Path(run.attempts[-1].run_dir)
        try:
            value = metric_value(run_dir, study.metric.query)
            curves[run.arm][run.seed] = curve(run_dir, study.metric.curve)
        except (MetricError, FileNotFoundError):
            value = None
        per_run[run.id] = value
        if value is not None:
            values[run.arm].append(value)
    return values, per_run, curves


def curve_labels(sql: str) -> tuple[str, str]:
    """Axis labels of a curve query: its two column names (the default curve's said in words)."""
    if sql == DEFAULT_CURVE:
        return "model version (trainer step)", "held-out success"
    try:
        names = sql_columns(sql)
    except MetricError:
        names = ()
    return (names[0], names[1]) if len(names) == 2 else ("x", "y")


def aligned(seeds: dict[int, list[tuple[float, float]]]) -> dict[float, list[float]]:
    """x -> the seeds' y at x. Curves on shared x values (model versions) are taken as they are; curves
    whose x values differ from seed to seed (wall-clock minutes) are each interpolated linearly at
    `GRID_POINTS` points over the span every seed covers, so the mean at x is over all seeds."""
    pts = {seed: sorted(p) for seed, p in seeds.items() if p}
    xs = sorted({x for p in pts.values() for x, _ in p})
    shared = [x for x in xs if sum(any(px == x for px, _ in p) for p in pts.values()) > 1]
    if len(pts) < 2 or 2 * len(shared) >= len(xs):
        return {x: [y for p in pts.values() for px, y in p if px == x] for x in xs}
    lo, hi = max(p[0][0] for p in pts.values()), min(p[-1][0] for p in pts.values())
    grid = [lo + (hi - lo) * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)] if hi > lo else [lo]
    return {
        x: [float(np.interp(x, [a for a, _ in p], [b for _, b in p])) for p in pts.values()] for x in grid
    }


def plot_curves(curves: Curves, out: Path, xlabel: str, ylabel: str) -> None:
    """Mean curve per arm over its seeds, with a bootstrap 95% band where 2+ seeds have a point; each
    seed's own curve faintly behind it."""
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    for arm, seeds in curves.items():
        at = aligned(seeds)
        if not at:
            continue
        xs = sorted(at)
        line = ax.plot(xs, [mean(at[x]) for x in xs], label=f"{arm} (n={len(seeds)})",
                       marker="o" if len(xs) < GRID_POINTS else None)[0]  # fmt: skip
        for pts in seeds.values():
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=line.get_color(), alpha=0.25, lw=0.8)
        band = [(x, *bootstrap_ci(at[x])) for x in xs if len(at[x]) > 1]
        if band:
            xs_band, lo, hi = zip(*band, strict=True)
            ax.fill_between(xs_band, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set(xlabel=xlabel, ylabel=ylabel, title="curves per arm, 95% CI bands")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out)


def plot_forest(stats: list[ArmStats], out: Path, metric: str) -> None:
    """Left: each arm's mean metric with its CI. Right: the difference to the baseline with its CI."""
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(10, 1.2 + 0.5 * max(len(stats), 1)), sharey=True)
    ys = list(range(len(stats)))[::-1]
    for i, (y, s) in enumerate(zip(ys, stats, strict=True)):
        ax1.errorbar(
            s.mean, y, xerr=[[s.mean - s.ci[0]], [s.ci[1] - s.mean]], fmt="o", capsize=4, color=f"C{i}"
        )
        if s.diff is not None and s.diff_ci is not None:
            xerr = [[s.diff - s.diff_ci[0]], [s.diff_ci[1] - s.diff]]
            ax2.errorbar(s.diff, y, xerr=xerr, fmt="s", capsize=4, color=f"C{i}")
    ax1.set_yticks(ys, [f"{s.arm} (n={s.n})" for s in stats])
    ax1.set(xlabel=metric, title="mean, 95% bootstrap CI")
    ax2.axvline(0, color="grey", linestyle="--")
    ax2.set(xlabel=f"difference in {metric}", title="vs the baseline, 95% CI")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    save(fig, out)


def write_report(study_dir: Path, state: StudyState) -> Path:
    from swarmrl.machine import describe

    study_dir, study, metric = Path(study_dir).resolve(), state.study, state.study.metric
    values, per_run, curves = collect(state)
    stats = summarize(values, study.baseline.name)
    plot_curves(curves, study_dir / "curves.png", *curve_labels(metric.curve))
    plot_forest(stats, study_dir / "forest.png", metric.label)
    budget = study.budget
    design = (
        f"- Metric: **{metric.label}** ({'higher' if metric.goal == 'max' else 'lower'} is better), "
        f"per run from its ledger:\n\n```sql\n{metric.query}\n```\n\n"
        f"- Seeds: {study.seeds}. Budget per run: {budget.run_minutes:g} min"
        + (f" or {budget.run_steps} steps" if budget.run_steps else "")
        + (f"; in total {budget.total_minutes:g} min." if budget.total_minutes else ".")
    )
    lines = [
        f"# Study `{study.name}`",
        "",
        f"**Question.** {study.question}",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')}; the study is "
        f"{'finished' if state.finished else 'in progress'}: {state.tally()}. Machine: {describe()}.",
        *section("Design", design, "| arm | flags | note |", "| --- | --- | --- |"),
    ]
    for arm in study.arm_names:
        own, tag = (study.baseline, " (baseline)") if arm == study.baseline.name else (study.arms[arm], "")
        flags = " ".join(f"{k}={v}" for k, v in own.flags.items()) or "-"
        lines.append(f"| {arm}{tag} | `{flags}` | {own.note} |")
    if (es := study.early_stop) is not None:
        lines += [
            "",
            f"Early stopping: successive halving after seeds {es.after_seeds}, keeping {es.keep:g} of the arms.",
        ]
        for d in state.decisions:
            ranking = ", ".join(f"{a} {fmt(v)}" for a, v in d.ranking)
            lines.append(f"- after {d.after_seeds} seed(s): {ranking}; kept {d.kept}, stopped {d.stopped}")
    lines += section(
        "Results", "",
        f"| arm | seeds | mean {metric.label} | 95% CI | difference to baseline | 95% CI | permutation p | Welch p |",
        "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: |",
    )  # fmt: skip
    for s in stats:
        lines.append(
            f"| {s.arm} | {s.n} | {fmt(s.mean)} | {fmt_ci(s.ci)} | {fmt(s.diff, True)} | "
            f"{fmt_ci(s.diff_ci, True)} | {fmt_p(s.p_perm)} | {fmt_p(s.welch.p if s.welch else None)} |"
        )
    lines += [
        "",
        "CIs: percentile bootstrap over seeds (exact enumeration of the resamples for few seeds); the difference "
        "resamples both arms. Permutation test: exact, two-sided, on the difference of means.",
        "",
        "![forest plot](forest.png)",
        "",
        "![curves](curves.png)",
        "",
        "## Findings",
        "",
    ]
    stopped = {
        arm: f"after {d.after_seeds} seed(s), rank {[a for a, _ in d.ranking].index(arm) + 1} of {len(d.ranking)}"
        for d in state.decisions
        for arm in d.stopped
    }
    missing = {
        arm: sum(r.arm == arm and r.status in ("done", "failed", "skipped") and per_run.get(r.id) is None
                 for r in state.runs.values())
        for arm in study.arm_names
    }  # fmt: skip
    lines += findings(stats, study.baseline.name, metric.label, metric.goal, stopped, missing)
    lines += section("Runs", "", "| run | status | metric | minutes | attempts | run dir | note |",
                     "| --- | --- | ---: | ---: | ---: | --- | --- |")  # fmt: skip
    reproduce = []
    for r in state.ordered():
        last = Path(r.attempts[-1].run_dir) if r.attempts else None
        where = f"[{last.name}]({last.relative_to(study_dir)}/report.md)" if last else "-"
        minutes = "-" if r.duration_s is None else f"{r.duration_s / 60:.1f}"
        lines.append(
            f"| {r.id} | {r.status} | {fmt(per_run.get(r.id))} | {minutes} | {len(r.attempts)} | {where} | {r.note} |"
        )
        if r.attempts:
            reproduce.append(
                "swarmrl up " + shlex.join(study.up_argv(r.arm, r.seed, study_dir / "runs" / r.id))
            )
    lines += section("Reproduce", "Each run is one `swarmrl up` (from the directory the study ran in):",
                     "```bash", "\n".join([*reproduce, "```"]))  # fmt: skip
    lines.append("")
    if state.nats:
        lines += [
            f"The runs shared the NATS servers {state.nats} (conf dir {state.nats_conf}), each in NATS accounts of its "
            "own (`SWARMRL_NATS` set to the run's account, plus `--nats-conf`); the commands above start an "
            "embedded server instead, which trains the same way.",
            "",
        ]
    out = study_dir / "report.md"
    out.write_text("\n".join(lines))
    return out
