"""Parsing generated text into OpenAI assistant messages."""

from __future__ import annotations

import json

from swarmrl.bootstrap import parse_assistant_text


def test_plain_text():
    assert parse_assistant_text("42") == {"role": "assistant", "content": "42"}


def test_tool_calls_with_content():
    text = 'ok\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>\n<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>'
    message = parse_assistant_text(text)
    assert message["content"] == "ok"
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["calculator", "f"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "1 + 2"}
    assert calls[1]["function"]["arguments"] == "{}"  # already a JSON string: not encoded twice
    assert calls[0]["id"] != calls[1]["id"]


def test_malformed_call_is_content():
    text = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_assistant_text(text) == {"role": "assistant", "content": text}
    text = '<tool_call>\n["calculator"]\n</tool_call>'
    assert parse_assistant_text(text) == {"role": "assistant", "content": text}
