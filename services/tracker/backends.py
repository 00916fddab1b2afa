"""The trackers the exporter writes rows to, each through its library's public API, all offline.

- `tensorboard`: `SummaryWriter` event files in `<run>/track/tensorboard/`, with the record's time.
- `wandb`: an offline W&B run under `<run>/track/wandb/` (`wandb sync` uploads it); each tag is
  plotted against its row's axis (`define_metric(step_metric=axis)`): W&B has one step per run.
- `mlflow`: an MLflow run in the SQLite store `<run>/track/mlflow.db` (`MlflowClient.log_batch`).

A restarted exporter goes on in the same W&B and MLflow runs (their ids are in `TrackState`).
"""

from __future__ import annotations

from typing import Any, Protocol

from swarmrl.services.tracker.config import TrackerConfig
from swarmrl.services.tracker.rows import Row

MLFLOW_BATCH = 1000
"""Metrics per `log_batch` call: MLflow refuses more."""


class Backend(Protocol):
    name: str
    run_id: str
    """The tracker's id of this run (empty where it has none)."""

    def __init__(self, cfg: TrackerConfig, run_id: str | None) -> None:
        """Open the tracker's run under `cfg.track_dir()`; go on in run `run_id` if given."""

    def write(self, rows: list[Row]) -> None: ...

    def flush(self) -> None:
        """Make what was written durable where the library lets us (before the metrics are acked)."""

    def close(self) -> None: ...


class TensorBoard:
    name = "tensorboard"
    run_id = ""

    def __init__(self, cfg: TrackerConfig, run_id: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(cfg.track_dir() / "tensorboard"))

    def write(self, rows: list[Row]) -> None:
        for row in rows:
            for tag, value in row.values.items():
                self.writer.add_scalar(tag, value, global_step=row.step, walltime=row.ts)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    name = "wandb"

    def __init__(self, cfg: TrackerConfig, run_id: str | None) -> None:
        import wandb

        settings = wandb.Settings(console="off", silent=True, disable_git=True, disable_code=True,
                                  disable_job_creation=True, save_code=False)  # fmt: skip
        self.run = wandb.init(mode="offline", dir=cfg.track_dir(), project=cfg.project, name=cfg.name(),
                              id=run_id, resume="allow", config={"run_dir": str(cfg.run_dir.resolve())},
                              settings=settings)  # fmt: skip
        self.run_id: str = self.run.id
        self._defined: set[str] = set()

    def write(self, rows: list[Row]) -> None:
        for row in rows:
            for tag in row.values.keys() - self._defined:
                self.run.define_metric(tag, step_metric=row.axis)
                self._defined.add(tag)
            self.run.log({**row.values, row.axis: row.step})

    def flush(self) -> None:
        """Nothing to do: wandb-core writes the run file on its own, and wholly at `finish`."""

    def close(self) -> None:
        self.run.finish()


class MLflow:
    name = "mlflow"

    def __init__(self, cfg: TrackerConfig, run_id: str | None) -> None:
        from mlflow import MlflowClient

        root = cfg.track_dir().resolve()
        self.client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
        self._pending: list[Any] = []
        if run_id:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(cfg.project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = (root / "mlflow-artifacts").as_uri()
            experiment_id = self.client.create_experiment(cfg.project, artifact_location=artifacts)
        tags = {"swarmrl.run_dir": str(cfg.run_dir.resolve())}
        self.run_id = self.client.create_run(experiment_id, run_name=cfg.name(), tags=tags).info.run_id

    def write(self, rows: list[Row]) -> None:
        from mlflow.entities import Metric

        for row in rows:
            ms = int(row.ts * 1000)
            self._pending.extend(Metric(tag, value, ms, row.step) for tag, value in row.values.items())

    def flush(self) -> None:
        for i in range(0, len(self._pending), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=self._pending[i : i + MLFLOW_BATCH])
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type[Backend]] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}
"""One per name of `config.TRACKERS`."""


def open_backends(cfg: TrackerConfig, run_ids: dict[str, str]) -> list[Backend]:
    """A backend per tracker of `cfg.track`, going on in the runs of `run_ids` (tracker -> id) if
    given. The libraries are imported here: each costs seconds."""
    cfg.track_dir().mkdir(parents=True, exist_ok=True)
    return [BACKENDS[name](cfg, run_ids.get(name)) for name in cfg.track]
