"""The findings section says what the numbers allow, no more."""

from __future__ import annotations

import pytest

from swarmrl.research.report import findings, min_permutation_p, verdict
from swarmrl.research.stats import ArmStats, summarize


def test_the_permutation_floor() -> None:
    assert min_permutation_p(2, 2) == pytest.approx(1 / 3)
    assert min_permutation_p(3, 3) == pytest.approx(0.1)
    assert min_permutation_p(4, 4) == pytest.approx(2 / 70)
    assert min_permutation_p(2, 3) == pytest.approx(1 / 10)


def arm(diff_ci: tuple[float, float], p: float) -> ArmStats:
    return ArmStats("x", 5, 0.5, (0.4, 0.6), diff=sum(diff_ci) / 2, diff_ci=diff_ci, p_perm=p)


def test_verdicts() -> None:
    assert verdict(arm((0.1, 0.2), 0.01), "max") == "better"
    assert verdict(arm((0.1, 0.2), 0.01), "min") == "worse"
    assert verdict(arm((0.1, 0.2), 0.3), "max") == "hint better"
    assert verdict(arm((-0.2, -0.1), 0.3), "max") == "hint worse"
    assert verdict(arm((-0.1, 0.2), 0.01), "max") == "no difference"
    assert verdict(ArmStats("b", 2, 0.5, (0.4, 0.6)), "max") == "no comparison"


def test_findings_read_the_numbers() -> None:
    stats = summarize({"base": [0.4, 0.5], "hi": [0.6, 0.8], "same": [0.3, 0.6]}, "base")
    lines = findings(stats, "base", "success", "max", stopped={"lo": "after 1 seed(s)"}, missing={"hi": 1})
    text = "\n".join(lines)
    assert "Best mean success: `hi` with 0.700 (95% CI [0.600, 0.800], 2 seed(s))." in text
    assert (
        "`hi` looks better than the baseline, not significantly: +0.250 vs the baseline (95% CI [+0.100, +0.400]"
        in text
    )
    assert "permutation test cannot go below p = 0.333" in text
    assert "`same`: no difference from the baseline detected" in text
    assert "`lo` was stopped early (after 1 seed(s))" in text
    assert "`hi`: 1 run(s) gave no metric" in text
    assert "4 seeds per arm can" in text


def test_a_clear_difference_is_called_one() -> None:
    stats = summarize({"base": [0.1, 0.12, 0.11, 0.13], "hi": [0.8, 0.82, 0.81, 0.83]}, "base")
    text = "\n".join(findings(stats, "base", "success", "max"))
    assert "`hi` is better than the baseline: +0.700" in text and "permutation p 0.029" in text
    assert "no difference can reach" not in text
    assert findings([], "base", "m", "max") == ["- No run has a metric yet: nothing to compare."]
