"""Text-level comparison of OpenAI chat messages, for the merger's `text` mode (pure logic).

Earlier messages are compared by role, content and tool calls after normalising whitespace and
JSON (ids are ignored: clients regenerate them). The reply is known only as the raw generated text,
while the next request echoes the *parsed* assistant message: it matches when its content and every
tool call (name, arguments as JSON) are found in the raw text.
"""

from __future__ import annotations

import json
from typing import Any

NormalMessage = tuple[str, str, tuple[tuple[str, str], ...]]
"""(role, whitespace-normalised content, ((tool name, canonical JSON arguments), ...))."""


def squash(text: str) -> str:
    return " ".join(text.split())


def text_of(content: Any) -> str:
    """OpenAI content (None, str, or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces; strings that hold JSON are parsed first."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return squash(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _tool_calls(message: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        calls.append((str(fn.get("name", "")), canonical_json(fn.get("arguments", {}))))
    return tuple(calls)


def normalise(message: dict[str, Any]) -> NormalMessage:
    return (str(message.get("role", "")), squash(text_of(message.get("content"))), _tool_calls(message))


def _json_values(raw: str) -> set[str]:
    """Canonical JSON of every object found in `raw`, plus their `arguments`/`parameters` values: the
    tool calls of generated text, whatever the chat template's markup."""
    decoder = json.JSONDecoder()
    found: set[str] = set()
    start = raw.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(raw, start)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            found.add(canonical_json(obj))
            for key in ("arguments", "parameters"):
                if key in obj:
                    found.add(canonical_json(obj[key]))
        start = raw.find("{", start + 1)
    return found


def reply_matches(output_text: str, echoed: dict[str, Any]) -> bool:
    """Is `echoed` (a message of a later request) the client's copy of the reply `output_text`?"""
    role, content, calls = normalise(echoed)
    if role != "assistant":
        return False
    raw = squash(output_text)
    if not content and not calls:
        return raw == ""
    if content and content not in raw:
        return False
    if calls:
        values = _json_values(output_text)
        for name, arguments in calls:
            if name not in output_text or (arguments not in values and arguments != "{}"):
                return False
    return True


def is_text_prefix(
    a_request: list[dict[str, Any]],
    a_output_text: str,
    a_tools: list[dict[str, Any]],
    b_request: list[dict[str, Any]],
    b_tools: list[dict[str, Any]],
    ignore_tools: bool = False,
) -> bool:
    """Does B's request repeat A's request and A's reply (then continue)? Same tools unless ignored."""
    k = len(a_request)
    if len(b_request) <= k:
        return False
    if not ignore_tools and canonical_json(a_tools) != canonical_json(b_tools):
        return False
    if any(normalise(x) != normalise(y) for x, y in zip(a_request, b_request[:k], strict=True)):
        return False
    return reply_matches(a_output_text, b_request[k])
