"""Token-exact capture with real tokenizers: SmolLM2's 49k BPE and ChatML, Gemma 3's 262k and its
turns. The checks of `test_prompts.py` (follow-ups extend earlier calls token for token, generated
tool-call tokens survive, no reuse when the conversation is not an extension), and the tools these
templates drop reaching the model through the gateway's Hermes prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarmrl.services.gateway.core import ModelHandle
from swarmrl.services.gateway.prompts import CallRecord, PromptBuilder, renders_tools, stop_token_ids
from tests.unit.gateway.test_prompts import TOOLS

TURN_END = {"smollm": "<|im_end|>", "gemma": "<end_of_turn>"}


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def family(request: pytest.FixtureRequest) -> tuple[str, PromptBuilder]:
    path: Path = request.getfixturevalue(f"{request.param}_dir")
    return request.param, PromptBuilder(AutoTokenizer.from_pretrained(path))


def _generate(name: str, builder: PromptBuilder, text: str) -> list[int]:
    """What an engine would return for `text`: its tokens and the turn's stop token."""
    return builder.encode(text) + [builder.tok.convert_tokens_to_ids(TURN_END[name])]


def test_the_templates_drop_tools_so_the_gateway_writes_them(family: tuple[str, PromptBuilder]) -> None:
    name, builder = family
    assert not renders_tools(builder.tok) and builder.hermes
    text = builder.render([{"role": "user", "content": "What is 2+3?"}], TOOLS, gen_prompt=True)
    assert '"name": "calculator"' in text and "<tool_call>" in text
    handle = ModelHandle("m", builder.tok, engine=None, context_len=8192)
    assert handle.fmt.tools == "hermes"
    assert builder.tok.convert_tokens_to_ids(TURN_END[name]) in stop_token_ids(builder.tok)


def test_follow_up_prompt_extends_the_earlier_call_token_for_token(family: tuple[str, PromptBuilder]) -> None:
    name, builder = family
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess a number."}]
    history: list[CallRecord] = []
    for turn in range(4):
        ids, reused = builder.build(msgs, [], history)
        if history:
            prev = history[-1]
            assert reused == prev.call_id
            assert ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        out = _generate(name, builder, f"Maybe {10 + turn}?")
        reply = {"role": "assistant", "content": f"Maybe {10 + turn}?"}
        history.append(CallRecord(f"c{turn}", list(msgs), [], ids, out, reply))
        msgs = [*msgs, reply, {"role": "user", "content": "higher"}]
    # no drift in plain text turns: the spliced prompt reads exactly as a fresh rendering
    assert builder.tok.decode(ids) == builder.render(msgs[:-2], [], gen_prompt=True)


def test_generated_tool_call_tokens_survive_a_rendering_that_would_differ(
    family: tuple[str, PromptBuilder],
) -> None:
    name, builder = family
    handle = ModelHandle("m", builder.tok, engine=None, context_len=8192)
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids, _ = builder.build(msgs, TOOLS, [])
    generated = '<tool_call>\n{"name":"calculator","arguments":{"expression":"2+3"}}\n</tool_call>'
    out = _generate(name, builder, generated)
    parsed = handle.fmt.parse(generated, with_tools=True)
    calls = parsed.tool_calls
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2+3"}
    reply = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
    rec = CallRecord("c0", msgs, TOOLS, ids, out, reply)
    follow = [*msgs, reply, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}]
    ids2, reused = builder.build(follow, TOOLS, [rec])
    assert reused == "c0"
    assert ids2[: len(ids) + len(out)] == ids + out
    assert "<tool_response>\n5\n</tool_response>" in builder.tok.decode(ids2[len(ids) + len(out) :])
    # a fresh rendering re-serialises the call (with spaces): the drift reuse avoids
    assert builder.encode(builder.render(follow, TOOLS, gen_prompt=True))[: len(ids) + len(out)] != ids + out


@pytest.mark.parametrize("change", ["edited_history", "other_reply", "tools_changed"])
def test_no_reuse_when_the_conversation_is_not_an_extension(
    family: tuple[str, PromptBuilder], change: str
) -> None:
    name, builder = family
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess."}]
    ids, _ = builder.build(msgs, [], [])
    rec = CallRecord(
        "c0", msgs, [], ids, _generate(name, builder, "7"), {"role": "assistant", "content": "7"}
    )
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
