"""How varied the training groups are (pure logic): distinct task instances among each task's last
groups. A narrowing distribution (clients replaying their streams after restarts, a dataset looping
over a few rows) gets memorised: held-out success falls while the train reward holds. The trainer
reports each share as `distinct.<task>` and warns when it falls well below the task's best.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Diversity:
    window: int = 64  # groups per task a share is measured over: the task's last `window` groups
    warn_below: float = 0.5
    """Warn when a task's share falls below this fraction of the best share of its full windows."""
    recent: dict[str, deque[str]] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)

    def observe(self, task: str, instance: str) -> str | None:
        """Count one group of `task` on `instance` (its `task_id`); a warning when the task's share
        falls below `warn_below` of its best, once per fall."""
        last = self.recent.setdefault(task, deque(maxlen=self.window))
        last.append(instance)
        if len(last) < self.window:
            return None
        share = len(set(last)) / len(last)
        best = self.best[task] = max(self.best.get(task, 0.0), share)
        if share >= self.warn_below * best:
            self.warned.discard(task)
            return None
        if task in self.warned:
            return None
        self.warned.add(task)
        return (
            f"task {task}: the last {len(last)} groups played {len(set(last))} distinct instances "
            f"({share:.0%}), below {self.warn_below:.0%} of its best window ({best:.0%}): the training "
            "distribution narrowed (clients replaying their task streams?); held-out success may fall "
            "while the train reward holds"
        )

    def shares(self) -> dict[str, float]:
        """Task -> distinct instances / groups in its last `window` groups (fewer while it fills)."""
        return {task: len(set(last)) / len(last) for task, last in self.recent.items() if last}
