"""Statistics of a study (pure: numbers in, numbers out).

Per arm: the mean of the metric over seeds with a percentile-bootstrap 95% CI; per arm against the
baseline: the difference of means with a two-sample bootstrap CI, an exact permutation test and
Welch's t-test. Studies have few seeds, so the bootstrap is *exact* where it is small enough: every
resample is enumerated with its multinomial probability instead of drawn, which makes the numbers
deterministic and checkable by hand (2 seeds a < b give the 95% CI [a, b]). Quantiles of a discrete
distribution are the inverted CDF: the smallest value v with P(X <= v) >= q.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

EXACT_LIMIT = 200_000
"""Most resamples (or relabelings) enumerated exactly; beyond it they are drawn at random."""
_EPS = 1e-12


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _multisets(n: int) -> int:
    return math.comb(2 * n - 1, n)


def bootstrap_means(xs: Sequence[float], resamples: int = 20_000, seed: int = 0) -> list[tuple[float, float]]:
    """The bootstrap distribution of the mean of `xs`: (mean of a resample, probability) pairs."""
    n = len(xs)
    if _multisets(n) <= EXACT_LIMIT:
        out = []
        for combo in itertools.combinations_with_replacement(range(n), n):
            counts = Counter(combo).values()
            ways = math.factorial(n) // math.prod(math.factorial(c) for c in counts)
            out.append((math.fsum(xs[i] for i in combo) / n, ways / n**n))
        return out
    draws = _drawn_means(np.random.default_rng(seed), xs, resamples)
    return [(float(d), 1.0 / resamples) for d in draws]


def _drawn_means(rng: np.random.Generator, xs: Sequence[float], resamples: int) -> np.ndarray:
    return rng.choice(np.asarray(xs, dtype=float), size=(resamples, len(xs))).mean(axis=1)


def quantile(dist: Sequence[tuple[float, float]], q: float) -> float:
    """Inverted-CDF quantile of a discrete distribution given as (value, probability) pairs."""
    acc = 0.0
    ordered = sorted(dist)
    for value, p in ordered:
        acc += p
        if acc >= q - _EPS:
            return value
    return ordered[-1][0]


def _ci(dist: Sequence[tuple[float, float]], level: float) -> tuple[float, float]:
    alpha = (1 - level) / 2
    return quantile(dist, alpha), quantile(dist, 1 - alpha)


def bootstrap_ci(xs: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap CI of the mean of `xs` (one value: that value, twice)."""
    return _ci(bootstrap_means(xs, seed=seed), level)


def bootstrap_diff_ci(
    xs: Sequence[float], ys: Sequence[float], level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap CI of mean(xs) - mean(ys), each sample resampled on its own."""
    if _multisets(len(xs)) * _multisets(len(ys)) <= EXACT_LIMIT:
        dx, dy = bootstrap_means(xs), bootstrap_means(ys)
        dist = [(a - b, p * q) for a, p in dx for b, q in dy]
    else:
        rng, n = np.random.default_rng(seed), 20_000
        dist = [(float(d), 1.0 / n) for d in _drawn_means(rng, xs, n) - _drawn_means(rng, ys, n)]
    return _ci(dist, level)


def permutation_p(xs: Sequence[float], ys: Sequence[float], resamples: int = 20_000, seed: int = 0) -> float:
    """Two-sided permutation test of equal means: the share of relabelings of the pooled values whose
    |difference of means| is at least the observed one (all of them when there are few)."""
    pooled = [*xs, *ys]
    n, total = len(xs), math.fsum(pooled)
    observed = abs(mean(xs) - mean(ys))
    tol = 1e-9 * max(1.0, observed)  # sums in another order differ in the last bits

    def diff(sum_x: float) -> float:
        return abs(sum_x / n - (total - sum_x) / len(ys))

    if math.comb(len(pooled), n) <= EXACT_LIMIT:
        hits = count = 0
        for idx in itertools.combinations(range(len(pooled)), n):
            count += 1
            hits += diff(math.fsum(pooled[i] for i in idx)) >= observed - tol
        return hits / count
    rng = np.random.default_rng(seed)
    arr = np.asarray(pooled, dtype=float)
    sums = np.array([rng.permutation(arr)[:n].sum() for _ in range(resamples)])
    hits = int(np.sum(np.abs(sums / n - (total - sums) / len(ys)) >= observed - tol))
    return (hits + 1) / (resamples + 1)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def student_t_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with `df` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


@dataclasses.dataclass(frozen=True)
class Welch:
    t: float
    df: float
    p: float


def welch(xs: Sequence[float], ys: Sequence[float]) -> Welch | None:
    """Welch's two-sided t-test of equal means; None when undefined (a sample of one, no spread)."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    vx = math.fsum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
    vy = math.fsum((y - mean(ys)) ** 2 for y in ys) / (len(ys) - 1) / len(ys)
    if vx + vy == 0:
        return None
    t = (mean(xs) - mean(ys)) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(xs) - 1) + vy**2 / (len(ys) - 1))
    return Welch(t, df, student_t_p(t, df))


@dataclasses.dataclass(frozen=True)
class ArmStats:
    """One arm's numbers; the `diff_*`, `p_*` fields compare it with the baseline (None for it)."""

    arm: str
    n: int
    mean: float
    ci: tuple[float, float]
    diff: float | None = None
    diff_ci: tuple[float, float] | None = None
    p_perm: float | None = None
    welch: Welch | None = None


def summarize(values: dict[str, list[float]], baseline: str, level: float = 0.95) -> list[ArmStats]:
    """Stats for every arm with at least one value, in the order of `values`."""
    base = values.get(baseline, [])
    out = []
    for arm, xs in values.items():
        if not xs:
            continue
        stats = ArmStats(arm, len(xs), mean(xs), bootstrap_ci(xs, level))
        if arm != baseline and base:
            stats = dataclasses.replace(
                stats, diff=mean(xs) - mean(base), diff_ci=bootstrap_diff_ci(xs, base, level),
                p_perm=permutation_p(xs, base), welch=welch(xs, base),
            )  # fmt: skip
        out.append(stats)
    return out
