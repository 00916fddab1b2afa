"""Metric records -> tracker rows: named values that share one point of one x-axis (pure logic).

A tag is `<family>/<...>/<name>`; each family has its own x-axis (its tag in brackets):

- `TrainStep`: `train/<m>/<field>` (and `extra` by its keys), `train/<m>/dropped/<reason>`;
  trainer step [`train/<m>/step`]. `SampleDrops`: `train/<m>/dropped/<reason>`, same axis.
- `EvalResult`: `eval/<m>/<task>/<metric>` (success rate), `.../<metric>_n`; policy version
  [`eval/<m>/version`].
- `MergeStats`: `merge/<field>`, `merge/<status>` (running total); episodes so far [`merge/episodes`].
- `ActionResult`: `action/<kind>/<field>`, `action/<kind>/<status>` (running total); actions so far
  [`action/actions`].

The running counts are saved with the stream position (`TrackState`), so a replay after a crash
gives every record the step it had the first time.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from swarmrl.schemas import (
    ActionResult,
    EvalResult,
    GroupOutcome,
    MergeStats,
    MetricRecord,
    SampleDrops,
    TrainStep,
)

_TAG_SAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")
"""What every tracker accepts in a name (MLflow's rule is the narrowest); anything else becomes `_`."""

TRAIN_FIELDS = ("loss", "reward_mean", "reward_std", "samples", "tokens", "trained_tokens", "tokens_per_s",
                "staleness_mean", "staleness_max", "wall_s", "policy_version")  # fmt: skip
MERGE_FIELDS = ("agents", "calls", "timelines_kept", "tokens_before", "tokens_after", "trained_tokens_before",
                "trained_tokens_after")  # fmt: skip
ACTION_FIELDS = ("act_s", "queued_s", "run_s", "units")
MERGE_AXIS = "merge/episodes"
ACTION_AXIS = "action/actions"


def tag(*parts: str) -> str:
    return _TAG_SAFE.sub("_", "/".join(parts))


@dataclass(frozen=True)
class Row:
    """Values plotted at one point of one x-axis."""

    axis: str
    """The x-axis's own tag (`train/policy/step`): W&B plots `values` against it."""
    step: int
    """The point on that axis (trainer step, policy version, running count)."""
    values: dict[str, float]
    ts: float
    """When the record was made (Unix seconds): the wall-clock time TensorBoard and MLflow keep."""


@dataclass
class RowMaker:
    """Turns metric records into rows, keeping the running counts (`counts`) that some axes need."""

    counts: Counter[str] = field(default_factory=Counter)

    def rows(self, record: MetricRecord) -> list[Row]:
        if isinstance(record, TrainStep):
            return self._train(record)
        if isinstance(record, SampleDrops):
            return [self._drops(record.model, record.step, record.dropped, record.ts)]
        if isinstance(record, EvalResult):
            return [self._eval(record)]
        if isinstance(record, MergeStats):
            return [self._counted(MERGE_AXIS, "merge", record, MERGE_FIELDS)]
        if isinstance(record, GroupOutcome):  # per group: the ledger's `groups`; a step's counts suffice here
            return []
        return [self._counted(ACTION_AXIS, tag("action", record.kind), record, ACTION_FIELDS)]

    def _train(self, r: TrainStep) -> list[Row]:
        values = {tag("train", r.model, name): float(getattr(r, name)) for name in TRAIN_FIELDS}
        values |= {tag("train", r.model, key): value for key, value in r.extra.items()}
        rows = [Row(tag("train", r.model, "step"), r.step, values, r.ts)]
        if r.dropped:
            rows.append(self._drops(r.model, r.step, r.dropped, r.ts))
        return rows

    @staticmethod
    def _drops(model: str, step: int, dropped: dict[str, str], ts: float) -> Row:
        per_reason = Counter(dropped.values())
        values = {tag("train", model, "dropped", reason): float(n) for reason, n in per_reason.items()}
        return Row(tag("train", model, "step"), step, values, ts)

    @staticmethod
    def _eval(r: EvalResult) -> Row:
        values = {
            tag("eval", r.model, r.task, r.metric): r.success_rate,
            tag("eval", r.model, r.task, f"{r.metric}_n"): float(r.n),
        }
        return Row(tag("eval", r.model, "version"), r.step, values, r.ts)

    def _counted(self, axis: str, family: str, r: MergeStats | ActionResult, names: tuple[str, ...]) -> Row:
        """A row on a running-count axis (`axis`), with the running total of the record's status."""
        self.counts[axis] += 1
        status = tag(family, r.status)
        self.counts[status] += 1
        values = {tag(family, name): float(getattr(r, name)) for name in names}
        values[status] = float(self.counts[status])
        return Row(axis, self.counts[axis], values, r.ts)
