"""Live progress of a run from the METRICS stream (step, reward, eval success, tokens/s, groups
trained per client) and the episodes' events (the most common abort reason, and whether a task's
first `FIRST_EPISODES` episodes all aborted: `up` stops then)."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmrl.schemas import AbortEvent, BeginEvent, EvalResult, GroupOutcome, MergeStats, TrainStep, decode
from swarmrl.schemas import subjects as S
from swarmrl.schemas.codec import WireError, decode_metric
from swarmrl.services.common import bus

FIRST_EPISODES = 20
"""A task whose first this many training episodes all abort stops the run (`Progress.failing`)."""


def reason_kind(reason: str) -> str:
    """An abort reason with its numbers masked: one mistake's reasons on different rows count as one."""
    return re.sub(r"\d+", "…", reason)[:300]


class Progress:
    def __init__(self, nats_url: str, models: list[str], steps: int, live: bool = True) -> None:
        self.nats_url, self.models, self.steps = nats_url, models, steps
        self.step_of = dict.fromkeys(models, 0)
        self.last_of: dict[str, TrainStep] = {}
        self.evals: dict[str, list[EvalResult]] = {}  # by `task`, or `task model:metric` (a role's own)
        self.episodes = self.aborted = 0
        self.started = time.monotonic()
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2, transient=False) if live else None
        self.trained: dict[str, Counter[str]] = {}  # client id -> its groups' outcomes
        self.task_of: dict[str, str] = {}  # training episode id -> task, for each task's first episodes
        self.early: dict[str, str] = {}  # episode id -> `end` or `abort`, its begin not in yet
        self.first: dict[str, Counter[str]] = {}  # task -> how its first episodes ended (`ok`, `aborted`)
        self.reasons: Counter[str] = Counter()
        self.example: dict[str, str] = {}  # reason kind -> the latest reason of that kind, as sent
        self._last_log = 0.0
        self._nc: Any = None

    async def start(self) -> None:
        self._nc = await bus.connect(self.nats_url, "up-progress")
        await self._nc.jetstream().subscribe(f"{S.METRICS_PREFIX}.>", cb=self._on_msg, ordered_consumer=True)
        for kind in ("begin", "end", "abort"):
            await self._nc.subscribe(S.episode_filter("*", kind), cb=self._on_episode)
        if self.live:
            self.live.start()

    async def _on_msg(self, msg: Any) -> None:
        try:
            r = decode_metric(msg.subject, msg.data)
        except WireError:  # a metric we cannot read is not worth stopping the display for
            return
        if isinstance(r, TrainStep) and r.model in self.step_of:
            self.last_of[r.model] = r
            self.step_of[r.model] = max(self.step_of[r.model], r.step)
        elif isinstance(r, EvalResult):
            key = r.task if r.metric == "success" else f"{r.task} {r.model}:{r.metric}"
            self.evals.setdefault(key, []).append(r)
        elif isinstance(r, GroupOutcome):
            self.trained.setdefault(r.client_id, Counter())[r.outcome] += 1
        elif isinstance(r, MergeStats):
            self.episodes += r.status == "merged"
            self.aborted += r.status in ("aborted", "timeout")

    async def _on_episode(self, msg: Any) -> None:
        """A begin, end or abort event. Each kind has its own subscription, whose callbacks run apart:
        an episode's end can come before its begin (`early`)."""
        kind, episode_id = msg.subject.rsplit(".", 1)[-1], msg.subject.split(".")[3]
        try:
            begin = decode(msg.data, BeginEvent) if kind == "begin" else None
            reason = decode(msg.data, AbortEvent).reason if kind == "abort" else ""
        except WireError:  # as above
            return
        if kind == "abort":
            self.reasons[reason_kind(reason)] += 1
            self.example[reason_kind(reason)] = reason
        if begin is not None:
            name = begin.task.get("name")
            task = name if isinstance(name, str) and name else begin.task_id
            ended = self.early.pop(episode_id, None)
            if begin.eval or sum(self.first.get(task, Counter()).values()) >= FIRST_EPISODES:
                return
            if ended is None:
                self.task_of[episode_id] = task
                return
            kind = ended
        elif (task := self.task_of.pop(episode_id, None)) is None:
            self.early[episode_id] = kind  # or an episode not followed: the oldest are forgotten
            if len(self.early) > 10_000:
                del self.early[next(iter(self.early))]
            return
        if sum((first := self.first.setdefault(task, Counter())).values()) < FIRST_EPISODES:
            first["aborted" if kind == "abort" else "ok"] += 1

    def common_reason(self) -> tuple[str, int]:
        """The most common abort reason (one example of it) and how often it came."""
        if not self.reasons:
            return "", 0
        kind, n = self.reasons.most_common(1)[0]
        return self.example[kind], n

    def failing(self) -> str | None:
        """Why the run should stop now: a task's first `FIRST_EPISODES` training episodes all aborted."""
        for task, first in self.first.items():
            if first["aborted"] >= FIRST_EPISODES:
                reason, n = self.common_reason()
                return (
                    f"the first {FIRST_EPISODES} episodes of task {task!r} all aborted unexpectedly; the most "
                    f"common reason ({n} episodes): {reason}"
                )
        return None

    @property
    def step(self) -> int:
        return min(self.step_of.values())

    def done(self) -> bool:
        """Some model reached the step budget (`up` ends the run then)."""
        return max(self.step_of.values()) >= self.steps

    def steps_line(self) -> str:
        return ", ".join(f"{m} step {s}" for m, s in self.step_of.items())

    def cells(self) -> dict[str, str]:
        """The progress values, by column name (of the live table and the log line)."""
        evals = "  ".join(
            f"{task} {evs[0].success_rate:.0%}→{evs[-1].success_rate:.0%} (v{evs[-1].step})"
            for task, evs in self.evals.items()
        )
        cells: dict[str, str] = {}
        for model in self.models:
            last = self.last_of.get(model)
            prefix = f"{model} " if len(self.models) > 1 else ""
            cells[prefix + "step"] = f"{self.step_of[model]}/{self.steps}"
            cells[prefix + "loss"] = f"{last.loss:.4f}" if last else "-"
            cells[prefix + "reward"] = f"{last.reward_mean:.3f}" if last else "-"
            # distinct task instances among each task's last groups (services/trainer/guard.py)
            extra = last.extra if last else {}
            shares = {k.removeprefix("distinct."): v for k, v in extra.items() if k.startswith("distinct.")}
            cells[prefix + "distinct"] = (
                " ".join(f"{t} {v:.0%}" if len(shares) > 1 else f"{v:.0%}" for t, v in shares.items()) or "-"
            )
            if len(self.models) == 1:
                cells["samples"] = str(last.samples) if last else "-"
                cells["tokens/s"] = f"{last.tokens_per_s:.0f}" if last else "-"
                cells["staleness"] = f"{last.staleness_mean:.2f}" if last else "-"
        reason, n = self.common_reason()
        most = f", most: {reason[:80]}" if n else ""
        cells["episodes"] = f"{self.episodes} (+{self.aborted} aborted{most})"
        if self.trained:
            cells["groups trained"] = " ".join(
                f"{client} {c['trained'] / sum(c.values()):.0%}" for client, c in sorted(self.trained.items())
            )
        cells["eval success"] = evals or "-"
        return cells

    def table(self) -> Table:
        t = Table(title=f"swarmrl · {', '.join(self.models)} · {time.monotonic() - self.started:.0f}s")
        cells = self.cells()
        for col in cells:
            t.add_column(col, justify="right")
        t.add_row(*cells.values())
        return t

    def line(self) -> str:
        """One plain log line (for `--no-display`, CI logs and files)."""
        cells = " | ".join(f"{k} {v}" for k, v in self.cells().items())
        return f"[{time.monotonic() - self.started:.0f}s] {cells}"

    def render(self) -> None:
        if self.live:
            self.live.update(self.table())
        elif time.monotonic() - self._last_log > 10:
            self._last_log = time.monotonic()
            print(self.line(), flush=True)

    async def stop(self) -> None:
        if self.live:
            self.live.update(self.table())
            self.live.stop()
        if self._nc is not None:
            await self._nc.close()
