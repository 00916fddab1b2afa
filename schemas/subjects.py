"""Every NATS subject, stream, consumer and bucket name swarmrl uses. No other module spells one out.

Names are fixed by the wire contract (`schemas/README.md`): an agent in any language publishes to
`swarm.ep.<episode_id>.<kind>`, so these strings are part of the public API.
"""

from __future__ import annotations

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

# Request/reply (core NATS, not stored) -----------------------------------------------------------
TOKEN_SUBJECT = "swarm.auth.token"  # SDK asks the gateway to mint a signed episode token
LLM_PREFIX = "swarm.llm"  # swarm.llm.<model>: chat completion over NATS request/reply
CONTROL_PREFIX = "swarm.ctl"  # swarm.ctl.<verb>: operator control; never open to agents

# KV buckets ------------------------------------------------------------------------------------
MODELS_BUCKET = "swarm-models"  # key: model name, value: ModelVersion (msgpack)

# Names -----------------------------------------------------------------------------------------
EPISODE_KINDS = ("begin", "llm", "env", "reward", "end", "abort", "heartbeat")
# Kinds an agent credential may publish; `llm` is written by the gateway only.
AGENT_EPISODE_KINDS = ("begin", "env", "reward", "end", "abort", "heartbeat")

_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def check_token(value: str, what: str) -> str:
    """Return `value` if it is usable as one NATS subject token, else raise ValueError."""
    if not _TOKEN_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid subject token: use 1-128 of [A-Za-z0-9_-] (no dots, spaces)"
        )
    return value


def episode_subject(episode_id: str, kind: str) -> str:
    if kind not in EPISODE_KINDS:
        raise ValueError(f"unknown episode event kind {kind!r}; expected one of {EPISODE_KINDS}")
    return f"{EPISODE_PREFIX}.{check_token(episode_id, 'episode id')}.{kind}"


def parse_episode_subject(subject: str) -> tuple[str, str]:
    """Split `swarm.ep.<id>.<kind>` into (episode_id, kind); ValueError if it is not one."""
    parts = subject.split(".")
    if len(parts) != 4 or f"{parts[0]}.{parts[1]}" != EPISODE_PREFIX or parts[3] not in EPISODE_KINDS:
        raise ValueError(f"not an episode subject: {subject!r}")
    return parts[2], parts[3]


def samples_subject(model: str) -> str:
    return f"{SAMPLES_PREFIX}.{check_token(model, 'model name')}"


def train_metrics_subject(model: str) -> str:
    return f"{METRICS_PREFIX}.train.{check_token(model, 'model name')}"


def eval_metrics_subject(model: str) -> str:
    return f"{METRICS_PREFIX}.eval.{check_token(model, 'model name')}"


MERGE_METRICS_SUBJECT = f"{METRICS_PREFIX}.merge"


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
