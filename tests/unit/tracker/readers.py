"""Each tracker's files read back with its own reader, as `{tag: [(step, value), ...]}` in write order.

- TensorBoard: `EventAccumulator`, TensorBoard's own loader of event files.
- MLflow: `MlflowClient` on the SQLite store.
- W&B: wandb 0.31 has no public reader of an offline run (`wandb.beta.LocalApi` is an open pull
  request, wandb/wandb#12745), and an offline run keeps its history only in its `.wandb` file. That
  file is a LevelDB-format log (32 KiB blocks, a 7-byte header per chunk) after a 7-byte W&B header;
  each record in it is wandb's own protobuf `Record`, which wandb's package decodes here.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Points = dict[str, list[tuple[int, float]]]


def tensorboard_points(log_dir: Path) -> Points:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()[SCALARS]}


def mlflow_points(db: Path, experiment: str = "swarmrl") -> tuple[list[str], Points]:
    """(run ids of `experiment`, the points of its only run)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db.resolve()}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} in {db}"
    runs = client.search_runs([exp.experiment_id])
    points: Points = {}
    if len(runs) == 1:
        run_id = runs[0].info.run_id
        for key in runs[0].data.metrics:
            history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
            points[key] = [(m.step, m.value) for m in history]
    return [r.info.run_id for r in runs], points


def _wandb_records(path: Path) -> Iterator[Any]:
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, chunks = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += block - pos % block
            continue
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE.../LAST
            record = Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_points(root: Path) -> tuple[list[str], Points]:
    """(run id of each offline run file under `root/wandb`, in start order; the points of all of them,
    each tag against the step metric `define_metric` gave it)."""
    ids, step_metric, points = [], {}, defaultdict(list)
    for path in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
            elif kind == "metric" and record.metric.step_metric:
                step_metric[record.metric.name] = record.metric.step_metric
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                for key, value in row.items():
                    if key in step_metric:
                        points[key].append((int(row[step_metric[key]]), float(value)))
    return ids, dict(points)
