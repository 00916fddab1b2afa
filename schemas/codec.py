"""msgpack encode/decode with validation. Every decode failure is a `WireError` with a reason code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError

from swarmrl.schemas import subjects as S
from swarmrl.schemas.events import (
    SUPPORTED_VERSIONS,
    ActionResult,
    EvalResult,
    Event,
    GroupOutcome,
    MergeStats,
    MetricRecord,
    Sample,
    SampleDrops,
    TrainStep,
)

MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Events larger than this are dead-lettered (the bundled NATS config allows 8 MiB messages)."""

_EVENT = TypeAdapter(Event)
T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")


class WireError(ValueError):
    """A message that does not satisfy the wire contract.

    `code` is one of: `malformed` (not msgpack / not a map), `version` (unknown schema version),
    `schema` (fields missing or wrong), `oversized`, `subject` (payload disagrees with its subject).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def encode(record: BaseModel, exclude_none: bool = False) -> bytes:
    """`record` as a msgpack map (`exclude_none`: fields at None are left out, for replies whose
    readers test which keys are present)."""
    return msgpack.packb(record.model_dump(mode="python", exclude_none=exclude_none), use_bin_type=True)


def _unpack(data: bytes, max_bytes: int) -> dict[str, Any]:
    if len(data) > max_bytes:
        raise WireError("oversized", f"{len(data)} bytes > limit {max_bytes}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise WireError("malformed", f"not msgpack: {exc}") from exc
    if not isinstance(obj, dict):
        raise WireError("malformed", f"expected a msgpack map, got {type(obj).__name__}")
    v = obj.get("v")
    if v not in SUPPORTED_VERSIONS:
        raise WireError(
            "version", f"schema version {v!r} not supported (supported: {sorted(SUPPORTED_VERSIONS)})"
        )
    where = _binary_at(obj)
    if where is not None:
        raise WireError("schema", f"{where}: msgpack bin where a string is expected (send str)")
    return obj


_FLAT_TYPES = frozenset({int, float, str, bool, type(None)})
"""Element types of a list with nothing to look into (token ids, logprobs): skipped in one C loop."""


def _binary_at(obj: Any) -> str | None:
    """Path of a msgpack `bin` (bytes) in `obj`, if any: the contract has no binary fields, and
    validation would silently turn bytes into a str. Iterative: msgpack nests deeper than Python recurses."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, bytes):
            return path
        if isinstance(value, dict):
            for key, item in value.items():
                here = f"{path}.{key}" if path else str(key)
                if isinstance(key, bytes):
                    return f"{here} (a key)"
                stack.append((item, here))
        elif isinstance(value, list) and not _FLAT_TYPES.issuperset(map(type, value)):
            stack.extend((item, f"{path}.{i}") for i, item in enumerate(value))
    return None


def _validated(validate: Callable[[dict[str, Any]], R], obj: dict[str, Any]) -> R:
    try:
        return validate(obj)
    except ValidationError as exc:
        errors = (f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5])
        raise WireError("schema", "; ".join(errors)) from exc


def decode_event(data: bytes, max_bytes: int = MAX_EVENT_BYTES) -> Event:
    return _validated(_EVENT.validate_python, _unpack(data, max_bytes))


def decode(data: bytes, cls: type[T], max_bytes: int = 64 * 1024 * 1024) -> T:
    return _validated(cls.model_validate, _unpack(data, max_bytes))


def decode_sample(data: bytes) -> Sample:
    return decode(data, Sample)


def metric_type(subject: str) -> type[MetricRecord]:
    """The record a METRICS subject carries (compared against the names `schemas.subjects` builds);
    WireError `subject` for any other subject."""
    if subject == S.MERGE_METRICS_SUBJECT:
        return MergeStats
    if subject == S.ACTION_METRICS_SUBJECT:
        return ActionResult
    model = subject.rsplit(".", 1)[-1]
    try:
        if subject == S.train_metrics_subject(model):
            return TrainStep
        if subject == S.eval_metrics_subject(model):
            return EvalResult
        if subject == S.drops_metrics_subject(model):
            return SampleDrops
        if subject == S.outcome_subject(subject.rsplit(".", 2)[-2], model):
            return GroupOutcome
    except ValueError:  # the last token is not a valid model name
        pass
    raise WireError("subject", f"{subject!r} is not a metrics subject")


def decode_metric(subject: str, data: bytes) -> MetricRecord:
    """One METRICS message: the record its subject names, decoded and validated; a per-model record
    must be on its own model's subject (WireError `subject` otherwise)."""
    cls = metric_type(subject)
    record = decode(data, cls)
    model = getattr(record, "model", None)
    if model is not None and subject.rsplit(".", 1)[-1] != model:
        raise WireError("subject", f"{cls.__name__} of model {model} on subject {subject!r}")
    if isinstance(record, GroupOutcome) and subject != S.outcome_subject(record.owner, record.model):
        raise WireError("subject", f"outcome of owner {record.owner} on subject {subject!r}")
    return record
