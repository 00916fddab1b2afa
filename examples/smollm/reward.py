"""The SmolLM2 example's reward: 1 when the reply's last number is the row's answer, else 0.

TRL's reward-function signature: lists in (one entry per completion; every dataset column by name),
one float per completion out. With a `messages` prompt each completion is a list holding the reply.
"""

import re


def correct(prompts, completions, answer, **kwargs):
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\d+", text or "")
        rewards.append(1.0 if numbers and int(numbers[-1]) == int(expected) else 0.0)
    return rewards
