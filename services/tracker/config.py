"""Tracker configuration: `TrackerSettings` (a swarm description's `[tracker]`) and `TrackerConfig`,
the process's whole configuration (`swarmrl serve tracker --help`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator
from pydantic_settings import NoDecode

from swarmrl.core.config import ServiceConfig, Settings, SwarmConfigError

TRACKERS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    # mlflow-skinny's client; its local SQLite store runs on SQLAlchemy and Alembic
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
}
"""Each tracker the exporter writes to, with the modules it needs (`pip install 'swarmrl[track]'`)."""


def check_names(names: list[str]) -> list[str]:
    """`names` without repeats, each a known tracker; else a SwarmConfigError naming the unknown one."""
    for name in names:
        if name not in TRACKERS:
            raise SwarmConfigError(f"unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


def check_installed(names: list[str]) -> None:
    """A SwarmConfigError naming the missing package, unless every tracker of `names` can run here
    (checked only where the tracker runs)."""
    for name in names:
        missing = [m for m in TRACKERS[name] if importlib.util.find_spec(m) is None]
        if missing:
            raise SwarmConfigError(
                f"tracker {name!r} needs the package(s) {', '.join(missing)}, which are not installed: "
                "pip install 'swarmrl[track]'"
            )


class TrackerSettings(Settings):
    """Which trackers get the metrics, under which names, and how the stream is read."""

    track: Annotated[list[str], NoDecode, AfterValidator(check_names)] = []  # SWARMRL_TRACK=a,b: split below
    """Trackers that get every metric of the swarm, all offline: any of tensorboard, wandb, mlflow (a
    list, or `--track tensorboard,wandb`; needs `swarmrl[track]`). Empty: `swarmrl up` starts none."""
    project: str = "swarmrl"
    """W&B project and MLflow experiment the run is logged under."""
    run_name: str = ""
    """The run's name in W&B and MLflow; empty: the run directory's name."""
    fetch_batch: int = Field(default=256, gt=0)
    """Metrics pulled per fetch; each fetch is written to every tracker, then acked."""
    poll_interval_s: float = Field(default=0.5, gt=0)
    """Once caught up, wait at most this long for new metrics before looking again (seconds)."""
    stop_drain_s: float = Field(default=10.0, ge=0)
    """On a stop, go on exporting for up to this many seconds, until caught up with the stream."""
    ack_wait_s: float = Field(default=60.0, gt=0)
    """JetStream redelivers a metric not acked within this many seconds."""
    stats_interval_s: float = Field(default=30.0, gt=0)
    """Log what was exported this often (seconds)."""

    @field_validator("track", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        """`"tensorboard,wandb"`, a JSON list, or `["a,b", "c"]` (`--track a,b --track c`) as a list."""
        if isinstance(v, str):
            v = json.loads(v) if v.lstrip().startswith("[") else [v]
        if isinstance(v, list):
            return [part.strip() for item in v for part in str(item).split(",") if part.strip()]
        return v


class TrackerConfig(ServiceConfig, TrackerSettings):
    run_dir: Path = Path("runs/latest")
    """Run directory; the trackers and the exporter's `state.json` write under `<run_dir>/track/`
    (env SWARMRL_RUN_DIR)."""

    def track_dir(self) -> Path:
        return self.run_dir / "track"

    def name(self) -> str:
        """The run's name in W&B and MLflow."""
        return self.run_name or self.run_dir.resolve().name
