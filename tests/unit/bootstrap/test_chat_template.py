"""The tiny model's chat template: every role, tools, tool calls, and prefix stability."""

from __future__ import annotations

import json
import random

import pytest

from swarmrl.agents.tasks import TASKS
from swarmrl.bootstrap import build_tokenizer, source_names
from swarmrl.bootstrap.sft import source_demonstration

TOOLS = TASKS["calculator"].tools


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def render(tokenizer, messages, tools=None, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )


def _call(args) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": args}}


MIXED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [_call({"expression": "2 + 3"})]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call('{"expression": "5 * 1"}'), _call({"expression": "5"})],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "tool", "tool_call_id": "c2", "content": "5"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
]


def test_renders_every_role_with_tools(tokenizer):
    text = render(tokenizer, MIXED, tools=TOOLS, generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert text.count("<|im_start|>system") == 1  # the system message merged into the tools block
    assert (
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>\n'
        in text
    )
    # A JSON-string arguments field renders exactly like a dict.
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 1"}}\n</tool_call>\n<tool_call>'
        in text
    )
    assert text.count("<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n") == 3
    assert "<|im_start|>assistant\n5<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_plain_chat_has_no_invented_system_prompt(tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert (
        render(tokenizer, messages)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    )
    with_tools = render(tokenizer, messages[:1], tools=TOOLS)
    assert with_tools.startswith("<|im_start|>system\n# Tools\n") and with_tools.endswith(
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def _conversations():
    yield MIXED, TOOLS
    rng = random.Random(0)
    for source in source_names():  # every task, and every role of a multi-role task
        demonstrate, tools = source_demonstration(source)
        tasks = TASKS[source.split(".")[0]].train_tasks(0)
        for _ in range(5):
            yield demonstrate(next(tasks), rng), tools


@pytest.mark.parametrize("use_tools", [False, True])
def test_prefix_stable(tokenizer, use_tools):
    for messages, tools in _conversations():
        tools = tools if use_tools else None
        for k in range(1, len(messages)):  # transformers refuses to render an empty conversation
            shorter = render(tokenizer, messages[:k], tools)
            longer = render(tokenizer, messages[: k + 1], tools)
            assert longer.startswith(shorter), (k, shorter[-80:], longer[-120:])
            if messages[k]["role"] == "assistant":  # the generation prompt is where the reply starts
                assert longer.startswith(render(tokenizer, messages[:k], tools, generation_prompt=True))
