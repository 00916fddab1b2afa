"""Per-agent limits (`services/gateway/limits.py`) on a hand-driven clock."""

import pytest

from swarmrl.services.gateway.limits import AgentLimits, OpenEpisode


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


def test_calls_another_gateway_served_come_out_of_this_bucket_down_to_one_burst_of_debt() -> None:
    lim = AgentLimits(rate=2.0, burst=3)
    assert lim.call("a", 0.0) == 0.0 and lim.call("b", 0.0) == 0.0
    assert lim.take_served() == {"a": 1, "b": 1} and lim.take_served() == {}
    lim.spent("a", 2, 0.0)  # the other gateways served two: none left here
    assert lim.call("a", 0.0) == pytest.approx(0.5)
    lim.spent("a", 10, 0.0)  # more than a burst at once: the debt stops at one burst
    assert lim.call("a", 0.0) == pytest.approx(2.0)  # (1 - -3) / 2
    assert lim.take_served() == {}  # refused calls are not served ones
    AgentLimits().spent("a", 5, 0.0)  # no rate: nothing to take from


def test_no_rate_means_no_bound_and_the_default_burst_is_the_rate() -> None:
    assert all(AgentLimits().call("a", 0.0) == 0.0 for _ in range(1000))
    lim = AgentLimits(rate=0.5)
    assert lim.call("a", 0.0) == 0.0 and lim.call("a", 0.0) == pytest.approx(2.0)


def test_episodes_past_the_bound_wait_until_one_ends_or_goes_idle() -> None:
    lim = AgentLimits(max_episodes=2, idle_s=60.0, retry_after_s=1.5)
    assert AgentLimits().free_slots("a", "e1", 0.0) is None  # no bound
    for ep in ("e1", "e2"):
        slot = lim.free_slots("a", ep, 0.0)[0]
        lim.opened(OpenEpisode("a", ep, slot, revision=1, written=0.0, seen=0.0))
    assert lim.free_slots("a", "e3", 1.0) == []  # it waits
    assert lim.free_slots("a", "e1", 1.0) is None  # an open one asks again (a second agent's token)
    assert lim.free_slots("b", "f1", 1.0) == [0, 1]  # the bound is per identity
    lim.closed("a", "e1")
    assert lim.free_slots("a", "e3", 2.0) == [0]  # e1's slot
    lim.opened(OpenEpisode("a", "e3", 0, revision=5, written=2.0, seen=2.0))
    lim.seen("a", "e3", 50.0)  # e3 is alive; e2 had no call since 0
    assert [e.episode_id for e in lim.idle(61.0)] == ["e2"]
    assert lim.free_slots("a", "e4", 61.0) == [1] and lim.holder("a", 1).episode_id == "e2"  # stale, to free
    assert lim.refused_episodes == 1


def test_a_slot_written_by_another_gateway_replaces_and_keeps_what_was_seen_here() -> None:
    lim = AgentLimits(max_episodes=1, idle_s=10.0)
    lim.opened(OpenEpisode("a", "e1", 0, revision=1, written=0.0))
    lim.seen("a", "e1", 4.0)  # a call here
    assert [e.episode_id for e in lim.due(4.0, every_s=2.5)] == ["e1"]  # to write again
    lim.opened(OpenEpisode("a", "e1", 0, revision=2, written=5.0))  # a refresh through the watch
    assert lim.find("a", "e1").seen == 4.0 and lim.due(6.0, every_s=2.5) == []
    lim.opened(OpenEpisode("a", "e2", 0, revision=3, written=20.0))  # the slot went to another episode
    assert lim.find("a", "e1") is None and lim.open_count("a") == 1
