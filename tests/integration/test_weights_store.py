"""Weights across hosts through NATS's object store (`services/common/objects.py`), with the trainer's
and the engine's own NATS users: what a trainer shares, an engine without its files fetches whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import ModelVersion
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.objects import (
    KEEP_VERSIONS,
    MANIFEST,
    WeightStore,
    WeightsUnavailable,
    fetched_root,
    local_weights,
)


def checkpoint(path: Path, seed: int, size: int = 3 * 1024 * 1024 + 17) -> Path:
    """A checkpoint-like directory: weights bigger than one chunk, config, tokenizer, optimizer state."""
    (path / "tok").mkdir(parents=True)
    (path / "model.safetensors").write_bytes(bytes((seed + i) % 251 for i in range(size)))
    (path / "config.json").write_text(json.dumps({"seed": seed}))
    (path / "tok" / "tokenizer.json").write_text("{}")
    (path / "optimizer-rank0.pt").write_bytes(b"not for engines")
    (path / "trainer_state.json").write_text("{}")
    return path


@pytest.fixture
async def role_js(swarm_nats: NatsServer) -> AsyncIterator[dict[str, JetStreamContext]]:
    conns = {role: await bus.connect(swarm_nats.url(role), f"test-{role}") for role in ("trainer", "engine")}
    yield {role: nc.jetstream() for role, nc in conns.items()}
    for nc in conns.values():
        await nc.close()


@pytest.fixture(autouse=True)
def engine_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SWARMRL_HOME", str(tmp_path / "engine-home"))
    return tmp_path / "engine-home"


async def test_an_engine_fetches_a_version_it_cannot_see_and_loads_it_whole(
    role_js: dict[str, JetStreamContext], tmp_path: Path
) -> None:
    src = checkpoint(tmp_path / "trainer" / "step-1", seed=1)
    store = await WeightStore.open(role_js["trainer"], "policy")
    assert (await store.put(1, src))["sent"] == 3  # the optimizer and trainer state stay behind
    gone = ModelVersion(version=1, path=str(tmp_path / "elsewhere" / "step-1"), step=1)
    path = Path(await local_weights(role_js["engine"], "policy", gone))
    assert path == fetched_root("policy") / "v1" and (path / MANIFEST).is_file()
    for rel in ("model.safetensors", "config.json", "tok/tokenizer.json"):
        assert (path / rel).read_bytes() == (src / rel).read_bytes()
    assert not (path / "optimizer-rank0.pt").exists()
    # fetched once: asked again, the engine has it (even with the bucket's copy gone)
    await (await role_js["trainer"].object_store(S.WEIGHTS_BUCKET)).delete("policy/1")
    assert await local_weights(role_js["engine"], "policy", gone) == str(path)


async def test_a_path_this_host_has_is_used_as_it_is(
    role_js: dict[str, JetStreamContext], tmp_path: Path
) -> None:
    src = checkpoint(tmp_path / "step-2", seed=2, size=10)
    mv = ModelVersion(version=2, path=str(src), step=2)
    assert await local_weights(role_js["engine"], "policy", mv) == str(src)  # nothing shared, nothing needed


async def test_a_version_nobody_shared_is_unavailable_with_the_reason(
    role_js: dict[str, JetStreamContext], tmp_path: Path
) -> None:
    mv = ModelVersion(version=9, path=str(tmp_path / "nowhere"), step=9)
    with pytest.raises(WeightsUnavailable) as caught:
        await local_weights(role_js["engine"], "policy", mv)
    assert caught.value.status == 404 and "share_weights" in str(caught.value)


async def test_the_store_keeps_the_newest_versions_and_skips_files_already_there(
    role_js: dict[str, JetStreamContext], tmp_path: Path
) -> None:
    store = await WeightStore.open(role_js["trainer"], "policy")
    base = checkpoint(tmp_path / "base", seed=0, size=1000)
    for v in range(5):
        await store.put(v, base if v == 0 else checkpoint(tmp_path / f"step-{v}", seed=v, size=1000))
    again = await store.put(4, tmp_path / "step-4")  # a restarted trainer puts its version again
    assert again["sent"] == 0 and again["skipped"] == 3
    obs = await role_js["trainer"].object_store(S.WEIGHTS_BUCKET)
    names = {i.name for i in await obs.list(ignore_deletes=True)}
    kept = {int(n.split("/")[1]) for n in names}
    assert kept == set(range(5 - KEEP_VERSIONS, 5)), names
    for v in range(5 - KEEP_VERSIONS, 5):  # whole: the manifest and every file
        assert {f"policy/{v}", f"policy/{v}/model.safetensors", f"policy/{v}/tok/tokenizer.json"} <= names
    # the engine's own copies are pruned the same way
    for v in range(5 - KEEP_VERSIONS, 5):
        await local_weights(role_js["engine"], "policy", ModelVersion(version=v, path="/gone", step=v))
    assert sorted(p.name for p in fetched_root("policy").iterdir()) == [
        f"v{v}" for v in range(5 - KEEP_VERSIONS, 5)
    ]
