"""The planner path of `swarmrl research --topic`, against a scripted OpenAI-compatible server.

An outside LLM cannot run here, so a small FastAPI app plays the planner: it answers
`/v1/chat/completions` with scripted replies (first an invalid study, then a valid one) and records
every request, so the test sees what the planner was shown and that the validation errors went back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from swarmrl.research.planner import PlannerError, extract_toml, plan
from swarmrl.services.common.http import BackgroundServer

VALID = """Here is the study.
```toml
name = "lr-topic"
question = "Does a higher learning rate help calculator?"
seeds = [1, 2]
[baseline]
flags = { task = "calculator" }
[arms.high]
flags = { lr = 3e-4 }
[metric]
use = "auc_success"
[budget]
run_minutes = 5
total_minutes = 30
```
"""
INVALID = VALID.replace("lr = 3e-4", "learning_rate = 3e-4")


class Planner:
    """A scripted chat-completions endpoint: replies in order, requests recorded."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.requests = list(replies), []  # type: list[str], list[dict[str, Any]]
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        content = self.replies.pop(0)
        return {
            "id": f"c{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }  # fmt: skip


@pytest.fixture
def planner(request: pytest.FixtureRequest) -> Iterator[tuple[Planner, str]]:
    p = Planner(request.param)
    server = BackgroundServer(p.app).start()
    yield p, f"{server.url}/v1"
    server.stop()


@pytest.mark.parametrize("planner", [[INVALID, VALID]], indirect=True)
def test_the_planner_is_shown_the_knobs_and_corrected_by_the_validator(planner, tmp_path: Path) -> None:
    p, url = planner
    text, study = plan(
        "learning rates on calculator", url, "planner-1", "", tmp_path, transcript=tmp_path / "t.jsonl"
    )
    assert study.name == "lr-topic" and study.flags("high")["lr"] == 3e-4 and text == extract_toml(VALID)
    first, second = p.requests
    system = first["messages"][0]["content"]
    assert first["model"] == "planner-1" and "learning rates on calculator" in first["messages"][1]["content"]
    for knob in ("- lr: AdamW learning rate", "- eval-limit:", "calculator", "auc_success", "train_steps"):
        assert knob in system
    feedback = second["messages"][-1]["content"]
    assert "arms.high.flags.learning_rate: unknown swarmrl up flag" in feedback
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 5  # system, topic, reply, errors, reply


@pytest.mark.parametrize("planner", [[INVALID, "no toml at all", INVALID]], indirect=True)
def test_a_planner_that_never_gets_it_right_is_refused(planner, tmp_path: Path) -> None:
    _, url = planner
    with pytest.raises(PlannerError, match="no valid study in 3 replies") as exc:
        plan("t", url, "m", "", tmp_path)
    assert "learning_rate" in str(exc.value)


@pytest.mark.parametrize("planner", [[VALID]], indirect=True)
def test_research_topic_writes_the_study(planner, tmp_path: Path) -> None:
    _, url = planner
    cmd = [sys.executable, "-m", "swarmrl.cli", "research", "--topic", "lr", "--planner-url", url,
           "--planner-model", "m", "--plan-only", "--dir", str(tmp_path / "s")]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=os.environ | {"OPENAI_API_KEY": "k"}, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "s" / "study.toml").read_text() == extract_toml(VALID)
    assert json.loads((tmp_path / "s" / "planner.jsonl").read_text().splitlines()[-1])["role"] == "assistant"
