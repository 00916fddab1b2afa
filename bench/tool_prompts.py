"""Does SmolLM2-135M-Instruct call a tool? 32 sampled answers (temperature 1) per way of asking.

    python bench/tool_prompts.py

The question is `examples/smollm/tools.py`'s ("What is 47 times 83?", a `multiply(a, b)` tool). Ways
of writing the tool into the prompt: the gateway's Hermes system prompt (`hermes_messages`, what
`tool_prompt = "auto"` gives a template that drops `tools`); the function-calling system prompt of
SmolLM2's model card (`<tools>` and a list of calls in `<tool_call>`); the gateway's prompt with one
worked call; and the gateway's prompt with "Call a tool." after the question. Prints, per way, how
many answers open a `<tool_call>`, name `multiply`, and pass the question's numbers. Quoted in
`bench/results/up/smollm-tools-30min.md`.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.models import model_dir
from swarmrl.services.gateway.prompts import hermes_messages

SYSTEM = "Use the multiply tool to work out products. Then reply with the number only."
SPEC = {"name": "multiply", "description": "Multiply two whole numbers.",
        "parameters": {"type": "object", "required": ["a", "b"],
                       "properties": {"a": {"type": "integer", "description": "the first number"},
                                      "b": {"type": "integer", "description": "the second number"}}}}  # fmt: skip
CARD = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n\n"
    f"You have access to the following tools:\n<tools>{json.dumps([SPEC])}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    '<tool_call>[\n{"name": "func_name1", "arguments": {"argument1": "value1"}},\n... (more tool calls as required)\n]</tool_call>'
)


def gateway(a: int, b: int) -> list[dict[str, Any]]:
    asked = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} times {b}?"}]
    return hermes_messages(asked, [{"type": "function", "function": SPEC}])


def card(a: int, b: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": CARD}, {"role": "user", "content": f"What is {a} times {b}?"}]


def worked(a: int, b: int) -> list[dict[str, Any]]:
    m = gateway(a, b)
    m[0]["content"] += (
        '\nFor example:\n<tool_call>\n{"name": "multiply", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    return m


def told(a: int, b: int) -> list[dict[str, Any]]:
    m = gateway(a, b)
    m[-1]["content"] += " Call a tool."
    return m


def main() -> None:
    torch.set_num_threads(2)
    path = str(model_dir("smollm2-135m-instruct"))
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    rng = random.Random(0)
    questions = [(rng.randint(11, 99), rng.randint(11, 99)) for _ in range(32)]
    for name, way in {
        "gateway (hermes)": gateway,
        "model card": card,
        "one worked call": worked,
        "told to": told,
    }.items():
        texts = [
            tok.apply_chat_template(way(a, b), add_generation_prompt=True, tokenize=False)
            for a, b in questions
        ]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=48, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)  # fmt: skip
        replies = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        opened = sum("<tool_call>" in r for r in replies)
        named = sum(bool(re.search(r'"name":\s*"multiply"', r)) for r in replies)
        right = sum(
            bool(re.search(rf'"a":\s*"?{a}"?,\s*"b":\s*"?{b}"?', r))
            for r, (a, b) in zip(replies, questions, strict=True)
        )
        print(
            f"{name}: <tool_call> {opened}/32, multiply named {named}/32, the question's numbers {right}/32"
        )
        for r in replies[:2]:
            print("   ", json.dumps(r[:120]))


if __name__ == "__main__":
    main()
