"""How a prefill is split into forwards: waves of rows that share uncached tokens, buckets of similar lengths."""

from __future__ import annotations

import itertools
import random

from swarmrl.services.engine.prefill_plan import FORWARD_TOKENS, buckets, waves
from swarmrl.services.engine.prefix_cache import BLOCK


def _cost(groups: list[list[int]], lengths: list[int], forward: int) -> int:
    return sum(forward + len(g) * max(lengths[i] for i in g) for g in groups)


def test_rows_wait_for_a_row_that_computes_a_block_they_share() -> None:
    system = list(range(3, 3 + 5 * BLOCK))
    group = [*system, 900, 901]
    other = [*system, 700]
    short = list(range(400, 400 + BLOCK - 1))  # no full block: shares nothing
    now, later = waves([group, group, other, group, short], [0] * 5, [None] * 5)
    assert now == [0, 4] and later == [1, 2, 3]
    # what the cache holds already is not shared: another row must add a whole block to it
    now, _ = waves([group, other], [0, len(system)], [None, None])
    assert now == [0, 1]
    now, _ = waves([group, other], [0, len(system) - BLOCK], [None, None])
    assert now == [0]
    # an adapter's KV is its own
    now, later = waves([group, group, group], [0, 0, 0], ["a", "b", "a"])
    assert now == [0, 1] and later == [2]


def test_buckets_keep_a_long_miss_away_from_short_hits() -> None:
    lengths = [250, 20, 18, 21, 20, 19, 20, 20]
    assert buckets(lengths) == [[0], [3, 1, 4, 6, 7, 5, 2]]
    assert buckets([30, 29, 28]) == [[0, 1, 2]]
    assert buckets([]) == []


def test_buckets_are_the_cheapest_split_of_the_rows_by_length() -> None:
    rng = random.Random(0)
    for _ in range(150):
        lengths = [rng.choice([1, 2, 5, 20, 30, 60, 250]) for _ in range(rng.randint(1, 5))]
        forward = rng.choice([0, FORWARD_TOKENS, 100])
        groups = buckets(lengths, forward)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        # brute force: every split of every order
        best = min(
            _cost([list(order[a:b]) for a, b in itertools.pairwise((0, *cuts, len(order)))], lengths, forward)
            for order in itertools.permutations(range(len(lengths)))
            for k in range(len(lengths))
            for cuts in itertools.combinations(range(1, len(lengths)), k)
        )
        assert _cost(groups, lengths, forward) == best, (lengths, forward, groups)
