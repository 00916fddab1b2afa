"""The wire contract: event and sample types, msgpack codec, subject and stream names."""

from swarmrl.schemas.codec import MAX_EVENT_BYTES, WireError, decode, decode_event, decode_sample, encode
from swarmrl.schemas.events import (
    SCHEMA_VERSION,
    AbortEvent,
    BeginEvent,
    EndEvent,
    EnvEvent,
    EvalResult,
    Event,
    EventBase,
    HeartbeatEvent,
    LlmEvent,
    MergeStats,
    ModelVersion,
    RewardEvent,
    Sample,
    TrainStep,
)

__all__ = [
    "MAX_EVENT_BYTES",
    "SCHEMA_VERSION",
    "AbortEvent",
    "BeginEvent",
    "EndEvent",
    "EnvEvent",
    "EvalResult",
    "Event",
    "EventBase",
    "HeartbeatEvent",
    "LlmEvent",
    "MergeStats",
    "ModelVersion",
    "RewardEvent",
    "Sample",
    "TrainStep",
    "WireError",
    "decode",
    "decode_event",
    "decode_sample",
    "encode",
]
