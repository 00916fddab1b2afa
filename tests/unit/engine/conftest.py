"""Engine fixtures: the embedded engine over the project's tiny model, and a second set of weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmrl.services.engine.engine_core import EngineCore
from tests.unit.engine.helpers import save_perturbed


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path) -> Iterator[EngineCore]:
    """Shared by read-only tests; tests that reload weights make their own."""
    core = EngineCore(tiny_model_dir, max_batch=8)
    yield core
    core.close()


@pytest.fixture(scope="session")
def other_weights_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with every parameter perturbed, saved like a trainer checkpoint (weights only)."""
    return save_perturbed(tiny_model_dir, tmp_path_factory.mktemp("tiny-perturbed"))
