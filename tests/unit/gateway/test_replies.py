"""Tool calls and reasoning per model family: parsing, streaming, and exact token reuse with each
family's chat template (`tests/fixtures/chat_templates/`, applied to the project's own tokenizer with
the family's special tokens added, as a real checkpoint of that family has them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmrl.services.gateway.core import ModelHandle
from swarmrl.services.gateway.prompts import CallRecord, PromptBuilder, stop_token_ids
from swarmrl.services.gateway.replies import ReplyFormat, detect
from tests.unit.gateway.test_prompts import TOOLS

TEMPLATES = Path(__file__).parents[2] / "fixtures" / "chat_templates"
FAMILIES = {
    # template: (special tokens the family's vocabulary has, bos, eos, a generated tool call)
    "qwen2.5": ([], None, None, '<tool_call>\n{"name":"calculator","arguments":{"expression":"2+3"}}\n</tool_call>'),
    "qwen3": (
        ["<think>", "</think>"],
        None,
        None,
        '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name":"calculator","arguments":{"expression":"2+3"}}\n</tool_call>',
    ),
    "llama3.1": (
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        "<|begin_of_text|>",
        "<|end_of_text|>",
        '{"name":"calculator","parameters":{"expression":"2+3"}}',
    ),
    "mistral": (
        ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "<s>",
        "</s>",
        '[TOOL_CALLS] [{"name":"calculator","arguments":{"expression":"2+3"}}]',
    ),
}  # fmt: skip
EXPECTED = {
    "qwen2.5": ("hermes", "none"),
    "qwen3": ("hermes", "think"),
    "llama3.1": ("llama3", "none"),
    "mistral": ("mistral", "none"),
}


def family_tokenizer(tmp: Path, family: str):
    from swarmrl.bootstrap.tokenizer import build_tokenizer

    tok = build_tokenizer(tmp)
    specials, bos, eos, _ = FAMILIES[family]
    extra: dict = {"additional_special_tokens": specials}
    if bos:
        extra["bos_token"] = bos
    if eos:
        extra["eos_token"] = eos
    tok.add_special_tokens(extra)
    tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    return tok


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_format_is_read_off_each_familys_chat_template(family: str) -> None:
    assert detect((TEMPLATES / f"{family}.jinja").read_text()) == EXPECTED[family]
    assert detect(None) == ("hermes", "none")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tool_call_in_each_familys_syntax_is_captured_and_extended_token_for_token(
    family: str, tmp_path: Path
) -> None:
    tok = family_tokenizer(tmp_path, family)
    builder, fmt = PromptBuilder(tok), ReplyFormat.for_template(tok.chat_template)
    stop = {"llama3.1": "<|eot_id|>", "mistral": "</s>"}.get(family, "<|im_end|>")
    assert tok.convert_tokens_to_ids(stop) in stop_token_ids(tok)

    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids, fresh = builder.build(msgs, TOOLS, [])
    generated = FAMILIES[family][3]
    out = builder.encode(generated) + [tok.convert_tokens_to_ids(stop)]  # what the engine returns
    reply = fmt.parse(generated, with_tools=True)
    assert [json.loads(c["function"]["arguments"]) for c in reply.tool_calls] == [{"expression": "2+3"}]
    assert reply.content == "" and reply.reasoning == ("Add them." if family == "qwen3" else "")
    message = {"role": "assistant", "content": None, "tool_calls": reply.tool_calls}
    rec = CallRecord("c0", msgs, TOOLS, ids, out, message)
    follow = [*msgs, message, {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "5"}]

    ids2, reused = builder.build(follow, TOOLS, [rec])
    assert fresh is None and reused == "c0"
    assert ids2[: len(ids) + len(out)] == ids + out  # the generated tokens, exactly
    tail = tok.decode(ids2[len(ids) + len(out) :])
    assert "5" in tail and tail.endswith(builder.render(follow, TOOLS, gen_prompt=True)[-12:])


def test_mistral_ids_fit_its_template_and_a_moved_system_prompt_is_not_spliced(tmp_path: Path) -> None:
    tok = family_tokenizer(tmp_path, "mistral")
    builder, fmt = PromptBuilder(tok), ReplyFormat.for_template(tok.chat_template)
    reply = fmt.parse(FAMILIES["mistral"][3], with_tools=True)
    assert len(reply.tool_calls[0]["id"]) == 9 and reply.tool_calls[0]["id"].isalnum()
    # Mistral's template writes the system prompt into the *last* user turn: a follow-up renders
    # the first turn differently, so the builder renders afresh instead of reusing.
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    ids, _ = builder.build(msgs, TOOLS, [])
    message = {"role": "assistant", "content": None, "tool_calls": reply.tool_calls}
    rec = CallRecord("c0", msgs, TOOLS, ids, builder.encode("x") + [tok.eos_token_id], message)
    follow = [*msgs, message, {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "5"}]
    ids2, reused = builder.build(follow, TOOLS, [rec])
    assert reused is None and ids2 == builder.encode(builder.render(follow, TOOLS, gen_prompt=True))


@pytest.mark.parametrize(
    ("fmt", "text", "content", "calls"),
    [
        ("hermes", 'Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "Sure.", [("f", {"a": 1})]),
        ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
        ("hermes", '<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>', "", [("f", {}), ("g", {})]),
        ("hermes", '<tool_call>[{"name": "f", "arguments": {"a": 1}}, {"name": "g"}]</tool_call>', "", [("f", {"a": 1}), ("g", {})]),
        ("hermes", '<tool_call>[{"name": "f"}, 3]</tool_call>', '<tool_call>[{"name": "f"}, 3]</tool_call>', []),
        ("llama3", '{"name": "f", "parameters": {"a": 1}}', "", [("f", {"a": 1})]),
        ("llama3", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', "", [("f", {"a": 1}), ("g", {})]),
        ("llama3", 'The answer is {"a": 1}', 'The answer is {"a": 1}', []),
        ("llama3", '{"a": 1}', '{"a": 1}', []),
        ("mistral", 'Let me. [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', "Let me.", [("f", {"a": 1}), ("g", {})]),
        ("mistral", '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "", [("f", {"a": 1}), ("g", {})]),
        ("mistral", "[TOOL_CALLS] [oops", "[TOOL_CALLS] [oops", []),
        ("none", '<tool_call>{"name": "f"}</tool_call>', '<tool_call>{"name": "f"}</tool_call>', []),
    ],
)  # fmt: skip
def test_each_format_parses_its_calls_and_keeps_what_does_not_parse(
    fmt: str, text: str, content: str, calls: list
) -> None:
    reply = ReplyFormat(tools=fmt).parse(text, with_tools=True)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]
    assert (reply.content, got) == (content, calls)
    assert ReplyFormat(tools=fmt).parse(text, with_tools=False).content == text  # no tools offered


@pytest.mark.parametrize(
    ("text", "opened", "reasoning", "content"),
    [
        ("<think>\nstep by step\n</think>\n\nThe answer is 5.", False, "step by step", "The answer is 5."),
        ("step by step</think>5", True, "step by step", "5"),
        ("<think>cut off mid-thou", False, "cut off mid-thou", ""),
        ("No reasoning here.", False, "", "No reasoning here."),
    ],
)
def test_reasoning_in_think_tags_is_kept_out_of_the_content(
    text: str, opened: bool, reasoning: str, content: str
) -> None:
    reply = ReplyFormat(reasoning="think").parse(text, with_tools=False, opened=opened)
    assert (reply.reasoning, reply.content) == (reasoning, content)
    assert ReplyFormat().parse(text, with_tools=False).content == text  # a model without reasoning


@pytest.mark.parametrize(
    ("fmt", "text", "opened"),
    [
        (ReplyFormat("hermes"), 'Let me compute.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', False),
        (ReplyFormat("hermes", "think"), '<think>\nHm, a < b.\n</think>\n\nSure. <tool_call>{"name": "f"}</tool_call>', False),
        (ReplyFormat("hermes", "think"), "Hm.\n</think>\n\nIt is 5.", True),
        (ReplyFormat("llama3"), '{"name": "f", "parameters": {"a": 1}}', False),
        (ReplyFormat("llama3"), "It is 5, not {6}.", False),
        (ReplyFormat("mistral"), 'Let me. [TOOL_CALLS] [{"name": "f", "arguments": {}}]', False),
        (ReplyFormat("mistral"), "a [ b [TOOL", False),
    ],
)  # fmt: skip
def test_streamed_text_only_grows_and_ends_as_the_parsed_reply(
    fmt: ReplyFormat, text: str, opened: bool
) -> None:
    final = fmt.parse(text, with_tools=True, opened=opened)
    shown = ("", "")
    for n in range(len(text) + 1):
        now = fmt.visible(text[:n], with_tools=True, opened=opened)
        assert now[0].startswith(shown[0]) and now[1].startswith(shown[1]), (text[:n], shown, now)
        shown = now
    assert final.reasoning.startswith(shown[0]) and final.content.startswith(shown[1])
    assert "<tool_call>" not in shown[1] and "[TOOL_CALLS]" not in shown[1] and "</think>" not in shown[0]


def test_a_template_that_opens_the_reasoning_block_in_the_prompt_is_noticed(tmp_path: Path) -> None:
    tok = family_tokenizer(tmp_path, "qwen3")
    tok.chat_template = tok.chat_template.replace(
        "'<|im_start|>assistant\\n' }}\n", "'<|im_start|>assistant\\n<think>\\n' }}\n"
    )
    handle = ModelHandle("m", tok, engine=None, context_len=512)
    ids = handle.builder.build([{"role": "user", "content": "hi"}], [], [])[0]
    assert handle.fmt == ReplyFormat("hermes", "think") and handle.opens_reasoning(ids)
    plain = ModelHandle("m", family_tokenizer(tmp_path / "b", "qwen3"), engine=None, context_len=512)
    assert not plain.opens_reasoning(plain.builder.build([{"role": "user", "content": "hi"}], [], [])[0])


def test_formats_are_checked_and_auto_defers_to_the_template() -> None:
    with pytest.raises(ValueError, match="tool format 'xml'"):
        ReplyFormat(tools="xml")
    with pytest.raises(ValueError, match="reasoning format"):
        ReplyFormat(reasoning="cot")
    assert ReplyFormat.for_template("[TOOL_CALLS]", tools="hermes") == ReplyFormat("hermes", "none")
