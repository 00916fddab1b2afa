"""Task mixing ("cocktail" training): admit new GRPO groups so each task gets its weight's share.

Every episode asks the gateway for its tokens, so the gateway is where all tasks meet: it holds back
new groups of a task ahead of its share (the client waits, `retry_after_s`). Pure logic, no NATS.
For a new group of task `t`: tasks that asked within `window_s` are *active*; share(t) = weight(t) /
the active tasks' weights; n = groups charged to them; hold when another task is active and
charged(t) > share(t) * n + `slack`. A task that (re)joins is charged as if it had had its share all
along, so it owes no burst of catch-up groups.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def parse_weights(items: Iterable[str]) -> dict[str, float]:
    """`["calculator=0.7", "guess_number=0.3"]` → `{"calculator": 0.7, ...}` (weights need not sum to 1)."""
    weights: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or not name or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"--task-weight expects TASK=WEIGHT with a weight > 0, got {item!r}")
        if name in weights:
            raise ValueError(f"--task-weight names task {name!r} twice")
        weights[name] = weight
    return weights


class TaskMixer:
    """Fair-share admission of new groups by task. Times are seconds on any monotonic clock."""

    def __init__(self, weights: Mapping[str, float], *, slack: float = 2.0, window_s: float = 30.0) -> None:
        self.weights = dict(weights)  # as `parse_weights` checked them: each > 0
        self.slack, self.window_s = slack, window_s
        self.admitted = dict.fromkeys(self.weights, 0)
        """New groups admitted per task (what the mix is judged by)."""
        self.held = dict.fromkeys(self.weights, 0)  # new-group requests held per task
        self._charged = dict.fromkeys(self.weights, 0.0)
        self._last_ask: dict[str, float] = {}

    def check(self, task: str) -> None:
        if task not in self.weights:
            named = f"task {task!r}" if task else "no task"
            raise ValueError(
                f"this gateway mixes tasks by weight and the token request names {named}; "
                f"known tasks: {sorted(self.weights)} (an outside agent's own task is declared in the "
                f"description with its weight: [tasks.<name>] clients = 0)"
            )

    def _active(self, now: float) -> list[str]:
        return [t for t, at in self._last_ask.items() if now - at <= self.window_s]

    def seen(self, task: str, now: float) -> None:
        """Record that `task` asked for a token (it is alive); `now` may lie in the past (another
        gateway's ask): the latest ask counts."""
        self.check(task)
        last = self._last_ask.get(task)
        self._last_ask[task] = max(now, last) if last is not None else now
        if last is not None and now - last <= self.window_s:
            return
        # (re)joining: start level with the active tasks
        active = self._active(now)
        share = self.weights[task] / sum(self.weights[t] for t in active)
        if share < 1.0:
            others = sum(self._charged[t] for t in active if t != task)
            self._charged[task] = max(self._charged[task], share * others / (1.0 - share))

    def ahead(self, task: str, now: float) -> bool:
        """Whether a new group of `task` would be held now."""
        active = self._active(now)
        if task not in active or len(active) < 2:
            return False
        share = self.weights[task] / sum(self.weights[t] for t in active)
        n = sum(self._charged[t] for t in active)
        return self._charged[task] > share * n + self.slack

    def admit(self, task: str, now: float) -> bool:
        """A new group of `task` asks to start: True = admitted (and charged), False = hold it."""
        self.seen(task, now)
        if self.ahead(task, now):
            self.held[task] += 1
            return False
        self.charge(task)
        return True

    def charge(self, task: str) -> None:
        """Count one admitted group of `task` (admitted here, or by another gateway: `admission.py`)."""
        self.check(task)
        self._charged[task] += 1.0
        self.admitted[task] += 1
