"""Real tokenizers' chat templates drop `tools` (SmolLM2's ChatML, Gemma 3's turns), so the gateway
writes them into the prompt in Hermes' convention and reads calls back in it. The token-exact reuse
checks run against these tokenizers in `test_prompts.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarmrl.services.gateway.core import ModelHandle
from swarmrl.services.gateway.prompts import PromptBuilder, renders_tools, stop_token_ids
from tests.unit.gateway.test_prompts import TOOLS, TURN_END


@pytest.mark.parametrize("family", ["smollm", "gemma"])
def test_the_templates_drop_tools_so_the_gateway_writes_them(
    request: pytest.FixtureRequest, family: str
) -> None:
    path: Path = request.getfixturevalue(f"{family}_dir")
    tokenizer = AutoTokenizer.from_pretrained(path)
    builder = PromptBuilder(tokenizer)
    assert not renders_tools(tokenizer) and builder.hermes
    text = builder.render([{"role": "user", "content": "What is 2+3?"}], TOOLS, gen_prompt=True)
    assert '"name": "calculator"' in text and "<tool_call>" in text
    assert "calculator" not in PromptBuilder(tokenizer, "template").render(
        [{"role": "user", "content": "What is 2+3?"}], TOOLS, gen_prompt=True
    )  # what the template alone would have shown the model
    assert ModelHandle("m", tokenizer, engine=None, context_len=8192).fmt.tools == "hermes"
    assert tokenizer.convert_tokens_to_ids(TURN_END[family]) in stop_token_ids(tokenizer)
