"""The evaluator: when it evaluates, and its warning when held-out success and the train reward diverge."""

from __future__ import annotations

from swarmrl.agents.evaluate import Divergence
from tests.unit.ledger.factories import train_step


def feed(d: Divergence, rewards: dict[int, float]) -> None:
    for step, reward in rewards.items():
        d.reward(train_step(step=step, reward_mean=reward))


def test_held_out_falling_while_train_reward_holds_warns_once() -> None:
    d = Divergence("calculator")
    feed(d, {s: 0.5 + 0.01 * s for s in range(1, 31)})
    assert d.check(0, 0.40) is None and d.check(10, 0.70) is None and d.check(30, 0.90) is None
    feed(d, {s: 0.85 for s in range(31, 61)})  # the model scores on what it trains on
    assert d.check(40, 0.86) is None  # within 10 points of the best
    warning = d.check(50, 0.60)
    assert warning and "60%" in warning and "best 90% (v30)" in warning
    assert d.check(60, 0.34) is None  # said once
    assert d.check(70, 0.95) is None and not d.warned  # a new best re-arms it


def test_both_falling_is_a_worse_policy_not_a_divergence() -> None:
    d = Divergence("calculator")
    feed(d, {s: 0.8 for s in range(1, 11)})
    d.check(10, 0.9)
    feed(d, {s: 0.3 for s in range(11, 21)})
    assert d.check(20, 0.5) is None


def test_a_tasks_own_reward_is_used_in_a_cocktail() -> None:
    d = Divergence("calculator")
    for s in range(1, 11):
        d.reward(train_step(step=s, reward_mean=0.9, extra={"reward_mean.calculator": 0.2}))
    assert d.rewards[-1] == (10, 0.2)


def test_evaluations_are_every_n_versions_and_take_the_newest_when_behind() -> None:
    from swarmrl.agents.evaluate import due

    assert due(0, None, 10) and due(7, None, 10)  # the first version seen
    assert not due(9, 0, 10) and due(10, 0, 10)
    assert due(23, 10, 10)  # an evaluation took 13 versions: the newest is next, not v20
    assert not due(23, 23, 10) and not due(22, 23, 10)
    assert due(296, 295, 1)  # the final evaluation (every=1): any version not yet evaluated
