"""The engine pool's choice rule: an episode keeps its engine, load spreads, a dead engine moves
only its own episodes."""

from collections import Counter

from swarmrl.services.gateway.pool import choose

URLS = ["http://a", "http://b", "http://c"]


def test_an_episode_keeps_its_engine_and_episodes_spread() -> None:
    idle = dict.fromkeys(URLS, 0)
    homes = {f"ep-{i}": choose(f"ep-{i}", idle, slack=4) for i in range(300)}
    assert all(choose(ep, idle, slack=4) == url for ep, url in homes.items())  # stable
    spread = Counter(homes.values())
    assert set(spread) == set(URLS) and min(spread.values()) > 60  # about a third each


def test_a_busy_home_gives_way_to_the_least_loaded_engine_past_the_slack() -> None:
    home = choose("ep-1", dict.fromkeys(URLS, 0), slack=2)
    loads = dict.fromkeys(URLS, 1) | {home: 3}
    assert choose("ep-1", loads, slack=2) == home  # 2 more in flight: still home
    loads[home] = 4
    assert choose("ep-1", loads, slack=2) != home


def test_an_engine_that_leaves_moves_only_its_own_episodes() -> None:
    idle = dict.fromkeys(URLS, 0)
    before = {f"ep-{i}": choose(f"ep-{i}", idle, slack=4) for i in range(300)}
    left = {u: 0 for u in URLS if u != "http://b"}
    after = {ep: choose(ep, left, slack=4) for ep in before}
    assert all(after[ep] == url for ep, url in before.items() if url != "http://b")
