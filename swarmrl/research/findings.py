"""The findings of a study, written from its numbers by the program (pure: stats in, sentences out).

An arm is called better or worse only when the bootstrap CI of the difference to the baseline
excludes 0 *and* the permutation test gives p < 0.05; a CI that excludes 0 with a larger p is
reported as a hint. With few seeds the smallest p-value the permutation test can reach is stated too.
"""

from __future__ import annotations

import itertools
import math

from swarmrl.research.stats import ArmStats

ALPHA = 0.05


def fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


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
    out: list[str] = []
    by_arm = {s.arm: s for s in stats}
    best = (max if goal == "max" else min)(stats, key=lambda s: s.mean)
    out.append(
        f"- Best mean {metric}: `{best.arm}` with {fmt(best.mean)} (95% CI {fmt_ci(best.ci)}, {best.n} seed(s))"
        + (" - the baseline itself." if best.arm == baseline else ".")
    )
    if baseline not in by_arm:
        out.append(f"- The baseline `{baseline}` has no metric: no arm can be compared with it.")
    for s in stats:
        if s.arm == baseline or s.diff is None:
            continue
        v = verdict(s, goal)
        welch = "Welch p " + (fmt_p(s.welch.p) if s.welch else "n/a")
        numbers = (
            f"{fmt(s.diff, True)} vs the baseline (95% CI {fmt_ci(s.diff_ci, True)}, permutation p "
            f"{fmt_p(s.p_perm)}, {welch}, {s.n} vs {by_arm[baseline].n} seeds)"
        )
        if v in ("better", "worse"):
            text = f"`{s.arm}` is {v} than the baseline: {numbers}."
        elif v.startswith("hint"):
            floor = min_permutation_p(s.n, by_arm[baseline].n)
            text = (
                f"`{s.arm}` looks {v.split()[1]} than the baseline, not significantly: {numbers}. The CI of the "
                f"difference excludes 0, but with these seeds the permutation test cannot go below p = {floor:.3f}."
            )
        else:
            text = f"`{s.arm}`: no difference from the baseline detected: {numbers}; the CI includes 0."
        out.append(f"- {text}")
    for arm, why in (stopped or {}).items():
        out.append(f"- `{arm}` was stopped early ({why}); its numbers rest on fewer seeds.")
    for arm, n in (missing or {}).items():
        if n:
            out.append(f"- `{arm}`: {n} run(s) gave no metric (failed, skipped or empty) and are left out.")
    base = by_arm.get(baseline)
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
