"""The collapse guard's verdicts (`services/trainer/guard.py`), on reward sequences shaped like a
calculator run: rising, noisy, then falling off a cliff."""

from __future__ import annotations

from swarmrl.services.trainer.guard import RewardGuard


def feed(guard: RewardGuard, groups: list[tuple[int, float]]) -> list[int]:
    """Observe each (version, reward) of groups made by one version; the versions the guard asked to
    roll back to, in order."""
    return [t for v, r in groups if (t := guard.observe(v, v, r)) is not None]


def test_a_collapse_rolls_back_to_the_newest_version_of_the_best_window() -> None:
    guard = RewardGuard(window=4, drop=0.4)
    rising = [(v, 0.2 + 0.1 * v) for v in range(8)]  # best window: versions 4-7, mean 0.75
    assert feed(guard, rising) == [] and guard.good_version == 7
    # Groups of version 7 or older still arriving keep the window from being "newer": no verdict yet.
    assert feed(guard, [(8, 0.0), (9, 0.0), (7, 0.0)]) == []
    assert feed(guard, [(9, 0.0), (10, 0.0), (10, 0.0)]) == []  # the late version-7 group is still in it
    assert feed(guard, [(11, 0.0)]) == [7]


def test_noise_and_slow_dips_below_the_drop_do_not_roll_back() -> None:
    guard = RewardGuard(window=4, drop=0.5)
    wobbly = [(v, [0.9, 0.6, 1.0, 0.5][v % 4]) for v in range(40)]
    dip = [(40 + v, 0.45) for v in range(8)]  # 0.75 -> 0.45: a dip of 0.3, within the drop
    assert feed(guard, wobbly + dip) == []


def test_after_a_rollback_only_the_restored_policys_groups_count_and_a_new_collapse_rolls_back_again() -> (
    None
):
    guard = RewardGuard(window=2, drop=0.3)
    assert feed(guard, [(1, 0.8), (2, 0.8), (3, 0.0), (4, 0.0)]) == [2]
    guard.rolled_back(5)  # version 2's weights, served as version 5
    # Groups of the collapsed versions 3-4 still in flight are not counted; the restored ones are.
    assert feed(guard, [(4, 0.0), (3, 0.0), (5, 0.8), (6, 0.9)]) == []
    assert guard.good_version == 6
    assert feed(guard, [(7, 0.1), (8, 0.1)]) == [6]


def test_groups_begun_by_a_collapsed_version_do_not_count_after_the_rollback() -> None:
    """Multi-turn episodes span versions: a group whose first turns the collapsed policy played, and
    whose last ones the restored policy did, says nothing about the restored policy."""
    guard = RewardGuard(window=2, drop=0.3)
    assert feed(guard, [(1, 0.9), (2, 0.9), (3, 0.0), (4, 0.0)]) == [2]
    guard.rolled_back(5)
    assert guard.observe(4, 5, 0.0) is None and guard.observe(3, 6, 0.0) is None
    assert not guard.recent
    # Nor does a window that still holds a group begun by the good version or before roll back.
    assert guard.observe(5, 5, 0.9) is None and guard.observe(6, 6, 0.9) is None  # best: good = 6
    assert guard.observe(6, 7, 0.0) is None and guard.observe(7, 7, 0.0) is None
    assert guard.observe(7, 8, 0.0) == 6


def test_a_window_of_zero_never_rolls_back() -> None:
    guard = RewardGuard(window=0, drop=0.1)
    assert feed(guard, [(v, 1.0 if v < 10 else 0.0) for v in range(30)]) == []
