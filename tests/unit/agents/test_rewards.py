"""A group's episodes share one reward call (`agents/tasks/rewards.py`): it waits for each episode's
reply or failure, then calls the function once; what fails fails only the episodes it must."""

from __future__ import annotations

import asyncio
import math

import pytest

from swarmrl.agents.tasks import rewards
from swarmrl.agents.tasks.rewards import RewardError, Scorer

CALLS: list[list[str]] = []


async def judge(prompts: list[str], completions: list[str], **kwargs: list[object]) -> list[float]:
    CALLS.append(list(completions))
    await asyncio.sleep(0)
    return [math.nan if c == "nan" else float(len(c)) for c in completions]


async def play_group(scorer: Scorer, replies: list[str | None]) -> list[float | BaseException]:
    """A group whose episode i replies `replies[i]`, or fails before its reward when None."""

    async def episode(reply: str | None) -> float:
        await asyncio.sleep(0.01 * len(reply or "x"))  # the replies come in at different times
        if reply is None:
            raise ConnectionError("the model call failed")
        return await scorer.score({"q": "say", "answer": 1}, "t-0", reply)

    with rewards.group(len(replies)):
        return await asyncio.gather(*(rewards.member(episode(r)) for r in replies), return_exceptions=True)


def test_one_call_per_group_even_when_an_episode_fails_first() -> None:
    CALLS.clear()
    out = asyncio.run(play_group(Scorer(judge, "judge.py:judge", "q"), ["ab", None, "abcd", "nan"]))
    assert [sorted(c) for c in CALLS] == [
        ["ab", "abcd", "nan"]
    ]  # once, with every reply, whichever came last
    assert out[0] == 2.0 and out[2] == 4.0 and isinstance(out[1], ConnectionError)
    assert isinstance(out[3], RewardError) and "returned nan for completion" in str(out[3])
    assert "of 3: need a finite number" in str(out[3])


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (
            lambda prompts, completions, **kw: [1.0],
            "returned [1.0] for 2 completions: need a list with one float per completion",
        ),
        (lambda prompts, completions, **kw: 1 / 0, "raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_raise_or_a_wrong_length_fails_every_episode_of_the_call(fn: object, says: str) -> None:
    out = asyncio.run(play_group(Scorer(fn, "r.py:f", "q"), ["a", "b"]))  # type: ignore[arg-type]
    assert all(isinstance(r, RewardError) and says in str(r) for r in out), out


def test_outside_a_group_an_episode_is_scored_alone() -> None:
    CALLS.clear()
    assert asyncio.run(Scorer(judge, "judge.py:judge", "q").score({"q": "say"}, "t-1", "abc")) == 3.0
    assert CALLS == [["abc"]]
