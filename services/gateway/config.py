"""Gateway configuration: `GatewaySettings` (a swarm description's `[gateway]`) and `GatewayConfig`,
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
"""Default cap on an HTTP request body: an llm event must fit the 4 MiB episode-event limit anyway."""


class GatewaySettings(Settings):
    """How the gateway serves agents: engine calls, parsers, admission, task mixing, per-agent limits."""

    engine_max_inflight: int = Field(default=16, ge=0)
    """Calls this gateway sends one engine at once (0: no bound; more wait here, first come first
    served). The embedded engine runs 16 at a time; raise it for SGLang or vLLM (bench/results/load.md)."""
    engine_slack: int = Field(default=4, ge=0)
    """Engine pools: calls an episode's engine may have in flight beyond the least loaded one's."""
    tool_parser: list[str] = Field(default_factory=list)
    """Tool-call syntax per model as MODEL=FORMAT (repeatable): hermes, llama3, mistral or none.
    A model not named: read off its chat template."""
    tool_prompt: list[str] = Field(default_factory=list)
    """How `tools` reach each model, as MODEL=FORMAT (repeatable): template (the chat template), hermes
    (the gateway writes them into the system message) or auto (hermes if the template drops tools)."""
    reasoning_parser: list[str] = Field(default_factory=list)
    """Reasoning syntax per model as MODEL=FORMAT (repeatable): think (`<think>` to
    `reasoning_content`) or none. A model not named: read off its chat template."""
    token_ttl_max_s: float = 24 * 3600.0
    """Longest token lifetime a client may ask for."""
    default_max_tokens: int = 256
    """max_tokens when a request gives none (always capped by the context length)."""
    history_episodes: int = 20_000
    """Episodes whose calls are remembered for exact token reuse (least recently used forgotten)."""
    request_timeout_s: float = 300.0
    """Engine request timeout."""
    engine_retry_s: float = Field(default=60.0, ge=0)
    """How long a completion waits for an engine it cannot reach (a restart) before a 502."""
    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, ge=1024)
    """Largest HTTP request body (larger: 413)."""
    max_backlog: int = Field(default=-1, ge=-1)
    """Admission control: while a model's trainer has this many untrained samples, new GRPO groups
    wait. 0 = off; -1 = two trainer steps' worth (off for a gateway run without a description)."""
    mix_slack: float = Field(default=2.0, ge=0.0)
    """Task mixing: groups a task may run ahead of its share before its new groups wait."""
    mix_window_s: float = Field(default=30.0, gt=0.0)
    """Task mixing: a task is active (gets its share) while it asked for a token this recently."""

    outside_tasks: bool = True
    """An outside agent may name a task the description does not declare. False: outside agents play
    only tasks declared with `clients = 0`. A task the swarm's own clients play is always theirs alone."""

    agent_rate: float = Field(default=0.0, ge=0.0)
    """LLM calls per second each agent identity may make, across gateway replicas (0 = no bound);
    past it a call gets 429 with `Retry-After`, which the OpenAI SDKs wait out."""
    agent_burst: int = Field(default=0, ge=0)
    """Calls an agent identity may make at once before `agent_rate` applies (0 = max(1, agent_rate))."""
    agent_max_episodes: int = Field(default=0, ge=0)
    """Episodes each agent identity may have open at once, across gateway replicas (0 = no bound);
    a token request for one more is told to retry until one ends."""
    agent_episode_idle_s: float = Field(default=600.0, gt=0.0)
    """An open episode without a call for this long no longer counts against `agent_max_episodes`."""

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
    """Engines as MODEL=URL (repeatable; SGLang's API or vLLM's). A model named more than once has a
    pool of engines (`services/gateway/pool.py`)."""
    lora: list[str] = Field(default_factory=list)
    """Models served as LoRA adapters of their engine's base (repeatable): requests name the adapter."""
    tokenizer: list[str] = Field(default_factory=list)
    """Tokenizer dirs as MODEL=PATH (repeatable); default: the engine's /get_model_info tokenizer_path."""
    secret: str = ""
    """HMAC secret for episode tokens, shared by all gateways of a swarm (env SWARMRL_SECRET). Empty: random."""
    task_weight: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Task mixing as TASK=WEIGHT (repeatable or comma-separated): new GRPO groups of a task ahead of
    its share wait, and token requests must name one of these tasks. Empty = no mixing."""

    tasks: list[str] = Field(default_factory=list)
    """The description's tasks; empty: a gateway run alone, which checks no task names."""
    own_tasks: list[str] = Field(default_factory=list)
    """Tasks the swarm's own clients play (`clients > 0`): outside agents may not send their episodes."""

    @field_validator("task_weight", mode="before")
    @classmethod
    def _split_pairs(cls, value: Any) -> Any:
        # the env var and one flag may carry a comma-separated list
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else [value]
        if isinstance(value, list):
            value = [p.strip() for item in value for p in str(item).split(",") if p.strip()]
            parse_weights(value)  # a bad weight fails at startup, naming the item
        return value
