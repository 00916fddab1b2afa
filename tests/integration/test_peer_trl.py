"""The TRL peer of `bench/peers.py` trains on the task swarmrl trains on: TRL renders the very prompt
tokens the gateway renders, parses the model's tool calls as the gateway does, and scores an episode
as the task's environment does. Runs in TRL's own venv (`just trl-env`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not TRL_PYTHON.exists(),
    reason="TRL's virtual environment .venv-trl is missing (`just trl-env` installs it)",
)

PROBE = r"""
import json, sys
sys.path.insert(0, "bench/peers")
import trl_grpo
from transformers import AutoTokenizer
from trl.chat_template_utils import parse_response

tok = AutoTokenizer.from_pretrained(sys.argv[1])
tok.response_template = trl_grpo.RESPONSE_TEMPLATE
trl_grpo.check_prompt(tok)  # exits non-zero when the prompts differ

prompt = [{"role": "system", "content": trl_grpo.task.SYSTEM_PROMPT}, {"role": "user", "content": "What is 2 + 3 * 4?"}]
prefix = tok.apply_chat_template(prompt, tools=[trl_grpo.calculator], add_generation_prompt=True, tokenize=True, return_dict=False)

def reply(text):  # what TRL makes of the model's text: its own parser, on the ids the model sampled
    return parse_response(tok, tok(text, add_special_tokens=False)["input_ids"], prefix=prefix, tools=[trl_grpo.calculator])

call = reply('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call><|im_end|>')
tool = {"role": "tool", "name": "calculator", "content": trl_grpo.calculator("2 + 3 * 4")}
print(json.dumps({
    "call": call,
    "tool": tool["content"],
    "right": trl_grpo.episode_reward("2 + 3 * 4", [call, tool, reply("14<|im_end|>")]),
    "wrong": trl_grpo.episode_reward("2 + 3 * 4", [call, tool, reply("15<|im_end|>")]),
    "guess": trl_grpo.episode_reward("2 + 3 * 4", [reply("14<|im_end|>")]),
    "calls_only": trl_grpo.episode_reward("2 + 3 * 4", [call, tool, call, tool, call, tool]),
    "batch": trl_grpo.reward([[reply("14<|im_end|>")], [reply("9<|im_end|>")]], expression=["2 + 3 * 4", "2 + 7"]),
}))
"""


def test_the_trl_peer_sees_the_tasks_prompt_tool_and_reward(tiny_model_dir: Path) -> None:
    out = subprocess.run(
        [str(TRL_PYTHON), "-c", PROBE, str(tiny_model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["call"]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "2 + 3 * 4"},
    }
    assert got["tool"] == "14"
    # the environment's reward: right after the tool 1, wrong 0; a direct right answer counts too (as in
    # swarmrl), and three turns of calls without an answer score 0
    assert (got["right"], got["wrong"], got["guess"], got["calls_only"]) == (1.0, 0.0, 1.0, 0.0)
    assert got["batch"] == [1.0, 1.0]
