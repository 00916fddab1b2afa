"""Every README.md code block marked `<!-- tested -->` runs exactly as printed (taken from the README,
so a change to one breaks the other): the dataset task and its reward, the environment, and the
outside agent against a real swarm (gateway, engine, merger, trainer)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks import TASKS, get_task
from swarmrl.agents.tasks.environment import env_task
from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.merger.service import Merger
from swarmrl.services.trainer.service import Trainer
from swarmrl.swarm import build, load
from tests.integration.test_group_outcomes import trainer  # noqa: F401  (a fixture)
from tests.support.localstack import Stack

ROOT = Path(__file__).parents[2]
BLOCKS = re.findall(r"<!-- tested -->\n```(\w+)\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)


def block(lang: str, contains: str) -> str:
    found = [code for kind, code in BLOCKS if kind == lang and contains in code]
    assert len(found) == 1, f"README.md: {len(found)} tested {lang} blocks contain {contains!r}"
    return found[0] + "\n"


def test_the_readme_marks_the_agent_the_dataset_task_and_the_environment() -> None:
    assert len(BLOCKS) == 4 and {kind for kind, _ in BLOCKS} == {"toml", "python"}


@pytest.fixture
def restored() -> Iterator[None]:
    before = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(before)


def test_the_dataset_task_and_its_reward_as_printed(tmp_path: Path, restored: None) -> None:
    (tmp_path / "swarm.toml").write_text(block("toml", "[tasks.words]"))
    (tmp_path / "reward.py").write_text(block("python", "def correct("))
    shutil.copy(ROOT / "examples" / "dataset" / "problems.jsonl", tmp_path)
    build(load(tmp_path / "swarm.toml"), str(tmp_path / "swarm.toml"))  # registers `words`, probes the reward
    spec = get_task("words")
    row = spec.eval_tasks()[0]
    scores = []
    for reply in (f"It is {row.columns['answer']}", "no idea"):
        env = spec.make_env(row)
        assert env.reset()[0] == {"role": "system", "content": "Answer with the number only."}
        env.step({"role": "assistant", "content": reply})
        asyncio.run(env.settle())
        scores.append(env.reward)
    assert scores == [1.0, 0.0]


def test_the_environment_as_printed(tmp_path: Path) -> None:
    (tmp_path / "arithmetic.py").write_text(block("python", "class Arithmetic"))
    rows = [{"expression": f"7 * 4 + {i}", "answer": 28 + i} for i in range(10)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    conf = TaskConf(env="arithmetic.py:Arithmetic", data=["rows.jsonl"], max_turns=3).resolve_paths(tmp_path)
    spec = env_task("arithmetic", conf)  # the start-up probe passes
    env = spec.make_env(spec.eval_tasks()[0])
    assert env.reset()[0]["content"].startswith("What is 7 * 4 + ")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "6 * 6"}'},
    }
    (tool,) = env.step({"role": "assistant", "content": None, "tool_calls": [call]}).messages
    assert tool["content"] == "36" and env.tool_specs[0]["function"]["name"] == "calculator"
    answer = str(env.row.columns["answer"])
    assert env.step({"role": "assistant", "content": f"The answer is {answer}"}).done
    assert (env.reward, env.success) == (1.0, True)


@pytest.mark.timeout(300)
async def test_the_agent_as_printed_plays_a_group_and_hears_its_outcome(
    swarm_nats: NatsServer,
    stack: Stack,
    start_merger: Callable[..., Merger],
    trainer: Trainer,  # noqa: F811
    tmp_path: Path,
) -> None:
    start_merger()
    swarm_nats.agent.write(tmp_path / "runs" / "latest" / "connect.json")
    (tmp_path / "agent.py").write_text(block("python", "asyncio.run(main())"))
    proc = await asyncio.create_subprocess_exec(  # a program of its own, as a user runs it
        sys.executable,
        "agent.py",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    print("the agent prints:", stdout.decode())
    assert re.fullmatch(
        r"\[([01]\.0, ){7}[01]\.0\] (trained at step \d+ .*|dropped: zero_adv .*)\n", stdout.decode()
    )
