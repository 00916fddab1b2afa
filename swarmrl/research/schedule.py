"""What a study runs next, when early stopping decides, and how long is left (pure: state in, answers out).

Runs go seed-major: every arm's first seed, then every arm's second, ... Early stopping is successive
halving over seeds: at checkpoint c (`early_stop.after_seeds`) the remaining non-baseline arms are
ranked by mean metric over their first c seeds and the lower part stops (its unstarted runs become
`halved`). No run of a later seed starts before a checkpoint is decided, so every arm is ranked on
the same seeds. Halving saves seeds, not minutes: `swarmrl up` cannot pause a run.
"""

from __future__ import annotations

import math
import time

from swarmrl.research.state import FINISHED, Decision, RunState, StudyState

STARTUP_S = 90.0
"""Estimate of a run's start and stop (services, evaluation at the end) before any run has finished."""


def stopped_arms(state: StudyState) -> set[str]:
    return {arm for d in state.decisions for arm in d.stopped}


def pending_checkpoint(state: StudyState) -> int | None:
    """The first early-stopping checkpoint not decided yet (None: none left)."""
    if state.study.early_stop is None:
        return None
    decided = {d.after_seeds for d in state.decisions}
    return next((c for c in state.study.early_stop.after_seeds if c not in decided), None)


def due_checkpoint(state: StudyState) -> int | None:
    """The checkpoint to decide now: every remaining arm has finished the seeds before it."""
    c = pending_checkpoint(state)
    if c is None:
        return None
    gone = stopped_arms(state)
    before = [r for r in state.runs.values() if r.seed_index < c and r.arm not in gone]
    return c if all(r.status in FINISHED for r in before) else None


def decide(state: StudyState, c: int, now: float | None = None) -> Decision:
    """Rank the remaining non-baseline arms on their first `c` seeds; keep the upper part. An arm
    without any metric ranks last; ties keep the study's arm order."""
    es = state.study.early_stop
    assert es is not None
    gone, order = stopped_arms(state), state.study.arm_names
    sign = -1.0 if state.study.metric.goal == "max" else 1.0
    seen = [(r.arm, r.metric) for r in state.runs.values() if r.seed_index < c and r.metric is not None]
    scores: list[tuple[str, float | None]] = []
    for arm in [a for a in order[1:] if a not in gone]:  # the baseline always goes on
        vals = [m for a, m in seen if a == arm]
        scores.append((arm, sum(vals) / len(vals) if vals else None))
    ranking = sorted(scores, key=lambda s: (s[1] is None, sign * (s[1] or 0.0), order.index(s[0])))
    n_keep = min(len(ranking), max(es.min_arms, math.ceil(es.keep * len(ranking))))
    kept, stopped = [a for a, _ in ranking[:n_keep]], [a for a, _ in ranking[n_keep:]]
    return Decision(after_seeds=c, ranking=ranking, kept=kept, stopped=stopped, at=now or time.time())


def apply(state: StudyState, decision: Decision) -> list[RunState]:
    """Record `decision`; the stopped arms' runs not yet started become `halved`. Returns them."""
    state.decisions.append(decision)
    ranks = {arm: i + 1 for i, (arm, _) in enumerate(decision.ranking)}
    out = []
    for r in state.runs.values():
        if r.arm in decision.stopped and r.status == "pending":
            r.status = "halved"
            r.note = (
                f"arm stopped after {decision.after_seeds} seed(s): rank {ranks[r.arm]} of {len(ranks)}, "
                f"{len(decision.kept)} kept"
            )
            out.append(r)
    return out


def add_seeds(state: StudyState, n: int) -> list[int]:
    """Extend the study by `n` seeds, the next integers above its largest; returns them. Every arm
    early stopping kept gets a pending run per new seed, and a total budget grows in proportion."""
    if n < 1:
        raise ValueError(f"seeds to add must be >= 1, got {n}")
    study = state.study
    start = max(study.seeds) + 1
    new = list(range(start, start + n))
    old_count = len(study.seeds)
    study.seeds = [*study.seeds, *new]
    if study.budget.total_minutes is not None:
        study.budget.total_minutes *= len(study.seeds) / old_count
    gone = stopped_arms(state)
    for seed in new:
        for arm in study.arm_names:
            run = RunState(arm=arm, seed=seed, seed_index=study.seeds.index(seed))
            if arm in gone:
                run.status, run.note = "halved", "its arm was stopped before this seed was added"
            state.runs[run.id] = run
    state.finished = None
    return new


def runnable(state: StudyState) -> list[RunState]:
    """Pending runs that may start now, in order (an undecided checkpoint holds back later seeds)."""
    c = pending_checkpoint(state)
    return [r for r in remaining(state) if c is None or r.seed_index < c]


def remaining(state: StudyState) -> list[RunState]:
    """Runs that may still start (an upper bound: early stopping may drop some)."""
    gone = stopped_arms(state)
    return [r for r in state.ordered() if r.status == "pending" and r.arm not in gone]


def run_estimate_s(state: StudyState) -> float:
    """Expected wall time of one run: the mean of the finished ones, else the budget plus start-up."""
    done = [r.duration_s for r in state.runs.values() if r.status == "done" and r.duration_s]
    if done:
        return sum(done) / len(done)
    return state.study.budget.run_minutes * 60 + STARTUP_S


def eta_s(state: StudyState, parallel: int, now: float | None = None) -> float:
    """Seconds until every remaining run has finished, packing them on `parallel` slots."""
    now = time.time() if now is None else now
    est = run_estimate_s(state)
    slots = [
        max(0.0, est - (now - r.attempts[-1].started))
        for r in state.runs.values()
        if r.status == "running" and r.attempts
    ]
    slots = sorted(slots + [0.0] * max(0, parallel - len(slots)))
    for _ in remaining(state):
        slots[0] += est
        slots.sort()
    return max(slots) if slots else 0.0


def over_budget(state: StudyState) -> bool:
    """Whether one more run would pass the study's total budget."""
    total = state.study.budget.total_minutes
    return total is not None and state.elapsed_s + run_estimate_s(state) > total * 60
