"""The gateway's completion logic, shared by the HTTP (`app.py`) and NATS (`service.py`) front ends.

A call is `prepare`d (token, request, exact prompt ids, sampling), generated, then `record`ed (reply
parsed, llm event published, OpenAI response built). A streamed call (`streaming.py`) records the
engine's final result with the same `record`. `publish` must make the event durable before the agent
is answered, so an agent's later `end` always lands after its `llm` events.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarmrl.schemas import LlmEvent
from swarmrl.schemas import subjects as S
from swarmrl.services.engine.client import GenerateResult
from swarmrl.services.gateway import errors as E
from swarmrl.services.gateway.limits import AgentLimits
from swarmrl.services.gateway.prompts import CallRecord, PromptBuilder, stop_token_ids
from swarmrl.services.gateway.replies import THINK_OPEN, ReplyFormat
from swarmrl.services.gateway.tokens import Claims, TokenError, verify


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


INLINE_DECODE_TOKENS = 256
"""Replies up to this many tokens are decoded on the event loop (a thread hand-off costs more than a
short decode); longer ones in a worker thread."""

MAX_INT32 = 2**31 - 1
MAX_SEED = 2**63 - 1
"""Seeds are int64 in the engines; negative ones too are refused rather than wrapped."""


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat completion request the gateway honours (other fields are ignored).
    Every number is bounded: a value the engine cannot take is the client's 400, not the engine's 500."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=MAX_INT32)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    stop: str | list[str] | None = None
    n: int = 1
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


@dataclass
class ModelHandle:
    """One trainable model as the gateway sees it: its tokenizer, its engine, how its replies read."""

    name: str
    tokenizer: Any
    engine: Any  # swarmrl.services.gateway.pool.EnginePool: the model's engines
    context_len: int
    # `auto`: read off the chat template (`replies.TOOL_FORMATS`, `REASONING_FORMATS`, `prompts.TOOL_PROMPTS`)
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    tool_prompt: str = "auto"
    builder: PromptBuilder = field(init=False)
    fmt: ReplyFormat = field(init=False)
    stops: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.builder = PromptBuilder(self.tokenizer, self.tool_prompt)
        self.stops = stop_token_ids(self.tokenizer)
        template = getattr(self.tokenizer, "chat_template", None)
        # tools the gateway wrote in Hermes' convention are called in it
        tools = "hermes" if self.builder.hermes and self.tool_parser == "auto" else self.tool_parser
        self.fmt = ReplyFormat.for_template(template, tools, self.reasoning_parser)

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether the prompt ends inside an open `<think>` block (the template opened it)."""
        if self.fmt.reasoning != "think":
            return False
        tail = self.tokenizer.decode(prompt_ids[-16:], skip_special_tokens=False).rstrip()
        return tail.endswith(THINK_OPEN)

    def reply_text(self, output_ids: list[int]) -> str:
        """The text of generated ids, the turn-ending stop tokens left out (what `output_text` records)."""
        return self.tokenizer.decode(
            [t for t in output_ids if t not in self.stops], skip_special_tokens=False
        )


@dataclass
class PreparedCall:
    """A checked request, its exact prompt ids and engine sampling params: ready to generate."""

    claims: Claims
    req: ChatRequest
    handle: ModelHandle
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    history: list[CallRecord]
    prompt_ids: list[int]
    reused: str | None
    sampling: dict[str, Any]
    opened: bool = False  # the prompt opened a reasoning block: the reply starts inside it
    call_id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    """The response's `id` (every chunk's, when streamed) and the llm event's `call_id`."""
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Completion:
    """A finished call: the OpenAI response body and the event recorded for it."""

    response: dict[str, Any]
    event: LlmEvent
    reused_call: str | None


def _keep_recent(entries: OrderedDict[Any, Any], key: Any, most: int) -> None:
    """Mark `key` the most recently used, and forget the least recently used past `most`."""
    entries.move_to_end(key)
    while len(entries) > most:
        entries.popitem(last=False)


class Gateway:
    def __init__(
        self,
        models: dict[str, ModelHandle],
        secret: bytes,
        publish: Callable[[LlmEvent], Awaitable[None]],
        default_max_tokens: int = 256,
        history_episodes: int = 20_000,
        limits: AgentLimits | None = None,
    ) -> None:
        self.models, self.secret, self.publish = models, secret, publish
        self.limits = limits or AgentLimits()
        self.default_max_tokens = default_max_tokens
        self.history_episodes = history_episodes
        # per (episode, model) call records and per episode llm event counters, least recently used out
        self.calls: OrderedDict[tuple[str, str], list[CallRecord]] = OrderedDict()
        self.seqs: OrderedDict[str, int] = OrderedDict()
        # a fresh id per process keeps llm event seqs unique across restarts
        self.client_id = f"gateway-{uuid.uuid4().hex[:12]}"

    def _next_seq(self, episode_id: str) -> int:
        seq = self.seqs[episode_id] = self.seqs.get(episode_id, -1) + 1
        _keep_recent(self.seqs, episode_id, 4 * self.history_episodes)
        return seq

    def authorize(self, api_key: str | None) -> Claims:
        if not api_key:
            raise E.unauthorized("missing API key: use the episode token from the swarmrl SDK as api_key")
        try:
            return verify(self.secret, api_key)
        except TokenError as exc:
            raise E.unauthorized(f"bad episode token ({exc.code}): {exc}") from exc

    def parse(self, body: Any) -> ChatRequest:
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(map(str, first["loc"]))
            raise E.bad_request(f"invalid request: {loc}: {first['msg']}", param=loc) from exc
        if req.n != 1:
            raise E.bad_request(f"n={req.n} is not supported; send one request per sample", param="n")
        if req.top_k == 0:
            raise E.bad_request("top_k=0 is not supported: use -1 (whole vocabulary) or >= 1", param="top_k")
        return req

    async def generate(self, call: PreparedCall) -> Completion:
        """Generate a prepared call in one piece (not streamed) and record it."""
        with E.engine_errors(call.req.model):
            result = await call.handle.engine.generate(
                call.prompt_ids, call.sampling, key=call.claims.episode_id
            )
        return await self.record(call, result)

    async def prepare(self, body: Any, api_key: str | None) -> PreparedCall:
        """Everything before generation; an ApiError (4xx) for a request that cannot be served."""
        claims = self.authorize(api_key)
        identity, now = S.episode_owner(claims.episode_id), time.monotonic()
        if wait := self.limits.call(identity, now):
            rate = f"{self.limits.rate:g} calls/s"
            raise E.rate_limited(
                f"agent {identity!r} is past its rate of {rate}: retry in {wait:.2f} s", retry_after_s=wait
            )
        self.limits.seen(identity, claims.episode_id, now)
        req = self.parse(body)
        handle = self.models.get(req.model)
        if handle is None:
            raise E.not_found(f"model {req.model!r} does not exist; available: {sorted(self.models)}")
        if not claims.allows(req.model):
            raise E.forbidden(
                f"episode {claims.episode_id} may call {list(claims.models)}, not {req.model!r}"
            )
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        tools = [] if req.tool_choice == "none" else list(req.tools or [])
        history = self.calls.setdefault((claims.episode_id, req.model), [])
        _keep_recent(self.calls, (claims.episode_id, req.model), self.history_episodes)
        # off the event loop (a long prompt takes a while), on a copy of history (the loop may append)
        prompt_ids, reused = await asyncio.to_thread(handle.builder.build, messages, tools, list(history))
        room = handle.context_len - len(prompt_ids)
        if room < 1:
            raise E.bad_request(
                f"prompt is {len(prompt_ids)} tokens; model {req.model!r} has a context of {handle.context_len}",
                param="messages",
                code="context_length_exceeded",
            )
        wanted = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
        sampling: dict[str, Any] = {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "max_new_tokens": min(wanted, room),
            "stop_token_ids": handle.stops,
        }
        if req.stop:
            sampling["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if req.seed is not None:
            sampling["sampling_seed"] = req.seed
        opened = handle.opens_reasoning(prompt_ids)
        return PreparedCall(
            claims, req, handle, messages, tools, history, prompt_ids, reused, sampling, opened
        )

    async def record(self, call: PreparedCall, result: GenerateResult) -> Completion:
        """Parse the engine's final result, publish the call's llm event (durably), build the response."""
        claims, req, handle, prompt_ids = call.claims, call.req, call.handle, call.prompt_ids
        out_ids = list(result.output_ids)
        if len(out_ids) <= INLINE_DECODE_TOKENS:
            text = handle.reply_text(out_ids)
        else:
            text = await asyncio.to_thread(handle.reply_text, out_ids)
        reply = handle.fmt.parse(text, with_tools=bool(call.tools), opened=call.opened)
        tool_calls = reply.tool_calls
        finish = "tool_calls" if tool_calls else ("length" if result.finish_reason == "length" else "stop")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content or (None if tool_calls else ""),
        }
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        call_id = call.call_id
        call.history.append(CallRecord(call_id, call.messages, call.tools, prompt_ids, out_ids, message))
        event = LlmEvent(
            episode_id=claims.episode_id,
            seq=self._next_seq(claims.episode_id),
            client_id=self.client_id,
            client_version=claims.client_version,
            call_id=call_id,
            agent=claims.agent,
            model=req.model,
            prompt_ids=prompt_ids,
            output_ids=out_ids,
            output_logprobs=[float(x) for x in result.output_logprobs],
            policy_version=int(result.weight_version or 0),
            messages=call.messages,
            tools=call.tools,
            output_text=text,
            finish_reason=finish,
        )
        await self.publish(event)
        response = {
            "id": call_id,
            "object": "chat.completion",
            "created": call.created,
            "model": req.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(out_ids),
                "total_tokens": len(prompt_ids) + len(out_ids),
            },
            "system_fingerprint": f"policy-v{event.policy_version}",
        }
        return Completion(response, event, call.reused)
