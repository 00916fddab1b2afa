"""Configuration of the gateway service: `GatewaySettings`, what a swarm description's `[gateway]`
may set, and `GatewayConfig`, the process's whole configuration (`swarmrl serve gateway --help`),
which adds what `swarmrl up` places and derives (ports, engines, task weights)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.services.gateway.mixing import parse_weights
from swarmrl.services.gateway.prompts import TOOL_PROMPTS
from swarmrl.services.gateway.replies import REASONING_FORMATS, TOOL_FORMATS

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Default cap on an HTTP request body: an llm event (prompt ids and messages) must fit the 4 MiB
episode-event limit anyway."""


class GatewaySettings(Settings):
    """How the gateway serves agents: engine calls, parsers, admission, task mixing, per-agent limits."""

    engine_max_inflight: int = Field(default=16, ge=0)
    """Calls this gateway sends one engine at once (0: no bound); more wait at the gateway, first come
    first served: the embedded engine runs 16 at a time (more would only queue there); raise it for
    SGLang or vLLM, whose batches run to hundreds. Every connection of the pool costs the gateway CPU
    at each call's start and end (httpx checks each idle one; bench/results/load.md)."""
    engine_slack: int = Field(default=4, ge=0)
    """Engine pools: calls an episode's engine may have in flight beyond the least loaded one's
    before the episode's call goes to the least loaded instead."""
    tool_parser: list[str] = Field(default_factory=list)
    """Tool-call syntax per model as MODEL=FORMAT (repeatable): hermes (Qwen2.5/Qwen3), llama3
    (Llama 3.x JSON), mistral (`[TOOL_CALLS]`) or none. A model not named: read off its chat template
    (`services/gateway/replies.py`)."""
    tool_prompt: list[str] = Field(default_factory=list)
    """How an agent's `tools` reach each model, as MODEL=FORMAT (repeatable): template (the chat
    template renders them), hermes (the gateway writes them into the system message in Hermes'
    `<tool_call>` JSON convention, for templates that drop tools, and parses calls in it) or auto
    (hermes exactly when the model's template ignores tools). A model not named: auto."""
    reasoning_parser: list[str] = Field(default_factory=list)
    """Reasoning syntax per model as MODEL=FORMAT (repeatable): think (`<think>...</think>` goes to
    `reasoning_content`, out of `content`) or none. A model not named: read off its chat template."""
    token_ttl_max_s: float = 24 * 3600.0
    """Longest token lifetime a client may ask for."""
    default_max_tokens: int = 256
    """max_tokens when a request gives none (always capped by the context length)."""
    history_episodes: int = 20_000
    """Episodes whose calls are remembered for exact token reuse (least recently used are forgotten)."""
    request_timeout_s: float = 300.0
    """Engine request timeout."""
    engine_retry_s: float = Field(default=60.0, ge=0)
    """How long a completion waits for an engine it cannot reach before the agent gets a 502: an
    engine restarting after a crash (about 30 s on 2 busy cores) is ridden out, its episodes go on."""
    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, ge=1024)
    """Largest HTTP request body: a larger one gets 413, by its Content-Length before it is read, or
    as soon as a chunked body passes the limit."""
    max_backlog: int = Field(default=-1, ge=-1)
    """Admission control: while a model's trainer has this many untrained samples (queued or held),
    token requests for new GRPO groups get `retry_after_s` and the client waits. 0 = off; -1 = two
    trainer steps' worth (batch_groups x num_repeat x 2 of the swarm description's tightest model;
    off for a gateway run without one). See `services/gateway/admission.py`."""
    mix_slack: float = Field(default=2.0, ge=0.0)
    """Task mixing: groups a task may run ahead of its share before its new groups wait."""
    mix_window_s: float = Field(default=30.0, gt=0.0)
    """Task mixing: a task counts as active (and gets its share) while it asked for a token this recently."""

    outside_tasks: bool = True
    """An agent outside the swarm may name a task the description does not declare (on `begin`, as
    `task={"name": ...}`); its episodes are reported and evaluated under that name. False: outside
    agents play only tasks declared with `clients = 0`. Either way, a task the swarm's own clients play
    is theirs alone, and with several tasks mixed by weight every training episode names one of them."""

    agent_rate: float = Field(default=0.0, ge=0.0)
    """LLM calls per second each agent identity may make (a token bucket; 0 = no bound); past it a
    call gets 429 `rate_limit_exceeded` with `Retry-After`, which the OpenAI SDKs wait out and retry.
    It holds across gateway replicas: each takes the calls the others served from its buckets too
    (they tell each other every 50 ms). See `services/gateway/limits.py` and `calls.py`."""
    agent_burst: int = Field(default=0, ge=0)
    """Calls an agent identity may make at once before `agent_rate` applies (0 = max(1, agent_rate))."""
    agent_max_episodes: int = Field(default=0, ge=0)
    """Episodes each agent identity may have open at once (0 = no bound), across all gateway replicas
    (slots in KV `swarm-groups`): a token request for one more is told to retry, as under admission
    control, until one of its episodes ends or aborts. See `services/gateway/episodes.py`."""
    agent_episode_idle_s: float = Field(default=600.0, gt=0.0)
    """An open episode without a call for this long no longer counts against `agent_max_episodes`
    (its client died without ending it)."""

    @field_validator("tool_parser", "reasoning_parser", "tool_prompt")
    @classmethod
    def _check_formats(cls, value: list[str], info: Any) -> list[str]:
        known = {"tool_parser": TOOL_FORMATS, "reasoning_parser": REASONING_FORMATS}.get(
            info.field_name, TOOL_PROMPTS[1:]
        )
        for item in value:
            model, sep, fmt = item.partition("=")
            if not sep or not model or fmt not in (*known, "auto"):
                raise ValueError(f"{item!r}: expected MODEL=FORMAT, FORMAT one of {', '.join(known)} or auto")
        return value


class GatewayConfig(ServiceConfig, GatewaySettings):
    host: str = "127.0.0.1"
    """Interface the OpenAI-compatible HTTP server listens on."""
    port: int = 8000
    """HTTP port (0 picks a free one)."""
    public_url: str = ""
    """Base URL agents are told to use (default http://HOST:PORT/v1)."""
    engine: list[str] = Field(default_factory=list)
    """Engines as MODEL=URL (repeatable): the trainable model name and its engine (SGLang's API or
    vLLM's). A model named more than once has a pool of engines: calls spread by load, an episode's
    calls stay on one engine, a dead engine is left out (`services/gateway/pool.py`)."""
    lora: list[str] = Field(default_factory=list)
    """Models served as LoRA adapters of their engine's base (repeatable): their requests name the
    adapter (`lora_path`; vLLM: `model`). `swarmrl up` lists the models that train LoRA."""
    tokenizer: list[str] = Field(default_factory=list)
    """Tokenizer dirs as MODEL=PATH (repeatable); default: the engine's /get_model_info tokenizer_path."""
    secret: str = ""
    """HMAC secret for episode tokens, shared by all gateways of a swarm (env SWARMRL_SECRET). Empty: random."""
    task_weight: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Task mixing as TASK=WEIGHT (repeatable, or comma-separated; env SWARMRL_TASK_WEIGHT=a=0.7,b=0.3): new
    GRPO groups of a task ahead of its share wait (`retry_after_s`), and token requests must name one
    of these tasks. Empty = no mixing. See `services/gateway/mixing.py`."""

    tasks: list[str] = Field(default_factory=list)
    """The description's tasks (`swarmrl up` lists them); empty: a gateway run alone, which checks no
    task names."""
    own_tasks: list[str] = Field(default_factory=list)
    """Tasks the swarm's own clients play (`clients > 0`): only those clients and the evaluator may
    send their episodes (`schemas/subjects.py` `plays_own_task`), so an outside agent's episodes are
    never mixed into them."""

    @field_validator("task_weight", mode="before")
    @classmethod
    def _split_pairs(cls, value: Any) -> Any:
        # The env var and one flag may carry a whole comma-separated list (as `swarmrl up --task` does).
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else [value]
        if isinstance(value, list):
            value = [p.strip() for item in value for p in str(item).split(",") if p.strip()]
            parse_weights(value)  # a bad weight fails at startup, naming the item
        return value
