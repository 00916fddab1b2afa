"""`bench/peers.py` alternates which system goes first, starting from `--first`."""

import pytest
from peers import round_order


@pytest.mark.parametrize("first", ["swarmrl", "TRL"])
def test_rounds_alternate_from_the_first(first: str) -> None:
    other = "TRL" if first == "swarmrl" else "swarmrl"
    assert [round_order(r, first) for r in (1, 2, 3, 4)] == [
        [first, other],
        [other, first],
        [first, other],
        [other, first],
    ]
