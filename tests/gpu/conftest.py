"""GPU-check fixtures: a dry run on the CPU keeps Accelerate (process-wide state) on the CPU too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gpu.device import DEVICE_TYPE


@pytest.fixture(scope="session", autouse=True)
def accelerate_device() -> Iterator[None]:
    """Learners built in this process and in the subprocesses it starts land on the device under
    test: Accelerate picks CUDA by itself when there is one, so only a CPU dry run needs telling."""
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE_TYPE == "cpu":
            mp.setenv("ACCELERATE_USE_CPU", "true")
        yield
