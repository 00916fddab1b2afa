"""`bench/peers.py` alternates which system goes first, starting from `--first`."""

import pytest
from peers import join, round_order


@pytest.mark.parametrize("first", ["swarmrl", "TRL"])
def test_rounds_alternate_from_the_first(first: str) -> None:
    other = "TRL" if first == "swarmrl" else "swarmrl"
    assert [round_order(r, first) for r in (1, 2, 3, 4)] == [
        [first, other],
        [other, first],
        [first, other],
        [other, first],
    ]


def _report(first: str, trl_best: float, minutes: float = 20.0) -> dict:
    """A one-round report as `bench/peers.py` writes it: the two runs, `first` going first."""

    def run(system: str, best: float) -> dict:
        points = [{"t": 0.0, "version": 0, "success": 0.4}, {"t": 600.0, "version": 50, "success": best}]
        return {"system": system, "round": 1, "first": system == first, "points": points, "steps": 50,
                "completions": 1600, "trained_samples": 1600, "trained_tokens": 10**5,
                "generated_tokens": 10**4, "train_s": 600.0, "wall_s": 601.0}  # fmt: skip

    return {
        "argv": ["--first", first], "machine": {"date": "2026-11-29T08:00:00", "load_average": [0.1]},
        "wall_s": 2700.0, "trl_version": "1.16.0", "minutes": minutes, "batch": 32, "min_batch_groups": 1,
        "eval_every": 60.0, "runs": [run("swarmrl", 0.99), run("TRL", trl_best)],
    }  # fmt: skip


def test_join_numbers_the_rounds_of_separate_reports_and_refuses_other_settings() -> None:
    """Rounds run as separate invocations join into one report: round 2 is the second report's round 1,
    its summary compares each round's TRL with that round's swarmrl; reports with other budgets are
    refused rather than mixed."""
    joined = join([_report("swarmrl", 0.9), _report("TRL", 0.8)], ["--join", "a", "b"])
    assert [(x["round"], x["system"], x["first"]) for x in joined["runs"]] == [
        (1, "swarmrl", True), (1, "TRL", False), (2, "swarmrl", False), (2, "TRL", True),
    ]  # fmt: skip
    assert [r["trl_best"] for r in joined["summary"]["rounds"]] == [0.9, 0.8]
    assert joined["wall_s"] == 5400.0 and [j["argv"] for j in joined["joined"]] == [
        ["--first", "swarmrl"],
        ["--first", "TRL"],
    ]
    with pytest.raises(SystemExit, match="differ in minutes"):
        join([_report("swarmrl", 0.9), _report("TRL", 0.8, minutes=10.0)], [])
