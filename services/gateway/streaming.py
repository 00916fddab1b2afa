"""Real token streaming for `/v1/chat/completions` with `stream: true` (pure logic, no NATS, no HTTP).

OpenAI `chat.completion.chunk`s go out while the engine decodes; the engine's final result is recorded
by `Gateway.record`, as for a call not streamed, so nothing is captured from the chunks. Content and
reasoning deltas carry only what `ReplyFormat.visible` says may go out (a partial character, marker,
tool call or trailing whitespace is held back); the last deltas send the rest of the final parse, so
the deltas add up to it. At the end: the llm event is published, then the rest, the tool calls, the
finish chunk and (`include_usage`) the usage chunk. A client that leaves mid-stream closes the engine
stream (the engine aborts the request) and nothing is recorded, unless the engine had finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from swarmrl.services.engine.client import EngineError, GenerateResult
from swarmrl.services.gateway.core import Completion, Gateway, PreparedCall
from swarmrl.services.gateway.errors import engine_errors
from swarmrl.services.gateway.prompts import text_of

log = logging.getLogger("swarmrl.gateway.stream")


class TextDeltas:
    """The text of a growing list of token ids, in complete characters, decoded a window at a time.

    As SGLang's and vLLM's incremental detokenizers: `ids[prefix:read]`, decoded already, are kept as
    left context, so the new text keeps its spacing; each `push` costs a window, not the whole reply.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.text = ""  # the decode of `ids[:read]`: text that no later token changes
        self._prefix = 0
        self._read = 0

    def push(self, ids: list[int]) -> str:
        """All the complete text of `ids` (every id so far, extending the last push's)."""
        before = self._decode(ids[self._prefix : self._read])
        piece = self._decode(ids[self._prefix :])[len(before) :]
        if piece and not piece.endswith("\ufffd"):
            self.text += piece
            self._prefix, self._read = self._read, len(ids)
            return self.text
        return self.text + piece.rstrip("\ufffd")  # the window grows until the character completes


class ChatStream:
    """One streamed call: `await start()`, then iterate `chunks()`; `aclose()` releases the engine.
    `start()` waits for the engine's first event, so an engine's refusal is still a plain HTTP error."""

    def __init__(self, gateway: Gateway, call: PreparedCall, include_usage: bool) -> None:
        self.gateway, self.call, self.include_usage = gateway, call, include_usage
        handle = call.handle
        self._results = handle.engine.generate_stream(
            call.prompt_ids, call.sampling, key=call.claims.episode_id
        )
        self._text = TextDeltas(lambda ids: handle.tokenizer.decode(ids, skip_special_tokens=False))
        self._sent = {"reasoning_content": "", "content": ""}  # what each delta field has sent
        self._fingerprint = ""
        self._first: GenerateResult | None = None
        self.completion: Completion | None = None  # set once the call is recorded (its llm event published)

    async def start(self) -> None:
        self._first = await self._next()
        self._fingerprint = f"policy-v{int(self._first.weight_version or 0)}"  # as the event's version

    async def aclose(self) -> None:
        """Close the engine stream (the engine then aborts the request, if it still runs)."""
        await self._results.aclose()

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The OpenAI chunks (see the module docstring); an engine failure mid-stream raises `ApiError`."""
        assert self._first is not None, "await start() before chunks()"
        result = self._first
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            while True:
                reasoning, content = self._visible(result.output_ids)
                for chunk in self._deltas(reasoning, content):
                    yield chunk
                if result.finished:
                    break
                result = await self._next()
        finally:
            await self.aclose()
        # shielded: once the engine has finished, the call is captured even if the client leaves now
        self.completion = done = await asyncio.shield(self.gateway.record(self.call, result))
        choice = done.response["choices"][0]
        message = choice["message"]
        content = text_of(message.get("content"))
        for chunk in self._deltas(message.get("reasoning_content") or "", content):
            yield chunk
        if self._sent["content"] != content and not message.get("tool_calls"):
            log.warning("call=%s streamed content differs from the reply's: %r", self.call.call_id, content)
        for i, tc in enumerate(message.get("tool_calls") or []):
            head = {"index": i, "id": tc["id"], "type": "function"}
            yield self._chunk(
                {"tool_calls": [{**head, "function": {"name": tc["function"]["name"], "arguments": ""}}]}
            )
            yield self._chunk(
                {"tool_calls": [{"index": i, "function": {"arguments": tc["function"]["arguments"]}}]}
            )
        yield self._chunk({}, choice["finish_reason"])
        if self.include_usage:
            yield {**self._base(), "choices": [], "usage": done.response["usage"]}

    async def _next(self) -> GenerateResult:
        with engine_errors(self.call.req.model):
            try:
                return await anext(self._results)
            except StopAsyncIteration:  # generate_stream raises rather than end unfinished; be sure
                raise EngineError(0, "it ended the stream early") from None

    def _visible(self, output_ids: list[int]) -> tuple[str, str]:
        # the engine ends at the first stop token, so only the last id can be one
        if output_ids and output_ids[-1] in self.call.handle.stops:
            output_ids = output_ids[:-1]
        text = self._text.push(output_ids)
        return self.call.handle.fmt.visible(text, bool(self.call.tools), self.call.opened)

    def _deltas(self, reasoning: str, content: str) -> list[dict[str, Any]]:
        """Chunks of what each text adds to what its field sent (nothing where it does not extend it)."""
        chunks = []
        for field, text in (("reasoning_content", reasoning), ("content", content)):
            sent = self._sent[field]
            if len(text) > len(sent) and text.startswith(sent):
                self._sent[field] = text
                chunks.append(self._chunk({field: text[len(sent) :]}))
        return chunks

    def _base(self) -> dict[str, Any]:
        base: dict[str, Any] = {
            "id": self.call.call_id,
            "object": "chat.completion.chunk",
            "created": self.call.created,
            "model": self.call.req.model,
            "system_fingerprint": self._fingerprint,
        }
        if self.include_usage:
            base["usage"] = None  # OpenAI: every chunk has the field, only the last one a value
        return base

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **self._base(),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
