"""Task mixing's pure core on hand-made request sequences."""

import random

import pytest

from swarmrl.services.gateway.mixing import TaskMixer, parse_weights


def test_parse_weights_and_errors() -> None:
    assert parse_weights(["calculator=0.7", "guess_number=0.3"]) == {"calculator": 0.7, "guess_number": 0.3}
    for bad in (["calculator"], ["=1"], ["a=x"], ["a=0"], ["a=-1"], ["a=nan"], ["a=1", "a=2"]):
        with pytest.raises(ValueError, match="a|calculator"):
            parse_weights(bad)


def test_unknown_task_is_refused_naming_the_known_tasks() -> None:
    mixer = TaskMixer({"calculator": 0.7, "guess_number": 0.3})
    with pytest.raises(ValueError, match=r"'chess'.*\['calculator', 'guess_number'\]"):
        mixer.check("chess")
    with pytest.raises(ValueError, match="no task"):
        mixer.admit("", 0.0)


def test_two_always_asking_tasks_converge_to_their_weights() -> None:
    rng = random.Random(0)
    mixer = TaskMixer({"calculator": 0.7, "guess_number": 0.3})
    # 1000 new-group requests in random order, equally often from each task: the asking rate does
    # not follow the weights, the admitted groups do.
    for i in range(1000):
        mixer.admit(rng.choice(["calculator", "guess_number"]), now=i * 0.01)
    total = sum(mixer.admitted.values())
    assert total > 600
    assert mixer.admitted["calculator"] / total == pytest.approx(0.7, abs=0.02)
    # calculator, asking 50% of the time, is under its share: only guess_number ever waits.
    assert mixer.held["calculator"] == 0 and mixer.held["guess_number"] > 0


def test_three_tasks_and_a_greedy_one() -> None:
    mixer = TaskMixer({"a": 2, "b": 1, "c": 1}, slack=1)
    # a asks 5x as often as b and c.
    for i in range(1200):
        mixer.admit(["a", "a", "a", "a", "a", "b", "c"][i % 7], now=i * 0.01)
    total = sum(mixer.admitted.values())
    assert mixer.admitted["a"] / total == pytest.approx(0.5, abs=0.02)
    assert mixer.admitted["b"] / total == pytest.approx(0.25, abs=0.02)


def test_a_task_that_stops_asking_does_not_block_the_other() -> None:
    mixer = TaskMixer({"calculator": 0.5, "guess_number": 0.5}, slack=0, window_s=10)
    t = 0.0
    for _ in range(20):  # both alive, in step
        assert mixer.admit("calculator", t) and mixer.admit("guess_number", t)
        t += 0.1
    # guess_number's clients die: calculator may run a group or two ahead, then waits ...
    admitted = [mixer.admit("calculator", t + k * 0.5) for k in range(10)]
    assert 1 <= sum(admitted) <= 2 and not any(admitted[2:])
    # ... only until guess_number has been silent for the window.
    assert mixer.admit("calculator", t + 10.5)
    assert all(mixer.admit("calculator", t + 11 + k) for k in range(50))


def test_a_returning_task_starts_level_instead_of_owed_a_burst() -> None:
    mixer = TaskMixer({"a": 0.5, "b": 0.5}, slack=0, window_s=5)
    for k in range(100):  # only a runs for a long while
        assert mixer.admit("a", k)
    # b comes (back): the two alternate at once; a is not held back for 100 groups.
    now = 200.0
    order = []
    for k in range(20):
        for task in ("a", "b"):
            if mixer.admit(task, now + k * 0.1):
                order.append(task)
    assert order.count("a") >= 9 and order.count("b") >= 9


def test_slack_lets_a_task_run_ahead_by_that_many_groups() -> None:
    def run_ahead(slack: float) -> int:
        mixer = TaskMixer({"a": 0.5, "b": 0.5}, slack=slack)
        assert mixer.admit("b", 0.0)  # b is active, with one group
        n = 0
        while mixer.admit("a", 0.1):  # b's clients are busy: a keeps asking
            n += 1
        return n

    # a joins level with b (charged 1); after n more groups it is n/2 past its share, and it is
    # held once that exceeds the slack: n = 2 * slack + 1 groups get in.
    assert [run_ahead(s) for s in (0, 1, 2, 5)] == [1, 3, 5, 11]


def test_a_single_weighted_task_is_never_held() -> None:
    mixer = TaskMixer({"calculator": 1.0}, slack=0)
    assert all(mixer.admit("calculator", k * 0.01) for k in range(100))


def test_seen_keeps_a_task_active_without_charging_it() -> None:
    mixer = TaskMixer({"a": 0.5, "b": 0.5}, slack=0, window_s=1)
    assert mixer.admit("b", 0.0)
    assert mixer.admit("a", 0.0)  # a joins level with b, then gets one group
    # b's admitted group keeps asking (its other episodes): a stays held past the window.
    for k in range(1, 30):
        mixer.seen("b", k * 0.5)
        assert not mixer.admit("a", k * 0.5)
    assert mixer.admitted == {"a": 1, "b": 1}
