"""Every NATS subject, stream, consumer and bucket name swarmrl uses. No other module spells one out.

Names are fixed by the wire contract (`schemas/README.md`): an agent in any language publishes to
`swarm.ep.<owner>.<episode_id>.<kind>`, so these strings are part of the public API.

Ownership: every agent client has its own NATS identity, a name (`owner`) of [A-Za-z0-9-]. Its
episode ids are `<owner>` or `<owner>_<anything>`, and the server lets it publish only under
`swarm.ep.<owner>.>` (see `agent_permissions`). Consumers check that the owner token and the episode
id agree (`NotOwnerError`), so no client can write into an episode it did not begin.
"""

from __future__ import annotations

import functools
import re

# Streams ---------------------------------------------------------------------------------------
EPISODES_STREAM = "EPISODES"
SAMPLES_STREAM = "SAMPLES"
METRICS_STREAM = "METRICS"
DLQ_STREAM = "DLQ"

EPISODE_PREFIX = "swarm.ep"
SAMPLES_PREFIX = "swarm.samples"
METRICS_PREFIX = "swarm.metrics"
DLQ_PREFIX = "swarm.dlq"

STREAM_SUBJECTS: dict[str, list[str]] = {
    EPISODES_STREAM: [f"{EPISODE_PREFIX}.>"],
    SAMPLES_STREAM: [f"{SAMPLES_PREFIX}.>"],
    METRICS_STREAM: [f"{METRICS_PREFIX}.>"],
    DLQ_STREAM: [f"{DLQ_PREFIX}.>"],
}

# Episode partitions: EPISODE_PARTS sources every EPISODES message under `swarm.epp.<p>.<owner>.<id>.<kind>`,
# p = JetStream's own deterministic partition of (owner, episode id) into EPISODE_PARTITIONS. Mergers
# consume it, one consumer per partition, so every event of an episode reaches the one merger replica
# that owns its partition (`services/common/leases.py`). A work queue: an event is gone once merged.
EPISODE_PARTS_STREAM = "EPISODE_PARTS"
PARTITION_PREFIX = "swarm.epp"
EPISODE_PARTITIONS = 16
"""Fixed for the life of a stream (changing it would move open episodes between partitions): the most
merger replicas that can share the work."""
EPISODE_PARTITION_TRANSFORM = (
    f"{EPISODE_PREFIX}.*.*.*",
    f"{PARTITION_PREFIX}.{{{{partition({EPISODE_PARTITIONS},1,2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}",
)
"""(source, destination) of the subject transform that partitions EPISODES into EPISODE_PARTS."""


# LEDGER_PARTS: the same partitions again, for ledger replicas (`swarmrl up` creates it when
# `[replicas] ledger` > 1). A second work queue, because a work queue allows one consumer per subject.
LEDGER_PARTS_STREAM = "LEDGER_PARTS"
LEDGER_PARTITION_PREFIX = "swarm.lep"
LEDGER_PARTITION_TRANSFORM = (
    EPISODE_PARTITION_TRANSFORM[0],
    EPISODE_PARTITION_TRANSFORM[1].replace(PARTITION_PREFIX, LEDGER_PARTITION_PREFIX, 1),
)


def partition_filter(partition: int, prefix: str = PARTITION_PREFIX) -> str:
    """The subjects of one partition (of EPISODE_PARTS; with `LEDGER_PARTITION_PREFIX`, of LEDGER_PARTS)."""
    if not 0 <= partition < EPISODE_PARTITIONS:
        raise ValueError(f"partition {partition} out of range 0..{EPISODE_PARTITIONS - 1}")
    return f"{prefix}.{partition}.>"


def unpartitioned(subject: str) -> str:
    """The EPISODES subject an EPISODE_PARTS or LEDGER_PARTS subject was sourced from (others unchanged)."""
    if not subject.startswith((PARTITION_PREFIX + ".", LEDGER_PARTITION_PREFIX + ".")):
        return subject
    return f"{EPISODE_PREFIX}.{subject.split('.', 3)[3]}"


# Request/reply (core NATS, not stored) -----------------------------------------------------------
TOKEN_PREFIX = "swarm.auth.token"  # swarm.auth.token.<owner>: the gateway mints episode tokens
TOKEN_REQUESTS = f"{TOKEN_PREFIX}.*"
LLM_PREFIX = "swarm.llm"  # swarm.llm.<model>: chat completion over NATS request/reply
CONTROL_PREFIX = "swarm.ctl"  # swarm.ctl.<verb>: operator control; never open to agents
LEDGER_QUERY = f"{CONTROL_PREFIX}.query"  # SQL to a ledger, answered from its files (ledger/remote.py)
MICRO_PREFIX = "$SRV"  # nats.micro's discovery and stats subjects (PING, INFO, STATS) of every service
ACT_PREFIX = "swarm.act"  # swarm.act.<owner>: an agent's actions (ActionRequest -> ActionResult)
ACT_REQUESTS = f"{ACT_PREFIX}.*"
GATEWAY_CALLS = "swarm.gw.calls"  # the gateways' tallies of the calls each served (gateway/episodes.py)
LEAD_PREFIX = "swarm.lead"  # swarm.lead.trainer.<model>: the leading trainer answers (trainer/lead.py)


def lead_subject(model: str) -> str:
    """Where `model`'s leading trainer answers, so its standby hears at once when it is gone."""
    return f"{LEAD_PREFIX}.trainer.{check_token(model, 'model')}"


def lead_key(model: str) -> str:
    """`model`'s trainer lead lease, a key of KV `swarm-leases`."""
    return f"trainer.lead.{check_token(model, 'model')}"


# Action work queue (services only): the scheduler releases an action to `swarm.actions.run.<kind>`
# once its units are free; workers (in the service or `swarmrl serve action-worker` anywhere) pull
# it, run it and publish the result to `swarm.actions.done.<action key>`; capacity is announced on
# `swarm.actions.workers`.
ACTIONS_STREAM = "ACTIONS"
ACTION_RUN_PREFIX = "swarm.actions.run"
ACTION_DONE_PREFIX = "swarm.actions.done"
ACTION_WORKERS_SUBJECT = "swarm.actions.workers"
WORK_STREAM_SUBJECTS: dict[str, list[str]] = {ACTIONS_STREAM: [f"{ACTION_RUN_PREFIX}.>"]}
"""Work-queue streams: each message is removed once a worker acks it; not recorded by the ledger."""

# KV buckets ------------------------------------------------------------------------------------
MODELS_BUCKET = "swarm-models"  # key: model name, value: ModelVersion (msgpack)
GROUPS_BUCKET = "swarm-groups"  # the gateways' admitted groups and task activity (gateway/admission.py)
LEASES_BUCKET = "swarm-leases"
"""Replicas' partition leases and presence (`services/common/leases.py`): `<service>.lease.<p>` and
`<service>.member.<replica>`, each expiring unless its holder renews it (the bucket's TTL)."""
WEIGHTS_BUCKET = "swarm-weights"
"""Object store: each version's served files, for engines on other hosts (`services/common/objects.py`)."""
CLIENTS_BUCKET = "swarm-clients"  # key: a client's owner name, value: ClientState (msgpack)
"""Where each client keeps its place (e.g. its position in its task stream) across restarts. An agent
reaches only its own key, through NATS's own KV subjects (`client_state_subjects`): the services
account exports them, and an agent's permissions name its key alone."""

# Names -----------------------------------------------------------------------------------------
EPISODE_KINDS = ("begin", "llm", "env", "reward", "end", "abort", "heartbeat")
# Kinds an agent credential may publish; `llm` is written by the gateway only.
AGENT_EPISODE_KINDS = ("begin", "env", "reward", "end", "abort", "heartbeat")

_EPISODE_PREFIX_PARTS = EPISODE_PREFIX.split(".")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_OWNER_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")
INBOX_PREFIX = "_INBOX"


class NotOwnerError(ValueError):
    """An episode subject whose owner token is not the owner of its episode id."""


def check_token(value: str, what: str) -> str:
    """Return `value` if it is usable as one NATS subject token, else raise ValueError."""
    if not _TOKEN_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid subject token: use 1-128 of [A-Za-z0-9_-] (no dots, spaces)"
        )
    return value


def check_owner(name: str) -> str:
    """Return `name` if it can name an agent client (1-64 of [A-Za-z0-9-]), else raise ValueError."""
    if not _OWNER_RE.match(name):
        raise ValueError(f"client name {name!r} is not valid: use 1-64 of [A-Za-z0-9-] (no '_', no dots)")
    return name


def owner_name(text: str) -> str:
    """A valid client name made from any text (other characters become `-`)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", text)[:64] or "client"


EVALUATOR = "evaluator"
"""The identity of `up`'s held-out evaluator, which plays every task's evaluation episodes."""


def plays_own_task(owner: str, task: str) -> bool:
    """Whether identity `owner` is one of the swarm's own clients of `task` (`up` names them
    `<task>-<i>`, with `-g<n>` from restart generation n on: `swarmrl/launch.py`) or its
    evaluator: an identity that may send episodes of a task the swarm's clients play."""
    prefix = owner_name(f"{task}-")
    return owner == EVALUATOR or (
        owner.startswith(prefix) and re.fullmatch(r"\d+(-g\d+)?", owner[len(prefix) :]) is not None
    )


@functools.lru_cache(maxsize=4096)  # every event of an episode asks again (the ledger, per event)
def episode_owner(episode_id: str) -> str:
    """The client that owns `episode_id`: the part before the first `_` (the whole id if none)."""
    return check_owner(check_token(episode_id, "episode id").split("_", 1)[0])


def new_episode_id(owner: str, unique: str) -> str:
    return f"{check_owner(owner)}_{unique}"


def episode_subject(episode_id: str, kind: str) -> str:
    if kind not in EPISODE_KINDS:
        raise ValueError(f"unknown episode event kind {kind!r}; expected one of {EPISODE_KINDS}")
    return f"{EPISODE_PREFIX}.{episode_owner(episode_id)}.{episode_id}.{kind}"


def episode_filter(episode_id: str = "*", kind: str = "*") -> str:
    """A subscription filter: one episode's events (or every episode's), of one kind (or all)."""
    owner = "*" if episode_id == "*" else episode_owner(episode_id)
    return f"{EPISODE_PREFIX}.{owner}.{episode_id}.{kind}"


def parse_episode_subject(subject: str) -> tuple[str, str]:
    """Split `swarm.ep.<owner>.<id>.<kind>` into (episode_id, kind); ValueError if it is not one,
    NotOwnerError if `<owner>` does not own `<id>`."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[:2] != _EPISODE_PREFIX_PARTS or parts[4] not in EPISODE_KINDS:
        raise ValueError(f"not an episode subject: {subject!r}")
    owner, episode_id, kind = parts[2:]
    if episode_owner(episode_id) != owner:
        raise NotOwnerError(f"client {owner!r} does not own episode {episode_id!r} ({subject})")
    return episode_id, kind


def token_subject(owner: str) -> str:
    return f"{TOKEN_PREFIX}.{check_owner(owner)}"


def inbox_prefix(owner: str) -> str:
    """The only inbox prefix `owner` may subscribe under (its NATS client's `inbox_prefix`)."""
    return f"{INBOX_PREFIX}.{check_owner(owner)}"


def act_subject(owner: str) -> str:
    return f"{ACT_PREFIX}.{check_owner(owner)}"


def client_state_subjects(owner: str) -> tuple[str, str]:
    """(put, get) subjects of `owner`'s key in KV `swarm-clients`: a JetStream publish to the first
    stores a value; a direct get on the second (empty request) answers the latest one."""
    key = f"$KV.{CLIENTS_BUCKET}.{check_owner(owner)}"
    return key, f"$JS.API.DIRECT.GET.KV_{CLIENTS_BUCKET}.{key}"


def action_run_subject(kind: str) -> str:
    return f"{ACTION_RUN_PREFIX}.{check_token(kind, 'action kind')}"


def action_done_subject(key: str) -> str:
    return f"{ACTION_DONE_PREFIX}.{check_token(key, 'action key')}"


def agent_permissions(owner: str) -> dict[str, dict[str, list[str]]]:
    """NATS permissions of agent client `owner`: its own episodes' agent kinds, its token and action
    subjects, completions of any model (the episode token decides which), its own key of KV
    `swarm-clients`, and its own inbox."""
    publish = [f"{EPISODE_PREFIX}.{check_owner(owner)}.*.{kind}" for kind in AGENT_EPISODE_KINDS]
    publish += [token_subject(owner), act_subject(owner), f"{LLM_PREFIX}.*", *client_state_subjects(owner)]
    subscribe = [f"{inbox_prefix(owner)}.>", f"{OUTCOME_PREFIX}.{owner}.*"]
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def samples_subject(model: str) -> str:
    return f"{SAMPLES_PREFIX}.{check_token(model, 'model name')}"


def lost_subject(model: str) -> str:
    """Where the merger says an episode will send `model` no sample (`LostEpisode`): in SAMPLES, so
    the model's trainer reads it in order with the samples."""
    return f"{samples_subject(model)}.lost"


def train_metrics_subject(model: str) -> str:
    return f"{METRICS_PREFIX}.train.{check_token(model, 'model name')}"


def drops_metrics_subject(model: str) -> str:
    return f"{METRICS_PREFIX}.drops.{check_token(model, 'model name')}"


OUTCOME_PREFIX = f"{METRICS_PREFIX}.outcome"
"""`GroupOutcome`s, `<prefix>.<owner>.<model>`: in METRICS (the ledger's `groups`), and exported to
the AGENTS account, where each identity may read its own only (`agent_permissions`)."""


def outcome_subject(owner: str, model: str) -> str:
    return f"{OUTCOME_PREFIX}.{check_owner(owner)}.{check_token(model, 'model name')}"


def eval_metrics_subject(model: str) -> str:
    return f"{METRICS_PREFIX}.eval.{check_token(model, 'model name')}"


MERGE_METRICS_SUBJECT = f"{METRICS_PREFIX}.merge"
ACTION_METRICS_SUBJECT = f"{METRICS_PREFIX}.action"  # ActionResult: one per action, the ledger's `actions`


def dlq_subject(service: str) -> str:
    return f"{DLQ_PREFIX}.{check_token(service, 'service name')}"


def llm_subject(model: str) -> str:
    return f"{LLM_PREFIX}.{check_token(model, 'model name')}"


def control_subject(verb: str) -> str:
    return f"{CONTROL_PREFIX}.{check_token(verb, 'control verb')}"


def durable_name(service: str, stream: str, part: str = "") -> str:
    """Durable consumer name of `service` on `stream` (one per service role, so restarts resume)."""
    suffix = f"-{check_token(part, 'consumer part')}" if part else ""
    return f"{service}-{stream.lower()}{suffix}"


# Service identities --------------------------------------------------------------------------------
SERVICE_ROLES = ("gateway", "engine", "merger", "trainer", "ledger", "tracker", "actions", "action-worker")
"""One NATS user per service role in the SWARM account (`service_permissions`); the `service` user
(full access) is the operator's: `swarmrl up` sets the streams up and runs the control plane with it."""
JS_API = "$JS.API"


def _consumer_api(stream: str, durable: str) -> list[str]:
    """What a client needs to create, bind, read, ack and delete consumer `durable` of `stream` (a
    pattern token, `*`, for any name): nats-py's API subjects for a pull or push consumer."""
    api = f"{JS_API}.CONSUMER"
    return [
        f"{api}.CREATE.{stream}.{durable}", f"{api}.CREATE.{stream}.{durable}.>",
        f"{api}.DURABLE.CREATE.{stream}.{durable}", f"{api}.INFO.{stream}.{durable}",
        f"{api}.DELETE.{stream}.{durable}", f"{api}.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>", f"$JS.FC.{stream}.>",
    ]  # fmt: skip


def _kv_read(bucket: str, kind: str = "KV") -> list[str]:
    """Get and watch the keys of KV `bucket` (direct or stream gets; a watch is an ordered consumer);
    `kind="OBJ"`: the same for the stream of object store `bucket`."""
    stream = f"{kind}_{bucket}"
    return [f"{JS_API}.DIRECT.GET.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>",
            f"{JS_API}.STREAM.MSG.GET.{stream}", f"{JS_API}.CONSUMER.CREATE.{stream}", *_consumer_api(stream, "*")]  # fmt: skip


def _obj_read(bucket: str) -> list[str]:
    """Read the objects of object store `bucket`: their metadata (a stream get of the last message per
    subject) and their chunks (an ordered push consumer, with flow control; nats-py finds its stream
    by subject, `STREAM.NAMES`)."""
    return [f"{JS_API}.STREAM.NAMES", *_kv_read(bucket, "OBJ")]


def service_permissions(role: str) -> dict[str, object]:
    """NATS permissions of service role `role`: the subjects it publishes and reads and the JetStream
    calls it makes on its own consumers, nothing else. No role may create, change or delete a stream
    (the operator's `service` user sets them up), read another role's consumer, or write where it
    does not: only the merger writes samples, only the gateway writes `llm` events, only trainers
    write model versions, the ledger and the tracker publish nothing but their own dead letters (and the
    ledger its answers to `LEDGER_QUERY`)."""
    if role not in SERVICE_ROLES:
        raise ValueError(f"unknown service role {role!r}; expected one of {SERVICE_ROLES}")
    pub = [f"{JS_API}.INFO", f"{JS_API}.STREAM.INFO.*", dlq_subject(role)]
    sub = [f"{INBOX_PREFIX}.>"]
    # A consumer name with a part (`trainer-samples-<model>`) cannot be matched by a pattern token, so
    # trainers and action workers may use any consumer of their one stream.
    actions_pull = _consumer_api(ACTIONS_STREAM, "*")
    if role == "gateway":
        pub += [episode_filter("*", "llm"), f"{JS_API}.CONSUMER.INFO.{SAMPLES_STREAM}.*"]  # backlogs
        pub += [f"$KV.{GROUPS_BUCKET}.>", *_kv_read(GROUPS_BUCKET), GATEWAY_CALLS]
        sub += [TOKEN_REQUESTS, f"{LLM_PREFIX}.*", episode_filter("*", "end"), episode_filter("*", "abort")]
        sub += [GATEWAY_CALLS]
    elif role == "engine":
        pub += [*_kv_read(MODELS_BUCKET), *_obj_read(WEIGHTS_BUCKET)]
    elif role == "merger":
        pub += [f"{SAMPLES_PREFIX}.>", MERGE_METRICS_SUBJECT, f"$KV.{LEASES_BUCKET}.merger.>"]
        pub += [*_consumer_api(EPISODE_PARTS_STREAM, "*"), *_kv_read(LEASES_BUCKET)]
        pub += [f"{JS_API}.CONSUMER.LIST.{EPISODE_PARTS_STREAM}"]  # a partition's stale consumers
    elif role == "trainer":
        pub += [f"{METRICS_PREFIX}.train.*", f"{METRICS_PREFIX}.drops.*", f"{OUTCOME_PREFIX}.*.*"]
        pub += [f"$KV.{MODELS_BUCKET}.*"]
        pub += [*_kv_read(MODELS_BUCKET), *_consumer_api(SAMPLES_STREAM, "*")]
        # a standby takes the lead (services/trainer/lead.py): its lease, and the leader's answers
        pub += [f"$KV.{LEASES_BUCKET}.trainer.>", *_kv_read(LEASES_BUCKET), f"{LEAD_PREFIX}.trainer.*"]
        sub += [f"{LEAD_PREFIX}.trainer.*"]
        # a version's files into the object store (chunks, then metadata), and old versions purged
        pub += [f"$O.{WEIGHTS_BUCKET}.>", *_obj_read(WEIGHTS_BUCKET)]
        pub += [f"{JS_API}.STREAM.PURGE.OBJ_{WEIGHTS_BUCKET}"]
    elif role == "ledger":
        for stream in STREAM_SUBJECTS:
            pub += _consumer_api(stream, durable_name("ledger", stream))
        # replicas: partitions of LEDGER_PARTS by lease
        pub += [*_consumer_api(LEDGER_PARTS_STREAM, "*"), f"{JS_API}.CONSUMER.LIST.{LEDGER_PARTS_STREAM}"]
        pub += [f"$KV.{LEASES_BUCKET}.ledger.>", *_kv_read(LEASES_BUCKET)]
        sub += [LEDGER_QUERY, f"{MICRO_PREFIX}.>"]  # SQL over NATS, as a nats.micro service
    elif role == "tracker":
        pub += _consumer_api(METRICS_STREAM, durable_name("tracker", METRICS_STREAM))
    elif role == "actions":
        pub += [f"{ACTION_RUN_PREFIX}.>", f"{ACTION_DONE_PREFIX}.*", ACTION_WORKERS_SUBJECT]
        pub += [ACTION_METRICS_SUBJECT, *actions_pull]
        sub += [ACT_REQUESTS, f"{ACTION_DONE_PREFIX}.*", ACTION_WORKERS_SUBJECT]
    elif role == "action-worker":
        pub += [f"{ACTION_DONE_PREFIX}.*", ACTION_WORKERS_SUBJECT, *actions_pull]
    perms: dict[str, object] = {"publish": {"allow": pub}, "subscribe": {"allow": sub}}
    if role in ("gateway", "trainer", "ledger", "actions"):  # answer requests it serves, to the asker only
        perms["allow_responses"] = True
    return perms
