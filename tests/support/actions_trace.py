"""An RL-rollout-shaped action trace for the simulator (pure, seeded, deterministic).

Shape: `steps` RL steps; each step rolls out `trajectories_per_step` trajectories, all starting
together (a wave: the driver starts step k when the last trajectory of step k-1 has ended). A
trajectory is a few turns; each turn is LLM "think" time (no external resource), then one action:

- `python` (share 1 - `judge_share`): a code run in a sandbox. Run time lognormal, median
  `python_median_s` (0.15 s) and sigma `python_sigma` (1.1): about two thirds between 0.05 and 0.5 s,
  4% over 1 s, a tail to several seconds, capped at `python_max_s`. 1 cpu, 2 cpus with probability
  `two_cpu_share`; 128, 256 or 512 MB.
- with `reward_suite`, a trajectory's last action is its reward: a `python` test suite of
  `2 + geometric` cases (mean `suite_cases_mean`, at most `suite_max_cases`), each a run of
  lognormal time (median `case_median_s`, sigma `case_sigma`); its run time is their sum. Its cases
  are parts a scheduler may run in parallel (see `scheduler.py`).
- `judge`: a model judge scoring text. 1 accel slot, no cpu, no host memory; 0.1-0.3 s uniform.

The number of turns is 1 + geometric (mean `turns_mean`, at most `max_turns`), so a few long
trajectories make each step's tail. Think times are lognormal (median `think_median_s`); after the
last action the trajectory thinks once more (its final answer) and ends. Each action carries the
caller's guess of its run time, `hint_s = run_s * exp(N(0, hint_sigma))` (None if `hint_sigma` is
None); the scheduler never sees `run_s` itself.

With `tasks`, each trajectory first draws its task kind (`TaskKind`, by `share`): the kind sets its
judge share and whether it ends with a reward suite, and names the trajectory's `task` (what
per-task isolated pools are split by). Without it every trajectory is task `default` and no draw is
made, so the traces of earlier versions are unchanged.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from swarmrl.services.actions.model import Demand


@dataclass(frozen=True)
class Turn:
    """Think, then one action."""

    think_s: float
    """LLM time before the action is submitted."""
    kind: str
    demand: Demand
    parts: tuple[float, ...]
    """How long each part really runs (the simulator's ground truth): one part, or a test suite's
    cases."""
    hint_s: float | None
    """What the caller tells the scheduler about `run_s`."""

    @property
    def run_s(self) -> float:
        """All parts, one after another."""
        return sum(self.parts)


@dataclass(frozen=True)
class TrajectorySpec:
    """One rollout: its step (wave), its turns, and the think time after its last action."""

    id: str
    step: int
    turns: tuple[Turn, ...]
    final_think_s: float
    task: str = "default"
    """Its task kind (`TaskKind.name`)."""


@dataclass(frozen=True)
class TaskKind:
    """One task of a mixed trace: how often it is drawn and what its trajectories do."""

    name: str
    share: float
    """Relative weight when a trajectory draws its task."""
    judge_share: float
    reward_suite: bool


def make_trace(
    seed: int,
    *,
    steps: int = 3,
    trajectories_per_step: int = 256,
    turns_mean: float = 6.0,
    max_turns: int = 30,
    think_median_s: float = 2.0,
    think_sigma: float = 0.6,
    judge_share: float = 0.2,
    python_median_s: float = 0.15,
    python_sigma: float = 1.1,
    python_max_s: float = 30.0,
    two_cpu_share: float = 0.1,
    judge_s: tuple[float, float] = (0.1, 0.3),
    hint_sigma: float | None = 0.5,
    reward_suite: bool = False,
    suite_cases_mean: float = 8.0,
    suite_max_cases: int = 32,
    case_median_s: float = 0.1,
    case_sigma: float = 0.8,
    tasks: tuple[TaskKind, ...] | None = None,
) -> list[TrajectorySpec]:
    """Build a trace; the same arguments always give the same trace (see the module docstring)."""
    if steps < 1 or trajectories_per_step < 1 or turns_mean < 1 or max_turns < 1:
        raise ValueError(
            f"need steps, trajectories_per_step, turns_mean, max_turns >= 1, got "
            f"{steps}, {trajectories_per_step}, {turns_mean}, {max_turns}"
        )
    if tasks is not None and (not tasks or min(k.share for k in tasks) <= 0):
        raise ValueError(f"tasks need positive shares, got {tasks}")
    rng = random.Random(seed)

    def think() -> float:
        return think_median_s * math.exp(rng.gauss(0.0, think_sigma))

    def turn(judge_share: float) -> Turn:
        if rng.random() < judge_share:
            kind, demand = "judge", Demand(cpu=0, mem_mb=0, accel=1)
            run_s = rng.uniform(*judge_s)
        else:
            cpu = 2 if rng.random() < two_cpu_share else 1
            kind, demand = "python", Demand(cpu=cpu, mem_mb=rng.choice((128, 256, 256, 512)))
            run_s = min(python_max_s, python_median_s * math.exp(rng.gauss(0.0, python_sigma)))
        hint_s = hint(run_s)  # drawn before the think time: the rigid trace of earlier versions
        return Turn(think(), kind, demand, (run_s,), hint_s)

    def suite() -> Turn:
        cases = min(suite_max_cases, 2 + geometric(1.0 / max(suite_cases_mean - 1.0, 1.0)))
        parts = tuple(case_median_s * math.exp(rng.gauss(0.0, case_sigma)) for _ in range(cases))
        demand = Demand(cpu=1, mem_mb=rng.choice((128, 256, 256, 512)))
        hint_s = hint(sum(parts))
        return Turn(think(), "python", demand, parts, hint_s)

    def hint(run_s: float) -> float | None:
        return None if hint_sigma is None else run_s * math.exp(rng.gauss(0.0, hint_sigma))

    def geometric(p: float) -> int:
        """Failures before the first success, each try succeeding with probability `p` (mean (1-p)/p)."""
        return 0 if p >= 1 else int(math.log(1.0 - rng.random()) / math.log(1.0 - p))

    # 1 + geometric(p) has mean 1 + (1 - p) / p = 1 / p.
    p = 1.0 / turns_mean
    kinds = tasks or (TaskKind("default", 1.0, judge_share, reward_suite),)
    total = sum(k.share for k in kinds)

    def task() -> TaskKind:
        if tasks is None:
            return kinds[0]  # no draw: the single-task traces stay what they were
        x, acc = rng.random() * total, 0.0
        for k in kinds:
            acc += k.share
            if x < acc:
                return k
        return kinds[-1]

    trace = []
    for step in range(steps):
        for i in range(trajectories_per_step):
            kind = task()
            turns = tuple(turn(kind.judge_share) for _ in range(min(max_turns, 1 + geometric(p))))
            if kind.reward_suite:
                turns += (suite(),)
            trace.append(TrajectorySpec(f"s{step}-t{i}", step, turns, think(), kind.name))
    return trace
