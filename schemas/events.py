"""Typed records of the wire: episode events, training samples, metrics and model versions.

Every record is a flat msgpack map; field meanings are documented for other languages in
`schemas/README.md`. Validation is strict (`extra="forbid"`): a field we do not know is a contract
violation and goes to the dead-letter queue rather than being silently dropped. Every float field
(list and map elements included) must be finite (`allow_inf_nan=False`): one NaN reward or logprob
would make a whole GRPO group's advantages, or a step's loss, NaN.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})

DEFAULT_GROUP_SIZE = 8
"""Episodes per GRPO group where nothing sets it: the trainer's `num_repeat` default, and what
`SwarmClient.group` plays when no size is given."""

# Subject tokens cannot hold dots or spaces; ids and names appear in subjects.
SubjectToken = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


class Record(BaseModel):
    # Refused floats are `schema` errors naming the field: `llm.output_logprobs.3: Input should be a
    # finite number`. Records built in-process are checked too, so no service can publish one.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    v: int = SCHEMA_VERSION


class EventBase(Record):
    episode_id: SubjectToken
    """Episode this event belongs to; also the third token of its subject."""
    seq: int = Field(ge=0)
    """Strictly increasing per (episode_id, client_id); the SDK's begin is 0."""
    ts: float = Field(default_factory=time.time)
    """Unix time in seconds when the event was created."""
    client_id: str = Field(min_length=1, max_length=256)
    """Who published: an agent process id, or `gateway-<uuid>` for llm events."""
    client_version: str = Field(default="", max_length=256)
    """Code version of the publishing client (git sha, content hash, tag)."""

    @property
    def msg_id(self) -> str:
        """JetStream `Nats-Msg-Id`: republishing the same event is deduplicated by the server."""
        return f"{self.episode_id}.{self.client_id}.{self.seq}"


class BeginEvent(EventBase):
    kind: Literal["begin"] = "begin"
    task_id: str = Field(min_length=1, max_length=256)
    """Task (prompt) identity; GRPO groups are formed over episodes of the same group key."""
    group_key: str = ""
    """Group for advantage normalisation; empty means task_id."""
    group_size: int = Field(default=0, ge=0, le=1_000_000)
    """Episodes the client plays in this group (its GRPO group size); the trainer forms the group from
    that many. 0: not declared, the trainer's own `num_repeat` applies."""
    task: dict[str, Any] = Field(default_factory=dict)
    """Free-form task description (name, params), recorded by the ledger."""
    models: list[SubjectToken] = Field(default_factory=list)
    """Models this episode may call."""
    agents: list[str] = Field(default_factory=list)
    """Agent names taking part (a team may have several, each with its own model)."""
    eval: bool = False
    """Evaluation episode: recorded, never trained on."""

    @property
    def group(self) -> str:
        return self.group_key or self.task_id


class LlmEvent(EventBase):
    kind: Literal["llm"] = "llm"
    call_id: str
    """Unique id of the chat completion (`chatcmpl-...`)."""
    agent: str
    """Agent name from the episode token."""
    model: SubjectToken
    """Trainable model that generated the output."""
    prompt_ids: list[int]
    """Exact token ids sent to the engine."""
    output_ids: list[int]
    """Exact generated token ids (stop token included when the engine produced one)."""
    output_logprobs: list[float]
    """Behaviour log-probability of each output id, same length as output_ids."""
    policy_version: int
    """Weight version of the engine that generated the output."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The OpenAI messages of the request (text-level merging and the ledger use them)."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    output_text: str = ""
    finish_reason: str = "stop"

    @model_validator(mode="after")
    def _lengths(self) -> LlmEvent:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"output_ids has {len(self.output_ids)} ids but output_logprobs has {len(self.output_logprobs)}"
            )
        return self


class EnvEvent(EventBase):
    kind: Literal["env"] = "env"
    agent: str = ""
    name: str = "step"
    data: dict[str, Any] = Field(default_factory=dict)
    """Free-form environment observation/action record."""


class RewardEvent(EventBase):
    kind: Literal["reward"] = "reward"
    value: float
    """Reward; several reward events in one episode add up (per agent). Finite, like every float."""
    agent: str = ""
    """Agent the reward is for; empty means every agent of the episode."""
    name: str = "reward"


class EndEvent(EventBase):
    kind: Literal["end"] = "end"
    metrics: dict[str, float] = Field(default_factory=dict)
    """Client-side metrics of the finished episode (turns, success, ...)."""


class AbortEvent(EventBase):
    kind: Literal["abort"] = "abort"
    reason: str = ""


class HeartbeatEvent(EventBase):
    kind: Literal["heartbeat"] = "heartbeat"


Event = Annotated[
    BeginEvent | LlmEvent | EnvEvent | RewardEvent | EndEvent | AbortEvent | HeartbeatEvent,
    Field(discriminator="kind"),
]


class Sample(Record):
    """One merged timeline of one agent: the unit the trainer learns from."""

    sample_id: str
    """`<episode_id>.<agent>.<model>.<index>`: unique across the episode's models, the same on a
    replay; also the Nats-Msg-Id, so republishing is deduplicated."""
    model: SubjectToken
    episode_id: SubjectToken
    agent: str
    task_id: str
    group_key: str
    group_size: int = Field(default=0, ge=0, le=1_000_000)
    """The begin event's `group_size` (0: not declared)."""
    task: str = ""
    """Task name for per-task metrics (cocktail training): the begin event's `task["name"]` when it
    is a string, else empty."""
    client_id: str = ""
    client_version: str = ""
    token_ids: list[int]
    loss_mask: list[int]
    """1 exactly on tokens the model generated, 0 on prompt/environment tokens."""
    logprobs: list[float]
    """Behaviour logprob per token (0.0 where loss_mask is 0); finite, like every float."""
    policy_versions: list[int]
    """Weight version that generated each token (-1 where loss_mask is 0)."""
    reward: float
    index: int = 0
    """Position (call order) of this sample among the episode's samples for this (agent, model)."""
    n_samples: int = 1
    """How many samples this episode produced for this (agent, model): a trainer sees only its own
    model's samples, and waits for this many of each agent."""
    n_calls: int = 1
    """How many LLM calls this timeline absorbed."""
    ts: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _lengths(self) -> Sample:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "policy_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, token_ids has {n}")
        return self


class TrainStep(Record):
    model: SubjectToken
    step: int
    policy_version: int
    loss: float
    reward_mean: float
    reward_std: float
    samples: int
    tokens: int
    trained_tokens: int
    tokens_per_s: float
    staleness_mean: float
    staleness_max: int
    wall_s: float
    extra: dict[str, float] = Field(default_factory=dict)
    sample_ids: list[str] = Field(default_factory=list)
    """The samples this step trained. A sample is trained at most once in a run."""
    dropped: dict[str, str] = Field(default_factory=dict)
    """Samples dropped untrained since the previous step, with the reason (`stale`, `dropped_group`,
    `timed_out`, a group status such as `zero_adv`, `nonfinite`); the trainer acks them only once
    reported here, so every sample is either trained, dropped with a reason, or still pending."""
    ts: float = Field(default_factory=time.time)


class SampleDrops(Record):
    """Samples a trainer dropped untrained, reported (then acked) without waiting for its next step:
    held until a step, they would count as backlog for admission control, which then holds the new
    groups the next step needs (a deadlock)."""

    model: SubjectToken
    step: int
    """The trainer's last step when it dropped them."""
    dropped: dict[str, str] = Field(default_factory=dict)
    """Sample id -> reason, as in `TrainStep.dropped`."""
    ts: float = Field(default_factory=time.time)


OUTCOME_REASONS = {
    "zero_adv": "all its rewards were equal, so it has no learning signal; make rewards differ within a "
    "group (partial credit, instances neither always solved nor never)",
    "stale": "its samples were more policy versions old than the trainer's max_staleness",
    "too_small": "fewer of its episodes than the trainer's min_group_size were left",
    "timeout": "it was still short of its size at the trainer's group_timeout_s; play whole groups",
    "failed_episodes": "too few of its episodes completed (aborted, timed out or empty)",
    "rolled_back": "a version the collapse guard threw away generated it",
    "nonfinite": "a reward was not finite",
}
"""A `GroupOutcome.reason` -> what it means to the agent's author."""


class GroupOutcome(Record):
    """What became of one GRPO group a client played, for one model: published by that model's
    trainer on `swarm.metrics.outcome.<owner>.<model>` once it decides (the step that trained it, or
    the drop), which only `owner`'s identity may read (`subjects.agent_permissions`)."""

    model: SubjectToken
    owner: SubjectToken
    """The NATS identity whose episodes the group holds (the owner of its episode ids)."""
    group_key: str
    task: str = ""
    """The group's task name (`Sample.task`)."""
    client_id: str = ""
    outcome: Literal["trained", "dropped"]
    reason: str = ""
    """Why it was dropped, a key of `OUTCOME_REASONS`; "" when trained."""
    step: int
    """The step that trained it; for a drop, the trainer's last step."""
    reward_std: float = 0.0
    """Population standard deviation of its episodes' rewards (0: all equal)."""
    episodes: int = 0
    ts: float = Field(default_factory=time.time)


class EvalResult(Record):
    model: SubjectToken
    step: int
    task: str
    success_rate: float
    n: int
    temperature: float = 0.0
    """Sampling temperature of the eval episodes (0 = greedy)."""
    metric: str = "success"
    """What `success_rate` measures: `success` (the task's outcome) or a role's own metric in a
    multi-model team task (e.g. `caller_valid`), averaged over the episodes where it is defined."""
    ts: float = Field(default_factory=time.time)


class MergeStats(Record):
    episode_id: SubjectToken
    status: Literal["merged", "aborted", "timeout", "empty"]
    agents: int = 0
    calls: int = 0
    timelines_kept: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    trained_tokens_before: int = 0
    trained_tokens_after: int = 0
    reason: str = ""
    group_key: str = ""
    """The episode's GRPO group (begin's `group_key`, else its `task_id`): a trainer counts a dropped
    episode out of its group instead of waiting for it until the group timeout."""
    models: list[str] = Field(default_factory=list)
    """The episode's trainable models (from begin)."""
    sample_models: list[str] | None = None
    """Models that got samples from this episode (None from a merger that predates the field); a team
    episode's model without samples (its role never acted) counts it out of its group."""
    eval: bool = False
    """An evaluation episode (never trained on)."""
    ts: float = Field(default_factory=time.time)


class LostEpisode(Record):
    """A training episode that will never send `model` a sample: the merger dropped it (aborted, timed
    out, empty) or `model`'s role in it never acted. In SAMPLES beside the samples (`lost_subject`), so
    the trainer learns of it in stream order and counts it out of its GRPO group."""

    episode_id: SubjectToken
    model: SubjectToken
    group_key: str
    """The episode's GRPO group (begin's `group_key`, else its `task_id`)."""
    status: Literal["merged", "aborted", "timeout", "empty"]
    """The episode's merge status (`merged`: merged, but none of its samples is this model's)."""
    reason: str = ""
    ts: float = Field(default_factory=time.time)


ActionKind = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
ActionStatus = Literal["ok", "error", "timeout", "killed", "rejected"]


class ActionRequest(Record):
    """An agent asks the actions service to run one action: a request on `swarm.act.<owner>`, answered
    with an `ActionResult`. `op="end"` tells the service that the episode's trajectory is over (the
    `static` policy frees the units it held for it); it is answered too."""

    op: Literal["run", "end"] = "run"
    action_id: SubjectToken
    """Unique per episode; a retry with the same id is answered with the first run's result."""
    episode_id: SubjectToken
    """The episode (trajectory) the action belongs to; it must be the asking client's own."""
    kind: ActionKind = "python"
    """Which resource manager runs it: `python` (code sandbox) or `judge` (model judge)."""
    payload: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific: python {"code", "stdin"?, "cases"? (a test suite)}; judge {"prompt", "text"}."""
    cpu: int = Field(default=1, ge=0, le=64)
    """CPU units held while it runs."""
    mem_mb: int = Field(default=256, ge=1, le=65536)
    """Memory reserved, and enforced as its limit."""
    accel: int = Field(default=0, ge=0, le=64)
    """Accelerator slots held while it runs."""
    hint_s: float | None = Field(default=None, ge=0, le=86400)
    """The caller's guess of the run time; the scheduler learns its own per kind."""
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    """Wall-clock limit of the run (the manager's default when None)."""


class ActionResult(Record):
    """How one action ended, with its timings: the reply to an `ActionRequest`, and (published on
    `swarm.metrics.action`) the ledger's `actions` row."""

    action_id: str
    episode_id: str
    kind: str
    status: ActionStatus
    """ok: it ran (python: see `result.exit_code`); error: it could not run or crashed; timeout: past
    its wall-clock limit; killed: past a resource limit (CPU time, memory, processes); rejected: bad
    input, never ran."""
    result: dict[str, Any] = Field(default_factory=dict)
    """python: stdout, stderr, exit_code; judge: score, tokens."""
    error: str = ""
    queued_s: float = 0.0
    """From arrival to the start of its run (waiting for units)."""
    run_s: float = 0.0
    act_s: float = 0.0
    """Action completion time: arrival to result (queued + run + dispatch overheads)."""
    cpu: int = 0
    mem_mb: int = 0
    accel: int = 0
    units: int = 0
    """Units of its resource that were allocated in the pool when it started (elastic pool size)."""
    policy: str = ""
    owner: str = ""
    ts: float = Field(default_factory=time.time)


MetricRecord = TrainStep | SampleDrops | EvalResult | MergeStats | ActionResult | GroupOutcome
"""What the METRICS stream carries (`swarm.metrics.>`); `codec.decode_metric` tells them apart by subject."""


class ClientState(Record):
    """Value of KV `swarm-clients[<owner>]`: where a client is in its task streams, so that a restarted
    client continues them instead of replaying their first instances (put after every instance drawn)."""

    seed: int
    """Seed of the streams; a client started with another seed starts its streams over."""
    rounds: int = Field(ge=0)
    """Groups begun so far (each plays one instance): the next group is round `rounds + 1`."""
    drawn: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """Task name -> instances drawn from that task's stream; a restart skips that many."""
    ts: float = Field(default_factory=time.time)


class TokenRequest(Record):
    """Request on `swarm.auth.token.<name>` (request/reply): the API tokens of one of the asker's own
    episodes, one per agent (schemas/README.md "Episode tokens")."""

    episode_id: str
    """The episode; it must be the asker's (its id starts with the asker's name)."""
    agents: list[str] = Field(default_factory=list)
    """Agent names of the episode; default: the keys of `agent_models`, else `["agent"]`."""
    models: list[str] = Field(default_factory=list)
    """Models the episode may call; default: the union of `agent_models`. None at all is refused."""
    agent_models: dict[str, list[str]] = Field(default_factory=dict)
    """Agent -> the models its token names; an agent not listed gets all of `models`."""
    ttl_s: float = 3600.0
    """Token lifetime, above 0 and at most the gateway's maximum."""
    group_key: str = ""
    """The episode's GRPO group (`begin`'s `group_key`, or its `task_id`): groups are admitted whole."""
    task: str = ""
    """The task's name; a gateway that mixes tasks by weight needs it for a training episode."""
    eval: bool = False
    """A held-out episode: always admitted, never trained on."""
    client_id: str = ""
    client_version: str = ""


class TokenReply(Record):
    """Reply to a `TokenRequest`: `tokens` (agent -> token) with `base_url`, or `retry_after_s` (the
    gateway holds new groups: ask again that much later), or `error` (why the request is refused).
    Fields that do not apply are left out of the map."""

    tokens: dict[str, str] | None = None
    base_url: str | None = None
    """The OpenAI-compatible endpoint the tokens are for."""
    retry_after_s: float | None = None
    error: str | None = None


class ModelVersion(Record):
    """Value of KV `swarm-models[<model>]`: the weights an engine should serve."""

    version: int
    path: str
    step: int = 0
    updated_at: float = Field(default_factory=time.time)
