"""Per-agent limits (`services/gateway/limits.py`) on a hand-driven clock."""

import pytest

from swarmrl.services.gateway.limits import AgentLimits


def test_calls_past_the_burst_wait_for_the_bucket_to_refill() -> None:
    lim = AgentLimits(rate=2.0, burst=3)
    assert [lim.call("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.call("a", 0.0) == pytest.approx(0.5)  # one call per 0.5 s
    assert lim.call("a", 0.25) == pytest.approx(0.25)  # half a token back
    assert lim.call("a", 0.5) == 0.0
    assert lim.call("b", 0.5) == 0.0  # another identity has its own bucket
    assert lim.call("a", 100.0) == 0.0 and lim.call("a", 100.0) == 0.0 and lim.call("a", 100.0) == 0.0
    assert lim.call("a", 100.0) > 0  # a long pause refills to the burst, never past it
    assert lim.refused_calls == 3


def test_no_rate_means_no_bound_and_the_default_burst_is_the_rate() -> None:
    assert all(AgentLimits().call("a", 0.0) == 0.0 for _ in range(1000))
    lim = AgentLimits(rate=0.5)
    assert lim.call("a", 0.0) == 0.0 and lim.call("a", 0.0) == pytest.approx(2.0)


def test_episodes_past_the_bound_wait_until_one_ends_or_goes_idle() -> None:
    lim = AgentLimits(max_episodes=2, idle_s=60.0, retry_after_s=1.5)
    for ep in ("e1", "e2"):
        assert lim.check_episode("a", ep, 0.0) == 0.0
        lim.open_episode("a", ep, 0.0)
    assert lim.check_episode("a", "e3", 1.0) == 1.5
    assert lim.check_episode("a", "e1", 1.0) == 0.0  # an open one asks again (a second agent's token)
    assert lim.check_episode("b", "f1", 1.0) == 0.0  # the bound is per identity
    lim.close_episode("a", "e1")
    assert lim.check_episode("a", "e3", 2.0) == 0.0
    lim.open_episode("a", "e3", 2.0)
    lim.seen("a", "e3", 50.0)  # e3 is alive; e2 had no call since 0
    assert lim.check_episode("a", "e4", 61.0) == 0.0 and lim.open_count("a") == 1
    assert lim.refused_episodes == 1
