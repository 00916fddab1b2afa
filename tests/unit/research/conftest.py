"""A study state built in memory (no files), for the scheduling and report tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.research.state import StudyState
from swarmrl.research.study import load_study_text

STUDY = """
name = "s"
question = "q?"
seeds = [1, 2, 3]
[baseline]
name = "base"
[arms.a]
flags = {{ lr = 3e-4 }}
[arms.b]
flags = {{ lr = 3e-5 }}
[arms.c]
flags = {{ lr = 1e-3 }}
[metric]
use = "final_success"
goal = "{goal}"
[budget]
run_minutes = 10
{extra}
"""


@pytest.fixture
def make_state(tmp_path: Path):
    def make(
        goal: str = "max", extra: str = "[early_stop]\nafter_seeds = [1, 2]\nkeep = 0.5\n"
    ) -> StudyState:
        study = load_study_text(STUDY.format(goal=goal, extra=extra), tmp_path)
        return StudyState.new(study, tmp_path / "study.toml")

    return make
