"""`guess_number`: guess a secret integer in [1, n] in at most `max_turns` replies, told `higher`,
`lower` or `correct` after each. A reply holds one integer; an invalid one wastes the turn. Binary
search always wins, a feedback-consistent random guesser about half the time: the gap RL closes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from swarmrl.agents.tasks.base import Message, StepResult, TaskSpec, TurnEnv, message_text, parse_single_int

DEFAULT_N = 64
DEFAULT_TURNS = 6

SYSTEM_PROMPT = "You are playing a number guessing game. Reply with one integer only."


@dataclass(frozen=True)
class GuessNumber:
    """One game: the secret and the rules, all named by `task_id`."""

    secret: int
    n: int = DEFAULT_N
    max_turns: int = DEFAULT_TURNS
    turn_penalty: float = 0.2
    """Reward lost (linearly) between winning on the first turn and winning on the last one."""

    def __post_init__(self) -> None:
        if self.n < 4 or self.max_turns < 1 or not 1 <= self.secret <= self.n:
            raise ValueError(f"bad guess_number task: secret={self.secret} n={self.n} turns={self.max_turns}")

    @property
    def task_id(self) -> str:
        return f"guess_number/n{self.n}-t{self.max_turns}/{self.secret}"

    def user_prompt(self) -> str:
        return (
            f"I am thinking of an integer between 1 and {self.n}. You have {self.max_turns} guesses. "
            "After each guess I say higher (the number is higher), lower (the number is lower) "
            "or correct. Your guess?"
        )


def parse_reply(reply: Message) -> int | None:
    """The guess in an assistant message, or None when it does not hold exactly one integer."""
    return parse_single_int(message_text(reply))


class GuessNumberEnv(TurnEnv):
    system_prompt = SYSTEM_PROMPT
    task: GuessNumber

    def step(self, reply: Message) -> StepResult:
        self._next_turn()
        guess = parse_reply(reply)
        valid = guess is not None and 1 <= guess <= self.task.n
        if not valid:
            feedback = f"invalid: reply with one integer between 1 and {self.task.n}"
        elif guess == self.task.secret:
            feedback = "correct"
            self.success = True
            late = (self.turns - 1) / max(1, self.task.max_turns - 1)
            self.reward = 1.0 - self.task.turn_penalty * late
        else:
            feedback = "higher" if self.task.secret > guess else "lower"  # type: ignore[operator]
        self.done = self.success or self.turns >= self.task.max_turns
        return StepResult(
            messages=[{"role": "user", "content": feedback}],
            done=self.done,
            info={"guess": guess, "valid": valid, "turn": self.turns},
        )


def eval_tasks(n: int = DEFAULT_N, max_turns: int = DEFAULT_TURNS) -> list[GuessNumber]:
    """The held-out secrets: one per stratum of [1, n], so easy and hard secrets are both in it."""
    count = max(2, min(n // 4, 32))
    rng = random.Random(f"guess_number-eval-{n}")
    edges = [1 + (n * i) // count for i in range(count + 1)]
    return [
        GuessNumber(rng.randint(lo, hi - 1), n, max_turns) for lo, hi in zip(edges, edges[1:], strict=False)
    ]


def train_tasks(seed: int, n: int = DEFAULT_N, max_turns: int = DEFAULT_TURNS) -> Iterator[GuessNumber]:
    """Endless seeded stream of training games, drawn from the secrets not in the eval set."""
    held_out = {task.secret for task in eval_tasks(n, max_turns)}
    pool = [s for s in range(1, n + 1) if s not in held_out]
    rng = random.Random(seed)
    while True:
        yield GuessNumber(rng.choice(pool), n, max_turns)


def demonstration(task: GuessNumber, rng: random.Random) -> list[Message]:
    """A mediocre but well-formed game: guesses uniform in the range the feedback leaves (not binary
    search), so the warm-started policy wins sometimes, not always."""
    env = GuessNumberEnv(task)
    messages = env.reset()
    lo, hi = 1, task.n
    while not env.done:
        guess = rng.randint(lo, hi)
        reply: Message = {"role": "assistant", "content": str(guess)}
        messages.append(reply)
        step = env.step(reply)
        messages += step.messages
        if guess < task.secret:
            lo = guess + 1
        elif guess > task.secret:
            hi = guess - 1
    return messages


SPEC = TaskSpec(
    name="guess_number",
    make_env=GuessNumberEnv,
    train_tasks=train_tasks,
    eval_tasks=eval_tasks,
    demonstration=demonstration,
    parse_reply=parse_reply,
)
