"""Live progress of a run, read from the METRICS stream: step, reward, eval success, tokens/s."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmrl.schemas import EvalResult, MergeStats, TrainStep, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus


class Progress:
    def __init__(self, nats_url: str, models: list[str], steps: int, live: bool = True) -> None:
        self.nats_url, self.models, self.steps = nats_url, models, steps
        self.step_of = dict.fromkeys(models, 0)
        self.last_of: dict[str, TrainStep] = {}
        self.evals: dict[str, list[EvalResult]] = {}
        """Eval results by `task` (team outcome) or `task model:metric` (a role's own metric)."""
        self.episodes = self.aborted = 0
        self.started = time.monotonic()
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2, transient=False) if live else None
        self._last_log = 0.0
        self._nc: Any = None

    async def start(self) -> None:
        self._nc = await bus.connect(self.nats_url, "up-progress")
        await self._nc.jetstream().subscribe(f"{S.METRICS_PREFIX}.>", cb=self._on_msg, ordered_consumer=True)
        if self.live:
            self.live.start()

    async def _on_msg(self, msg: Any) -> None:
        try:
            if msg.subject.startswith(S.METRICS_PREFIX + ".train."):
                step = decode(msg.data, TrainStep)
                if step.model in self.step_of:
                    self.last_of[step.model] = step
                    self.step_of[step.model] = max(self.step_of[step.model], step.step)
            elif msg.subject.startswith(S.METRICS_PREFIX + ".eval."):
                ev = decode(msg.data, EvalResult)
                key = ev.task if ev.metric == "success" else f"{ev.task} {ev.model}:{ev.metric}"
                self.evals.setdefault(key, []).append(ev)
            elif msg.subject == S.MERGE_METRICS_SUBJECT:
                st = decode(msg.data, MergeStats)
                self.episodes += st.status == "merged"
                self.aborted += st.status in ("aborted", "timeout")
        except Exception:  # a metric we cannot read is not worth stopping the display for
            return

    @property
    def step(self) -> int:
        """The slowest model's step."""
        return min(self.step_of.values())

    def done(self) -> bool:
        """Some model reached the step budget (`up` ends the run then)."""
        return max(self.step_of.values()) >= self.steps

    def steps_line(self) -> str:
        return ", ".join(f"{m} step {s}" for m, s in self.step_of.items())

    def cells(self) -> dict[str, str]:
        """The progress values, by column name (shared by the live table and the log line)."""
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
            # distinct task instances among each task's last groups (services/trainer/diversity.py)
            shares = {
                k.removeprefix("distinct."): v
                for k, v in (last.extra if last else {}).items()
                if k.startswith("distinct.")
            }
            cells[prefix + "distinct"] = (
                " ".join(f"{t} {v:.0%}" if len(shares) > 1 else f"{v:.0%}" for t, v in shares.items()) or "-"
            )
            if len(self.models) == 1:
                cells["samples"] = str(last.samples) if last else "-"
                cells["tokens/s"] = f"{last.tokens_per_s:.0f}" if last else "-"
                cells["staleness"] = f"{last.staleness_mean:.2f}" if last else "-"
        cells["episodes"] = f"{self.episodes} (+{self.aborted} aborted)"
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
