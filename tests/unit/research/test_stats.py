"""Study statistics against values computed by hand (the exact bootstrap enumerates every resample)."""

from __future__ import annotations

import math

import pytest

from swarmrl.research import stats


def test_two_seeds_bootstrap_ci_is_their_range() -> None:
    # resamples of (a, b): means a, (a+b)/2, b with probabilities 1/4, 1/2, 1/4
    dist = dict(stats.bootstrap_means([0.2, 0.8]))
    assert dist == pytest.approx({0.2: 0.25, 0.5: 0.5, 0.8: 0.25})
    assert stats.bootstrap_ci([0.8, 0.2]) == pytest.approx((0.2, 0.8))


def test_three_seeds_bootstrap_distribution_and_cis() -> None:
    # 27 resamples of (1, 2, 3); their sums 3..9 occur 1, 3, 6, 7, 6, 3, 1 times
    dist: dict[float, float] = {}
    for m, p in stats.bootstrap_means([1.0, 2.0, 3.0]):
        dist[round(m, 9)] = dist.get(round(m, 9), 0) + p
    expected = {round(s / 3, 9): c / 27 for s, c in zip(range(3, 10), (1, 3, 6, 7, 6, 3, 1), strict=True)}
    assert dist == pytest.approx(expected)
    # 95%: P(mean <= 1) = 1/27 >= 0.025; P(mean <= 8/3) = 26/27 < 0.975, so the upper end is 3
    assert stats.bootstrap_ci([1, 2, 3]) == pytest.approx((1.0, 3.0))
    # 90%: P(<= 1) = 1/27 < 0.05 -> 4/3 (4/27); P(<= 7/3) = 20/27 < 0.95 <= P(<= 8/3) = 26/27
    assert stats.bootstrap_ci([1, 2, 3], level=0.90) == pytest.approx((4 / 3, 8 / 3))


def test_difference_ci_convolves_both_bootstraps() -> None:
    # [1, 3] - [0, 2]: differences -1..3 with probabilities 1, 4, 6, 4, 1 (/16)
    assert stats.bootstrap_diff_ci([1, 3], [0, 2]) == pytest.approx((-1.0, 3.0))
    # 80%: P(<= -1) = 1/16 < 0.1 <= P(<= 0) = 5/16; P(<= 1) = 11/16 < 0.9 <= P(<= 2) = 15/16
    assert stats.bootstrap_diff_ci([1, 3], [0, 2], level=0.80) == pytest.approx((0.0, 2.0))
    assert stats.bootstrap_diff_ci([1, 2], [0, 0]) == pytest.approx((1.0, 2.0))


def test_exact_permutation_test() -> None:
    # {1,2} | {3,4}: 6 relabelings, |diff| = 2 only for the observed one and its mirror
    assert stats.permutation_p([1, 2], [3, 4]) == pytest.approx(2 / 6)
    assert stats.permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    # [1, 5] vs [2, 3]: observed 0.5 is the smallest |diff| of all 6 relabelings
    assert stats.permutation_p([1, 5], [2, 3]) == 1.0
    assert stats.permutation_p([0.0, 0.0], [0.0, 0.0]) == 1.0


def test_student_t_and_welch() -> None:
    assert stats.student_t_p(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| > 1) = 1/2
    assert stats.student_t_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6))  # df 2: 1 - t / sqrt(2 + t^2)
    assert stats.betainc(2.0, 1.0, 0.3) == pytest.approx(0.09)  # I_x(a, 1) = x^a
    # [1,2,3] vs [4,6,8]: variances 1 and 4, se^2 = 5/3, t = -4 / sqrt(5/3), df = (5/3)^2 / (17/18) = 50/17
    w = stats.welch([1, 2, 3], [4, 6, 8])
    assert w is not None
    assert w.t == pytest.approx(-4 / math.sqrt(5 / 3)) and w.df == pytest.approx(50 / 17)
    assert w.p == pytest.approx(0.0547868, abs=1e-6)  # scipy.stats.ttest_ind(..., equal_var=False)
    assert stats.welch([1.0], [2.0, 3.0]) is None and stats.welch([1, 1], [2, 2]) is None


def test_quantile_is_the_inverted_cdf() -> None:
    dist = [(1.0, 0.5), (2.0, 0.5)]
    assert stats.quantile(dist, 0.5) == 1.0 and stats.quantile(dist, 0.51) == 2.0


def test_summarize_compares_every_arm_with_the_baseline() -> None:
    out = stats.summarize({"base": [0.4, 0.5], "hi": [0.6, 0.8], "none": []}, "base")
    assert [s.arm for s in out] == ["base", "hi"]
    base, hi = out
    assert base.diff is None and base.mean == pytest.approx(0.45) and base.ci == pytest.approx((0.4, 0.5))
    assert hi.diff == pytest.approx(0.25) and hi.diff_ci == pytest.approx((0.1, 0.4))
    assert hi.p_perm == pytest.approx(1 / 3) and hi.welch is not None


def test_many_seeds_fall_back_to_seeded_sampling() -> None:
    xs = [float(i) for i in range(12)]  # C(23, 12) multisets: too many to enumerate
    lo, hi = stats.bootstrap_ci(xs)
    assert lo == stats.bootstrap_ci(xs)[0] and 3.0 < lo < 5.5 < hi < 8.0
    assert stats.permutation_p(xs, [x + 100 for x in xs]) < 0.001
