"""Real token streaming for `/v1/chat/completions` with `stream: true` (pure logic, no NATS, no HTTP).

Consumes: a `PreparedCall` (`core.py`) and its engine's streamed results
(`EngineClient.generate_stream`: SGLang's SSE `/generate`, from the embedded engine or a real SGLang
server alike). Publishes: OpenAI `chat.completion.chunk` dicts while the engine decodes, and, once
the engine's final result is in, the call's llm event through `Gateway.record`: the same capture
(token ids, logprobs, policy version, `output_text`) as a call that is not streamed, because it is
taken from the same final result by the same code. Nothing is captured from the chunks.

Text. Every engine event carries all output ids so far; `TextDeltas` decodes them a window at a time
and a content chunk carries the text that is new. A trailing U+FFFD (a multi-byte character whose
last bytes are still to come, or tokens that merge into one character) is held back until it
resolves. The last content chunk sends whatever of the final `message.content` (the non-streamed
path's parse of the full decode) the deltas have not, so the deltas add up to it. With tools,
text from a tool call's opening on (and a trailing prefix of one, and trailing whitespace) is held
back: tool calls are parsed from the whole reply and sent as `tool_calls` deltas before the finish.
A model that reasons in `<think>` streams its reasoning as `reasoning_content` deltas the same way
(`replies.ReplyFormat.visible` says what of each can go out).

Order at the end: the llm event is published (durably), then the rest of the content, the tool calls,
the finish chunk and, with `stream_options.include_usage`, the usage chunk. A client that saw a call
finish can rely on its event, as with a call that is not streamed.

A client that leaves mid-stream: the engine stream is closed, so the engine aborts the request (the
embedded engine at its next decode step, SGLang through its abort task); nothing is recorded: no llm
event, no episode history, no seq used. If the engine had already finished, the recording is shielded
and completes: the event is published though the client never read the end of the reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from swarmrl.services.engine.client import EngineError, GenerateResult
from swarmrl.services.gateway.core import Completion, Gateway, PreparedCall
from swarmrl.services.gateway.errors import ApiError, engine_failed
from swarmrl.services.gateway.prompts import text_of

log = logging.getLogger("swarmrl.gateway.stream")


class TextDeltas:
    """The text of a growing list of token ids, in complete characters, decoded a window at a time.

    The scheme of SGLang's and vLLM's incremental detokenizers: `ids[prefix:read]` were decoded
    already and are kept as left context; decoding `ids[prefix:]` and cutting that context's text off
    gives the new text with its spacing right (a piece decoded alone can lose a leading space). Each
    `push` costs a window, not the whole reply.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.text = ""
        """The decode of `ids[:read]`: text that no later token changes."""
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

    `start()` waits for the engine's first event, so an engine that refuses the request (or cannot
    be reached) is the caller's HTTP error, not an error inside a stream that already began.
    """

    def __init__(self, gateway: Gateway, call: PreparedCall, include_usage: bool) -> None:
        self.gateway, self.call, self.include_usage = gateway, call, include_usage
        handle = call.handle
        self._results = handle.engine.generate_stream(
            call.prompt_ids, call.sampling, return_logprob=True, key=call.claims.episode_id
        )
        self._text = TextDeltas(lambda ids: handle.tokenizer.decode(ids, skip_special_tokens=False))
        self._sent = ""
        self._thought = ""
        self._first: GenerateResult | None = None
        self._fingerprint = ""
        self.completion: Completion | None = None
        """Set once the call is recorded (its llm event published)."""

    async def start(self) -> None:
        self._first = await self._next()
        self._fingerprint = f"policy-v{int(self._first.weight_version or 0)}"  # as the event's version

    async def aclose(self) -> None:
        """Close the engine stream (the engine then aborts the request, if it still runs)."""
        await self._results.aclose()

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The OpenAI chunks: the role, content deltas as tokens arrive, then the end (module docstring).
        An engine failure mid-stream raises `ApiError`."""
        assert self._first is not None, "await start() before chunks()"
        result = self._first
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            while True:
                reasoning, content = self._visible(result.output_ids)
                if delta := self._think(reasoning):
                    yield self._chunk({"reasoning_content": delta})
                if delta := self._send(content):
                    yield self._chunk({"content": delta})
                if result.finished:
                    break
                result = await self._next()
        finally:
            await self.aclose()
        # Shielded: once the engine has finished, the call is captured even if the client leaves now.
        self.completion = done = await asyncio.shield(self.gateway.record(self.call, result))
        choice = done.response["choices"][0]
        message = choice["message"]
        if rest := self._think(message.get("reasoning_content") or ""):
            yield self._chunk({"reasoning_content": rest})
        content = text_of(message.get("content"))
        rest = self._send(content)
        if self._sent != content and not message.get("tool_calls"):
            log.warning("call=%s streamed content differs from the reply's: %r", self.call.call_id, content)
        if rest:
            yield self._chunk({"content": rest})
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
        model = self.call.req.model
        try:
            return await anext(self._results)
        except EngineError as exc:
            raise engine_failed(model, exc.status, exc.message) from exc
        except httpx.HTTPError as exc:  # e.g. a read timeout, which the client does not retry
            raise engine_failed(model, 0, repr(exc)) from exc
        except StopAsyncIteration:  # generate_stream raises rather than end unfinished; be sure
            raise ApiError(502, f"engine of model {model!r} ended the stream early", "server_error") from None

    def _visible(self, output_ids: list[int]) -> tuple[str, str]:
        # The engine ends at the first stop token, so only the last id can be one (`reply_text`
        # leaves stop ids out too); checking just it keeps each event's cost off the reply's length.
        if output_ids and output_ids[-1] in self.call.handle.stops:
            output_ids = output_ids[:-1]
        text = self._text.push(output_ids)
        return self.call.handle.fmt.visible(text, bool(self.call.tools), self.call.opened)

    def _send(self, text: str) -> str:
        """What of the content `text` was not sent yet; nothing if it does not extend what was sent."""
        delta, self._sent = _extension(self._sent, text)
        return delta

    def _think(self, text: str) -> str:
        """As `_send`, for the reasoning."""
        delta, self._thought = _extension(self._thought, text)
        return delta

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


def _extension(sent: str, text: str) -> tuple[str, str]:
    """(what `text` adds to `sent`, what is sent then); nothing if `text` does not extend `sent`."""
    if len(text) <= len(sent) or not text.startswith(sent):
        return "", sent
    return text[len(sent) :], text
