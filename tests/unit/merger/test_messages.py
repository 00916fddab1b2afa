"""Text-level message comparison used by the merger's `text` mode."""

from __future__ import annotations

from swarmrl.services.merger.messages import canonical_json, is_text_prefix, normalise, reply_matches

CALL = '<tool_call>\n{"name": "move", "arguments": {"dir": "left", "n": 2}}\n</tool_call>'


def tool_call(name: str, arguments: str) -> dict:
    return {"id": "x", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_normalise_ignores_whitespace_part_lists_ids_and_json_layout() -> None:
    a = {"role": "user", "content": "hello   world\n"}
    b = {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": " world"}]}
    assert normalise(a) == normalise(b)
    c = {"role": "assistant", "content": None, "tool_calls": [tool_call("f", '{"b": 1, "a": [1, 2]}')]}
    d = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{**tool_call("f", '{"a":[1,2],"b":1}'), "id": "y"}],
    }
    assert normalise(c) == normalise(d)
    assert canonical_json("not json  at all") == "not json at all"


def test_reply_matches_the_parsed_message_the_client_echoes() -> None:
    raw = f"Going left. {CALL}"
    echoed = {
        "role": "assistant",
        "content": "Going left.",
        "tool_calls": [tool_call("move", '{"n":2,"dir":"left"}')],
    }
    assert reply_matches(raw, echoed)
    assert not reply_matches(raw, {**echoed, "role": "user"})
    assert not reply_matches(raw, {**echoed, "content": "Going right."})
    assert not reply_matches(raw, {**echoed, "tool_calls": [tool_call("move", '{"n": 3, "dir": "left"}')]})
    assert not reply_matches(raw, {**echoed, "tool_calls": [tool_call("jump", '{"n": 2, "dir": "left"}')]})
    assert reply_matches("", {"role": "assistant", "content": ""})
    assert not reply_matches("something", {"role": "assistant", "content": ""})


def test_text_prefix_needs_the_reply_inside_the_longer_request() -> None:
    request = [{"role": "user", "content": "go"}]
    later = [*request, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    assert is_text_prefix(request, "ok", [], later, [])
    assert not is_text_prefix(request, "ok", [], request, [])  # same request: a retry, not a continuation
    assert not is_text_prefix(request, "no", [], later, [])
    tools = [{"type": "function", "function": {"name": "move"}}]
    assert not is_text_prefix(request, "ok", tools, later, [])
    assert is_text_prefix(request, "ok", tools, later, [], ignore_tools=True)
