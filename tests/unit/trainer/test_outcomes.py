"""What the trainer tells a group's owner (`services/trainer/ready.py`, pure): one outcome per
group and owner, the same message id for the same group (a replay is stored once), and one warning
per client once most of its groups are dropped."""

from __future__ import annotations

from swarmrl.schemas import subjects as S
from swarmrl.services.trainer.grouping import Held
from swarmrl.services.trainer.ready import WARN_AFTER_GROUPS, Outcomes
from tests.unit.trainer.samples import make_sample


def held(group: str, rewards: list[float], owner: str = "byo", client: str = "byo") -> list[Held]:
    return [
        Held(
            make_sample(f"{owner}_{group}{i}", r, group=group, task="mine").model_copy(
                update={"client_id": client}
            ),
            i,
            0.0,
        )
        for i, r in enumerate(rewards)
    ]


def test_each_group_gets_one_outcome_per_owner_on_the_owners_subject() -> None:
    out = Outcomes("tiny")
    out.trained("g1", held("g1", [1.0, 0.0]), step=3)
    out.dropped("g2", held("g2", [1.0, 1.0]) + held("g2", [1.0], owner="other"), "zero_adv", step=3)
    out.dropped("g3", [], "timeout", step=3)  # nothing held: nobody to tell
    (s1, trained, id1), (s2, mine, _), (s3, theirs, _) = out.take()
    assert (s1, trained.outcome, trained.step, trained.reward_std, trained.episodes) == (
        S.outcome_subject("byo", "tiny"), "trained", 3, 0.5, 2,
    )  # fmt: skip
    assert (s2, mine.reason, mine.episodes, mine.task) == (
        S.outcome_subject("byo", "tiny"),
        "zero_adv",
        2,
        "mine",
    )
    assert (s3, theirs.owner, theirs.episodes) == (S.outcome_subject("other", "tiny"), "other", 1)
    assert out.take() == []
    again = Outcomes("tiny")
    again.trained("g1", held("g1", [1.0, 0.0]), step=3)
    assert again.take()[0][2] == id1  # the same group decided again (a restarted trainer): one message


def test_a_client_most_of_whose_groups_are_dropped_is_warned_once_with_the_reason() -> None:
    out = Outcomes("tiny")
    out.trained("t", held("t", [1.0, 0.0]), step=1)
    for i in range(WARN_AFTER_GROUPS - 2):
        out.dropped(f"d{i}", held(f"d{i}", [0.0, 0.0]), "zero_adv", step=1)
    assert out.warnings() == []  # not enough groups yet to judge
    out.dropped("x", held("x", [0.0, 0.0]), "timeout", step=1)
    (warning,) = out.warnings()
    assert warning.startswith(f"{WARN_AFTER_GROUPS - 1} of the {WARN_AFTER_GROUPS} groups of client 'byo'")
    assert f"{WARN_AFTER_GROUPS - 2} of them zero_adv: all its rewards were equal" in warning
    out.dropped("y", held("y", [0.0, 0.0]), "zero_adv", step=1)
    assert out.warnings() == []  # once per client
    print("trainer log:", warning)
