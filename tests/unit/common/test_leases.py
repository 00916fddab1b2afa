"""The pure core of partition leases: each replica aims at its fair share and no partition is wanted twice."""

from __future__ import annotations

import random

from swarmrl.services.common.leases import fair_share, plan


def test_a_lone_replica_takes_every_free_partition() -> None:
    want, give_back = plan(16, held=set(), taken=set(), members=1)
    assert sorted(want) == list(range(16)) and give_back == []


def test_a_replica_joining_makes_the_holder_give_back_down_to_its_share() -> None:
    held = set(range(16))
    want, give_back = plan(16, held=held, taken=held, members=2)
    assert want == [] and len(give_back) == 8 and set(give_back) <= held
    # the newcomer wants only free partitions, none while the holder still holds them
    assert plan(16, held=set(), taken=held, members=2) == ([], [])
    assert sorted(plan(16, held=set(), taken=held - set(give_back), members=2)[0]) == sorted(give_back)


def test_replicas_taking_turns_end_with_every_partition_held_once() -> None:
    rng = random.Random(0)
    held: dict[str, set[int]] = {r: set() for r in ("a", "b", "c")}
    for _ in range(20):  # rounds of ticks in random order, creates granted first come first served
        for r in rng.sample(sorted(held), 3):
            taken = set().union(*held.values())
            want, give_back = plan(16, held[r], taken, members=3)
            held[r] -= set(give_back)
            held[r] |= {p for p in want if p not in set().union(*held.values())}
    sizes = sorted(len(h) for h in held.values())
    assert sum(sizes) == 16 and sizes[-1] <= fair_share(16, 3) == 6
    assert len(set().union(*held.values())) == 16
