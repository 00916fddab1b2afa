"""The ledger's tables: one Arrow schema per table and the functions that turn records into rows.

Pure logic. Every row carries `stream` and `stream_seq`, the JetStream position of its message,
which makes restarts exact (`service.py`). Columns are documented in `services/ledger/README.md`.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

import pyarrow as pa
import pydantic_core

from swarmrl.schemas import (
    ActionResult,
    EvalResult,
    Event,
    GroupOutcome,
    MergeStats,
    MetricRecord,
    Sample,
    SampleDrops,
    TrainStep,
    WireError,
)
from swarmrl.schemas import subjects as S

STR, I64, F64, BOOL, BLOB = pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.binary()
INTS, FLOATS, STRS = pa.list_(I64), pa.list_(F64), pa.list_(STR)

Row = dict[str, Any]


def _schema(*columns: tuple[str, pa.DataType]) -> pa.Schema:
    """Every row starts with the position of the message it came from."""
    return pa.schema([("stream", STR), ("stream_seq", I64), *columns])


# fmt: off
_EVENT_BASE = [("v", I64), ("episode_id", STR), ("seq", I64), ("ts", F64), ("client_id", STR),
               ("client_version", STR)]
TABLES: dict[str, pa.Schema] = {
    "events": _schema(
        *_EVENT_BASE,
        ("kind", STR),
        # begin
        ("task_id", STR), ("group_key", STR), ("group_size", I64), ("task", STR), ("models", STRS),
        ("agents", STRS), ("eval", BOOL),
        # env / reward
        ("agent", STR), ("name", STR), ("data", STR), ("value", F64),
        # end / abort
        ("metrics", STR), ("reason", STR),
    ),
    "llm_calls": _schema(
        *_EVENT_BASE,
        ("call_id", STR), ("agent", STR), ("model", STR), ("policy_version", I64), ("prompt_ids", INTS),
        ("output_ids", INTS), ("output_logprobs", FLOATS), ("n_prompt", I64), ("n_output", I64),
        ("messages", STR), ("tools", STR), ("output_text", STR), ("finish_reason", STR),
    ),
    "samples": _schema(
        ("v", I64), ("sample_id", STR), ("model", STR), ("episode_id", STR), ("agent", STR),
        ("task_id", STR), ("group_key", STR), ("group_size", I64), ("task", STR), ("client_id", STR),
        ("client_version", STR), ("token_ids", INTS), ("loss_mask", INTS), ("logprobs", FLOATS),
        ("policy_versions", INTS), ("reward", F64), ("index", I64), ("n_samples", I64), ("n_calls", I64),
        ("n_tokens", I64), ("n_trained", I64), ("ts", F64),
    ),
    "lost_episodes": _schema(
        ("v", I64), ("episode_id", STR), ("model", STR), ("group_key", STR), ("status", STR),
        ("reason", STR), ("ts", F64),
    ),
    "train_steps": _schema(
        ("v", I64), ("model", STR), ("step", I64), ("policy_version", I64), ("loss", F64),
        ("reward_mean", F64), ("reward_std", F64), ("samples", I64), ("tokens", I64),
        ("trained_tokens", I64), ("tokens_per_s", F64), ("staleness_mean", F64), ("staleness_max", I64),
        ("wall_s", F64), ("extra", STR), ("sample_ids", STR), ("dropped", STR), ("ts", F64),
    ),
    "sample_drops": _schema(("v", I64), ("model", STR), ("step", I64), ("dropped", STR), ("ts", F64)),
    "group_outcomes": _schema(
        ("v", I64), ("model", STR), ("owner", STR), ("group_key", STR), ("task", STR), ("client_id", STR),
        ("outcome", STR), ("reason", STR), ("step", I64), ("reward_std", F64), ("episodes", I64),
        ("ts", F64),
    ),
    "evals": _schema(
        ("v", I64), ("model", STR), ("step", I64), ("task", STR), ("success_rate", F64), ("n", I64),
        ("temperature", F64), ("metric", STR), ("ts", F64),
    ),
    "merges": _schema(
        ("v", I64), ("episode_id", STR), ("status", STR), ("agents", I64), ("calls", I64),
        ("timelines_kept", I64), ("tokens_before", I64), ("tokens_after", I64),
        ("trained_tokens_before", I64), ("trained_tokens_after", I64), ("reason", STR), ("group_key", STR),
        ("models", STRS), ("sample_models", STRS), ("eval", BOOL), ("ts", F64),
    ),
    "actions": _schema(
        ("v", I64), ("action_id", STR), ("episode_id", STR), ("kind", STR), ("status", STR),
        ("result", STR), ("error", STR), ("queued_s", F64), ("run_s", F64), ("act_s", F64), ("cpu", I64),
        ("mem_mb", I64), ("accel", I64), ("units", I64), ("policy", STR), ("owner", STR), ("ts", F64),
    ),
    "dead_letters": _schema(
        ("service", STR), ("subject", STR), ("code", STR), ("reason", STR), ("data", BLOB), ("size", I64),
        ("dlq_subject", STR), ("ts", F64),
    ),
}
# fmt: on

# Which tables each stream feeds; a flush writes one stream's tables together (see store.py).
STREAM_TABLES: dict[str, tuple[str, ...]] = {
    S.EPISODES_STREAM: ("events", "llm_calls"),
    S.SAMPLES_STREAM: ("samples", "lost_episodes"),
    S.METRICS_STREAM: ("train_steps", "sample_drops", "evals", "merges", "actions", "group_outcomes"),
    S.DLQ_STREAM: ("dead_letters",),
}

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
# Integer columns per table: pydantic accepts unbounded Python ints, Arrow does not. Checking them
# when the row is built turns a huge int into one dead letter instead of a failed flush of a batch.
_INT_COLS = {t: [f.name for f in s if f.type == I64] for t, s in TABLES.items()}
NUMERIC_LISTS = {
    t: {f.name: "q" if f.type == INTS else "d" for f in s if f.type in (INTS, FLOATS)}
    for t, s in TABLES.items()
}
"""Token ids, masks, logprobs: kept as `array.array` (typecode per column) from row building to Arrow,
so the flush converts them without touching each value in Python (`columns.TableBuffer`)."""
# Free-form maps/lists are stored as JSON text (query them with DuckDB's `->>` / json functions).
_JSON_FIELDS = {
    "events": ("task", "data", "metrics"),
    "llm_calls": ("messages", "tools"),
    "train_steps": ("extra", "sample_ids", "dropped"),
    "actions": ("result",),
    "sample_drops": ("dropped",),
}


def to_json(obj: object) -> str:
    """JSON text of a free-form field; bytes (msgpack bin) become base64 strings."""
    if obj == [] or obj == {}:  # most tools lists and many data maps are empty
        return "[]" if isinstance(obj, list) else "{}"
    try:
        # pydantic-core's serializer: the same JSON as the stdlib's, at a quarter of its CPU.
        return pydantic_core.to_json(obj, bytes_mode="base64").decode()
    except (pydantic_core.PydanticSerializationError, ValueError) as exc:
        raise WireError("schema", f"free-form field is not JSON-representable: {exc}") from exc


def check_ints(table: str, row: Row) -> Row:
    """Pack the numeric lists of `row` into arrays; raise WireError('schema') if an int exceeds int64."""
    for col in _INT_COLS[table]:
        x = row.get(col)
        if x is not None and not _I64_MIN <= x <= _I64_MAX:
            raise WireError("schema", f"{table}.{col} = {x} does not fit in 64 bits")
    for col, typecode in NUMERIC_LISTS[table].items():
        values = row[col]
        try:
            # Through struct: a third of the CPU of `array(typecode, values)`, which converts value by value.
            row[col] = array(typecode, struct.pack(f"{len(values)}{typecode}", *values))
        except (struct.error, OverflowError) as exc:
            raise WireError("schema", f"{table}.{col} holds a value that does not fit in 64 bits") from exc
    return row


def record_row(table: str, record: Any, stream: str, seq: int) -> Row:
    """The row of a pydantic `record` in `table`: its fields, free-form ones as JSON, and its position."""
    row: Row = dict(record.__dict__)  # the fields' values: much cheaper than model_dump
    for key in _JSON_FIELDS.get(table, ()):
        if key in row:
            row[key] = to_json(row[key])
    row["stream"], row["stream_seq"] = stream, seq
    return check_ints(table, row)


def event_row(ev: Event, stream: str, seq: int) -> tuple[str, Row]:
    """The (table, row) of one episode event: `llm_calls` for llm events, `events` for the rest."""
    if ev.kind == "llm":
        row = record_row("llm_calls", ev, stream, seq)
        row["n_prompt"], row["n_output"] = len(ev.prompt_ids), len(ev.output_ids)
        return "llm_calls", row
    return "events", record_row("events", ev, stream, seq)


def sample_row(sample: Sample, stream: str, seq: int) -> Row:
    row = record_row("samples", sample, stream, seq)
    row["n_tokens"], row["n_trained"] = len(sample.token_ids), sum(row["loss_mask"])
    if not _I64_MIN <= row["n_trained"] <= _I64_MAX:  # a mask is 0/1 by contract; this one is not
        raise WireError("schema", f"samples.loss_mask sums to {row['n_trained']}, beyond 64 bits")
    return row


METRIC_TABLES: dict[type, str] = {
    TrainStep: "train_steps", SampleDrops: "sample_drops", EvalResult: "evals", MergeStats: "merges",
    ActionResult: "actions", GroupOutcome: "group_outcomes",
}  # fmt: skip


def metric_row(record: MetricRecord, stream: str, seq: int) -> tuple[str, Row]:
    table = METRIC_TABLES[type(record)]
    return table, record_row(table, record, stream, seq)


def dead_letter_row(
    *,
    subject: str,
    data: bytes,
    service: str,
    original_subject: str,
    reason: str,
    ts: float,
    stream: str,
    seq: int,
) -> Row:
    return {
        "stream": stream,
        "stream_seq": seq,
        "service": service,
        "subject": original_subject,
        "code": reason.split(":", 1)[0],
        "reason": reason,
        "data": data,
        "size": len(data),
        "dlq_subject": subject,
        "ts": ts,
    }


def duckdb_type(t: pa.DataType) -> str:
    """DuckDB spelling of an Arrow type used in TABLES (for the typed empty views)."""
    names = {STR: "VARCHAR", I64: "BIGINT", F64: "DOUBLE", BOOL: "BOOLEAN", BLOB: "BLOB"}
    return names[t.value_type] + "[]" if pa.types.is_list(t) else names[t]
