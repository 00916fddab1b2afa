"""Distinct task instances per window of groups, and the warning when they narrow."""

from __future__ import annotations

from swarmrl.services.trainer.guard import Diversity


def test_shares_count_distinct_instances_among_each_tasks_last_groups() -> None:
    d = Diversity(window=4)
    for instance in ("a", "b", "a"):
        assert d.observe("calculator", instance) is None
    d.observe("guess_number", "x")
    assert d.shares() == {"calculator": 2 / 3, "guess_number": 1.0}
    d.observe("calculator", "c")
    d.observe("calculator", "d")  # the window slides: b a c d
    assert d.shares()["calculator"] == 1.0


def test_a_narrowing_stream_warns_once_per_fall() -> None:
    """Fresh instances, then a client replaying three questions: one warning when the share falls
    below half its best, none while it stays down, one again after a recovery and a second fall."""
    d = Diversity(window=8, warn_below=0.5)
    warnings = [d.observe("calculator", f"q{i}") for i in range(8)]
    replay = [d.observe("calculator", f"q{i % 3}") for i in range(12)]
    assert not any(warnings)
    fired = [w for w in replay if w]
    assert len(fired) == 1 and "calculator" in fired[0] and "3 distinct" in fired[0]
    recovered = [d.observe("calculator", f"new{i}") for i in range(8)]
    again = [d.observe("calculator", "q0") for _ in range(8)]
    assert not any(recovered) and sum(bool(w) for w in again) == 1


def test_a_task_with_few_instances_does_not_warn_at_its_own_level() -> None:
    d = Diversity(window=8)
    assert not any(d.observe("guess_number", f"secret{i % 2}") for i in range(100))
