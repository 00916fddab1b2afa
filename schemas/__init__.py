"""The wire contract: event and sample types, msgpack codec, subject and stream names."""

# The names below are the package's API (re-exported: `from swarmrl.schemas import Sample`).
from swarmrl.schemas.codec import (
    MAX_EVENT_BYTES,
    WireError,
    decode,
    decode_event,
    decode_metric,
    decode_sample,
    encode,
)
from swarmrl.schemas.events import (
    DEFAULT_GROUP_SIZE,
    OUTCOME_REASONS,
    AbortEvent,
    ActionRequest,
    ActionResult,
    BeginEvent,
    ClientState,
    EndEvent,
    EnvEvent,
    EvalResult,
    Event,
    EventBase,
    GroupOutcome,
    HeartbeatEvent,
    LlmEvent,
    LostEpisode,
    MergeStats,
    MetricRecord,
    ModelVersion,
    RewardEvent,
    Sample,
    SampleDrops,
    TokenReply,
    TokenRequest,
    TrainStep,
)
