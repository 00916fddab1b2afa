"""Metric records -> tracker rows: the tags, each family's x-axis, and running counts that a restart
continues (`TrackState`)."""

from __future__ import annotations

from pathlib import Path

from swarmrl.schemas import ActionResult, EvalResult, MergeStats, SampleDrops
from swarmrl.services.tracker.rows import ACTION_AXIS, MERGE_AXIS, RowMaker, tag
from swarmrl.services.tracker.state import TrackState
from tests.unit.ledger.factories import train_step


def test_a_train_step_is_plotted_by_trainer_step_with_its_extras_and_drops() -> None:
    step = train_step(step=7, loss=0.5, policy_version=7, extra={"reward_mean.calculator": 0.25},
                      dropped={"a": "stale", "b": "stale", "c": "zero_adv"}, ts=100.0)  # fmt: skip
    rows = RowMaker().rows(step)
    assert [(r.axis, r.step, r.ts) for r in rows] == [("train/policy/step", 7, 100.0)] * 2
    values = rows[0].values
    assert values["train/policy/loss"] == 0.5 and values["train/policy/policy_version"] == 7.0
    assert values["train/policy/reward_mean.calculator"] == 0.25
    assert rows[1].values == {"train/policy/dropped/stale": 2.0, "train/policy/dropped/zero_adv": 1.0}


def test_drops_between_steps_join_the_train_steps_dropped_tags() -> None:
    drops = SampleDrops(model="m1", step=3, dropped={"x": "timed_out"})
    (row,) = RowMaker().rows(drops)
    assert (row.axis, row.step, row.values) == ("train/m1/step", 3, {"train/m1/dropped/timed_out": 1.0})


def test_an_eval_is_plotted_by_policy_version_per_task_and_metric() -> None:
    result = EvalResult(model="caller", step=40, task="team_calculator", success_rate=0.75, n=64,
                        metric="caller_valid")  # fmt: skip
    (row,) = RowMaker().rows(result)
    assert (row.axis, row.step) == ("eval/caller/version", 40)
    assert row.values == {
        "eval/caller/team_calculator/caller_valid": 0.75,
        "eval/caller/team_calculator/caller_valid_n": 64.0,
    }


def test_merges_and_actions_count_themselves_and_their_statuses() -> None:
    maker = RowMaker()
    merges = [MergeStats(episode_id=f"e{i}", status=s, tokens_before=10 * i, tokens_after=i)
              for i, s in enumerate(["merged", "aborted", "merged"])]  # fmt: skip
    rows = [row for m in merges for row in maker.rows(m)]
    assert [(r.axis, r.step) for r in rows] == [(MERGE_AXIS, 1), (MERGE_AXIS, 2), (MERGE_AXIS, 3)]
    assert [r.values.get("merge/merged") for r in rows] == [1.0, None, 2.0]
    assert rows[1].values["merge/aborted"] == 1.0 and rows[2].values["merge/tokens_before"] == 20.0

    action = ActionResult(action_id="a", episode_id="e", kind="python", status="ok", act_s=0.5, units=3)
    (row,) = maker.rows(action)
    assert (row.axis, row.step) == (ACTION_AXIS, 1)
    assert row.values == {"action/python/act_s": 0.5, "action/python/queued_s": 0.0,
                          "action/python/run_s": 0.0, "action/python/units": 3.0, "action/python/ok": 1.0}  # fmt: skip


def test_a_restart_continues_the_counts_it_saved(tmp_path: Path) -> None:
    maker = RowMaker()
    maker.rows(MergeStats(episode_id="e1", status="merged"))
    state = TrackState(seq=41, counts=maker.counts, run_ids={"wandb": "abc"})
    state.save(tmp_path / "state.json")

    again = TrackState.load(tmp_path / "state.json")
    assert (again.seq, again.run_ids) == (41, {"wandb": "abc"})
    (row,) = RowMaker(counts=again.counts).rows(MergeStats(episode_id="e2", status="merged"))
    assert (row.step, row.values["merge/merged"]) == (2, 2.0)
    assert TrackState.load(tmp_path / "none.json") == TrackState()


def test_a_tag_keeps_only_what_every_tracker_accepts() -> None:
    assert tag("eval", "policy", "my task:v2!") == "eval/policy/my task_v2_"
    assert tag("train", "m-1", "distinct.calc_x") == "train/m-1/distinct.calc_x"
