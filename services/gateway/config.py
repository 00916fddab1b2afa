"""Gateway configuration."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import ServiceConfig


class GatewayConfig(ServiceConfig):
    host: str = "127.0.0.1"
    """Interface the OpenAI-compatible HTTP server listens on."""
    port: int = 8000
    """HTTP port (0 picks a free one)."""
    public_url: str = ""
    """Base URL agents are told to use (default http://HOST:PORT/v1)."""
    engine: list[str] = Field(default_factory=list)
    """Engines as MODEL=URL (repeatable): the trainable model name and its SGLang-API engine."""
    tokenizer: list[str] = Field(default_factory=list)
    """Tokenizer dirs as MODEL=PATH (repeatable); default: the engine's /get_model_info tokenizer_path."""
    secret: str = ""
    """HMAC secret for episode tokens, shared by all gateways of a swarm (env SWARMRL_SECRET). Empty: random."""
    token_ttl_max_s: float = 24 * 3600.0
    """Longest token lifetime a client may ask for."""
    default_max_tokens: int = 256
    """max_tokens when a request gives none (always capped by the context length)."""
    history_episodes: int = 20_000
    """Episodes whose calls are remembered for exact token reuse (least recently used are forgotten)."""
    request_timeout_s: float = 300.0
    """Engine request timeout."""
    max_backlog: int = Field(default=0, ge=0)
    """Admission control: while a model's trainer has this many untrained samples (queued or held),
    token requests for new GRPO groups get `retry_after_s` and the client waits. 0 = off. See
    `services/gateway/admission.py`."""
