"""The calculator's tool as a sandbox program (`TOOL_PROGRAM`, run by the actions service) answers
exactly what the in-process tool answers, so `--actions` does not change what the policy learns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from swarmrl.agents.tasks.calculator import TOOL_PROGRAM, Calculator, CalculatorEnv, tool_actions


def call(expression: str) -> dict:
    args = json.dumps({"expression": expression})
    return {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": args}}


@pytest.mark.parametrize(
    "expression", ["7 * 4 + 8", "9 - 2 * 7", "1 / 3", "2 ** 99999", "__import__('os')", "7 +"]
)
def test_the_program_answers_like_the_environment(expression: str) -> None:
    (payload,) = tool_actions({"role": "assistant", "content": None, "tool_calls": [call(expression)]})
    assert payload is not None and payload["code"] == TOOL_PROGRAM and payload["stdin"] == expression
    run = subprocess.run(
        [sys.executable, "-I", "-c", payload["code"]], input=payload["stdin"], capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == CalculatorEnv._run_tool(expression)


def test_results_from_elsewhere_replace_the_environments_own() -> None:
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("7 * 4 + 8"), {"function": {"name": "x"}}],
    }
    assert tool_actions(reply)[1] is None  # a malformed call: the environment answers it itself
    env = CalculatorEnv(Calculator("7 * 4 + 8"))
    env.reset()
    step = env.step(reply, tool_results=["36", None])
    assert [m["content"] for m in step.messages] == ["36", CalculatorEnv._run_tool(None)]
