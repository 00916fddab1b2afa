"""Generated text to an OpenAI assistant message, per model family (pure logic, no NATS, no HTTP).

Tool calls and reasoning become `tool_calls` and `reasoning_content`; the rest is `content` (the token
ids are captured untouched whatever the parse). Tool-call formats (named as vLLM's and SGLang's
`--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (a JSON list in one
  block is several calls), text around them is content (Qwen2.5, Qwen3, SmolLM2);
- `llama3`: the whole reply is JSON calls `{"name": ..., "parameters": {...}}` separated by `;`,
  optionally after `<|python_tag|>`;
- `mistral`: content, then `[TOOL_CALLS]` and a JSON array, or `[TOOL_CALLS]name[ARGS]{...}` per call
  (tokenizer v11 on); its tool call ids are 9 letters and digits, as Mistral's templates insist;
- `none`: the whole reply is content.

Reasoning (`think`): `<think>...</think>` at the start of a reply, or from the start when the template
opened the block (`opened`). `auto` reads the family off the chat template. Text that does not parse
in its format stays content, so nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_FORMATS = ("hermes", "llama3", "mistral", "none")
REASONING_FORMATS = ("think", "none")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_OPEN, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
PYTHON_TAG = "<|python_tag|>"


@dataclass
class Reply:
    """A parsed reply: what the agent reads as `content`, `reasoning_content` and `tool_calls`."""

    content: str
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def detect(chat_template: str | None) -> tuple[str, str]:
    """(tool format, reasoning format) that a chat template renders; hermes when it says nothing."""
    t = chat_template or ""
    if MISTRAL_OPEN in t:
        tools = "mistral"
    elif "<|start_header_id|>" in t and ("python_tag" in t or '"parameters"' in t or "ipython" in t):
        tools = "llama3"
    else:
        tools = "hermes"
    return tools, "think" if THINK_CLOSE in t else "none"


def _ascii_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


@dataclass(frozen=True)
class ReplyFormat:
    """How one model writes tool calls and reasoning (see the module docstring)."""

    tools: str = "hermes"
    reasoning: str = "none"

    def __post_init__(self) -> None:
        for what, value, known in (
            ("tool", self.tools, TOOL_FORMATS),
            ("reasoning", self.reasoning, REASONING_FORMATS),
        ):
            if value not in known:
                raise ValueError(f"{what} format {value!r} is not one of {', '.join(known)} (or auto)")

    @classmethod
    def for_template(
        cls, chat_template: str | None, tools: str = "auto", reasoning: str = "auto"
    ) -> ReplyFormat:
        """The format named, each `auto` part read off the chat template."""
        seen_tools, seen_reasoning = detect(chat_template)
        return cls(
            tools=seen_tools if tools == "auto" else tools,
            reasoning=seen_reasoning if reasoning == "auto" else reasoning,
        )

    def parse(self, text: str, with_tools: bool, opened: bool = False) -> Reply:
        """The reply `text` as content, reasoning and tool calls (`opened`: it starts inside `<think>`)."""
        reasoning, rest = "", text
        if self.reasoning == "think" and (body := _reasoning_body(text, opened)) is not None:
            inner, closed, after = body.partition(THINK_CLOSE)
            reasoning, rest = inner.strip(), after.lstrip() if closed else ""
        if not with_tools or self.tools == "none":
            return Reply(rest, reasoning)
        content, calls = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral}[self.tools](rest)
        for call in calls:
            call["id"] = _ascii_id() if self.tools == "mistral" else f"call_{uuid.uuid4().hex[:24]}"
        return Reply(content.strip() if calls else content, reasoning, calls)

    def visible(self, text: str, with_tools: bool, opened: bool = False) -> tuple[str, str]:
        """(reasoning, content) of a growing reply, as far as they can be sent now: a trailing piece of a
        marker, everything from a tool call on and trailing whitespace are held back. What this returns
        only grows as `text` grows, and ends as a prefix of `parse`'s fields."""
        reasoning, rest = "", text
        if self.reasoning == "think":
            if not opened and THINK_OPEN.startswith(text.lstrip()):
                return "", ""  # the reply may be opening a reasoning block
            if (body := _reasoning_body(text, opened)) is not None:
                inner, closed, after = body.partition(THINK_CLOSE)
                if not closed:
                    return _before_partial(inner, THINK_CLOSE).strip(), ""
                reasoning, rest = inner.strip(), after.lstrip()
        if not with_tools or self.tools == "none":
            return reasoning, rest
        if self.tools == "llama3":
            head = rest.lstrip()
            if head.startswith(("{", "[")) or PYTHON_TAG.startswith(head[: len(PYTHON_TAG)]):
                return reasoning, ""  # a reply that may be a call is sent whole at the end
            return reasoning, rest.rstrip()
        marker = HERMES_OPEN if self.tools == "hermes" else MISTRAL_OPEN
        at = rest.find(marker)
        return reasoning, (rest[:at] if at >= 0 else _before_partial(rest, marker)).rstrip()


def _reasoning_body(text: str, opened: bool) -> str | None:
    """What of `text` follows the opening of its reasoning block; None when the reply opens none."""
    if opened:
        return text
    stripped = text.lstrip()
    return stripped[len(THINK_OPEN) :] if stripped.startswith(THINK_OPEN) else None


def _before_partial(text: str, marker: str) -> str:
    """`text` less a trailing piece that could be the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text


def _call(name: Any, args: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    args = {} if args is None else args
    return {
        "type": "function",
        "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
    }


def _calls(objs: list[Any], args: str = "arguments") -> list[dict[str, Any]] | None:
    """Each of `objs` (`{"name": ..., args: {...}}`) as a call; None unless every one is one."""
    calls = [
        _call(o.get("name"), o.get(args, o.get("arguments"))) if isinstance(o, dict) else None for o in objs
    ]
    return None if None in calls else [c for c in calls if c is not None]


def _hermes(text: str) -> tuple[str, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    kept, at = [], 0
    while (start := text.find(HERMES_OPEN, at)) >= 0 and (end := text.find(HERMES_CLOSE, start)) >= 0:
        try:
            obj = json.loads(text[start + len(HERMES_OPEN) : end])
            block = _calls(obj if isinstance(obj, list) else [obj])
        except json.JSONDecodeError:
            block = None
        kept.append(text[at:start] if block else text[at : end + len(HERMES_CLOSE)])
        calls += block or []
        at = end + len(HERMES_CLOSE)
    kept.append(text[at:])
    return "".join(kept), calls


def _json_values(text: str) -> list[Any] | None:
    """The JSON values `text` holds, separated by `;`, commas or whitespace; None if anything else."""
    decoder, values, at = json.JSONDecoder(), list[Any](), 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;,":
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)


def _llama3(text: str) -> tuple[str, list[dict[str, Any]]]:
    values = _json_values(text.strip().removeprefix(PYTHON_TAG)) or []
    calls = _calls(
        [v for value in values for v in (value if isinstance(value, list) else [value])], "parameters"
    )
    return ("", calls) if calls else (text, [])


def _mistral(text: str) -> tuple[str, list[dict[str, Any]]]:
    at = text.find(MISTRAL_OPEN)
    calls: list[dict[str, Any]] = []
    for piece in text[at:].split(MISTRAL_OPEN)[1:] if at >= 0 else []:
        piece = piece.strip()
        if piece.startswith("["):  # [TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]
            values = _json_values(piece)
            found = _calls(values[0]) if values and len(values) == 1 and isinstance(values[0], list) else None
        else:  # [TOOL_CALLS]name[ARGS]{...}
            found = _mistral_call(piece)
        if found is None:
            return text, []
        calls += found
    return (text[:at], calls) if calls else (text, [])


def _mistral_call(piece: str) -> list[dict[str, Any]] | None:
    name, sep, raw = piece.partition(MISTRAL_ARGS)
    if not sep:
        brace = piece.find("{")
        name, raw = (piece[:brace], piece[brace:]) if brace > 0 else (piece, "")
    try:
        args, end = json.JSONDecoder().raw_decode(raw.strip())
    except json.JSONDecodeError:
        return None
    call = _call(name.strip(), args)
    return [call] if call is not None and not raw.strip()[end:].strip() else None
