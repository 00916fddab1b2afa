"""Where the exporter is, in `<run_dir>/track/state.json`: saved (atomically) after every written
batch, before its ack, and read at start to resume right after `seq`, with the same counts and
runs. A batch written but not saved when the process died is written again, at the same steps."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.core.rundir import write_private


@dataclass
class TrackState:
    seq: int = 0
    """Last METRICS stream sequence written to every tracker."""
    counts: Counter[str] = field(default_factory=Counter)
    """The running counts (`RowMaker.counts`) as of `seq`."""
    run_ids: dict[str, str] = field(default_factory=dict)
    """Tracker -> the id of its run (W&B, MLflow), so a restart logs into the same run."""

    @classmethod
    def load(cls, path: Path) -> TrackState:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        return cls(seq=int(data["seq"]), counts=Counter(data["counts"]), run_ids=dict(data["run_ids"]))

    def save(self, path: Path) -> None:
        state = {"seq": self.seq, "counts": self.counts, "run_ids": self.run_ids}
        write_private(path, json.dumps(state), mode=0o644)
