"""Live progress of a run, read from the METRICS stream: step, reward, eval success, tokens/s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarmrl.schemas import EvalResult, MergeStats, TrainStep, decode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus


class Progress:
    def __init__(self, nats_url: str, model: str, steps: int, live: bool = True) -> None:
        self.nats_url, self.model, self.steps = nats_url, model, steps
        self.step = 0
        self.last: TrainStep | None = None
        self.evals: dict[str, list[EvalResult]] = {}
        self.episodes = self.aborted = 0
        self.started = time.monotonic()
        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2, transient=False) if live else None
        self._last_log = 0.0
        self._nc: Any = None
        self._new_eval = asyncio.Event()

    async def start(self) -> None:
        self._nc = await bus.connect(self.nats_url, "up-progress")
        await self._nc.jetstream().subscribe(f"{S.METRICS_PREFIX}.>", cb=self._on_msg, ordered_consumer=True)
        if self.live:
            self.live.start()

    async def _on_msg(self, msg: Any) -> None:
        try:
            if msg.subject == S.train_metrics_subject(self.model):
                self.last = decode(msg.data, TrainStep)
                self.step = max(self.step, self.last.step)
            elif msg.subject == S.eval_metrics_subject(self.model):
                ev = decode(msg.data, EvalResult)
                self.evals.setdefault(ev.task, []).append(ev)
                self._new_eval.set()
            elif msg.subject == S.MERGE_METRICS_SUBJECT:
                st = decode(msg.data, MergeStats)
                self.episodes += st.status == "merged"
                self.aborted += st.status in ("aborted", "timeout")
        except Exception:  # a metric we cannot read is not worth stopping the display for
            return

    async def eval_seen(self, version: int, tasks: int) -> None:
        while sum(any(e.step == version for e in evs) for evs in self.evals.values()) < tasks:
            self._new_eval.clear()
            await self._new_eval.wait()

    def cells(self) -> dict[str, str]:
        """The progress values, by column name (shared by the live table and the log line)."""
        last = self.last
        evals = "  ".join(
            f"{task} {evs[0].success_rate:.0%}→{evs[-1].success_rate:.0%} (v{evs[-1].step})"
            for task, evs in self.evals.items()
        )
        return {
            "step": f"{self.step}/{self.steps}",
            "loss": f"{last.loss:.4f}" if last else "-",
            "reward": f"{last.reward_mean:.3f}" if last else "-",
            "samples": str(last.samples) if last else "-",
            "tokens/s": f"{last.tokens_per_s:.0f}" if last else "-",
            "staleness": f"{last.staleness_mean:.2f}" if last else "-",
            "episodes": f"{self.episodes} (+{self.aborted} aborted)",
            "eval success": evals or "-",
        }

    def table(self) -> Table:
        t = Table(title=f"swarmrl · model {self.model} · {time.monotonic() - self.started:.0f}s")
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
