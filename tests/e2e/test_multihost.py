"""The multi-host recipe, `infra/multihost.md`, run as written on three hosts that are network
namespaces of this machine (`tests/support/netns.py`, `tests/support/multihost.py`), each with its own
address and its own directory, the other hosts' directories hidden from its processes: the trainer
on A trains, the engine on B serves the versions A trained (fetched through NATS's object store: A's
checkpoint paths do not exist on B), and a query asked on A is answered by the ledger on C from C's
files.
Skipped with the reason where network namespaces cannot be made (not root, no `ip netns`)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmrl.schemas import ModelVersion, decode
from swarmrl.services.common import bus
from tests.support.multihost import RECIPE, Recipe, listeners, operator_url, secrets_env
from tests.support.netns import Hosts, unavailable

STEPS = 2
"""Versions the trainer must have made before the engine is checked for one of them."""


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if reason := unavailable(need_nft=True):
        pytest.skip(reason)
    with Hosts(["a", "b", "c"], tmp_path / "hosts") as hosts:
        yield hosts


def base_model() -> Path:
    """The `tiny` preset, built once in this machine's cache (minutes the first time)."""
    from swarmrl.bootstrap import ensure_model

    return ensure_model("tiny", progress=False)


async def kv_version(url: str) -> ModelVersion | None:
    nc = await bus.connect(url, "test-multihost")
    try:
        entry = await (await bus.models_kv(nc.jetstream())).get("policy")
        return decode(entry.value, ModelVersion) if entry.value else None
    except Exception:  # no version yet, or the cluster is electing: asked again
        return None
    finally:
        await nc.close()


def wait(what: str, recipe: Recipe, timeout_s: float, probe) -> object:  # noqa: ANN001
    """Poll `probe()` until it returns something truthy; fail with every process's log tail."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dead := recipe.dead():
            logs = "\n".join(f"--- {n}\n{recipe.tail(n)}" for n in dead)
            raise AssertionError(f"recipe processes exited while waiting for {what}: {dead}\n{logs}")
        if value := probe():
            return value
        time.sleep(2.0)
    logs = "\n".join(f"--- {n}\n{recipe.tail(n, 15)}" for n in recipe.procs)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_recipe_trains_on_a_serves_on_b_and_answers_queries_from_c(hosts: Hosts) -> None:
    model = base_model()
    for h in ("a", "b"):  # "installed" on the trainer's and the engine's hosts: step 5 then finds it
        shutil.copytree(model, hosts.hosts[h].dir / "home" / "models" / model.name)
    with Recipe(RECIPE, hosts, env={"OMP_NUM_THREADS": "1"}) as recipe:
        recipe.start()
        url = operator_url(hosts, secrets_env(hosts.hosts["a"].dir / "secrets.env"))

        def trained() -> ModelVersion | None:
            mv = asyncio.run(kv_version(url))
            return mv if mv is not None and mv.version >= STEPS else None

        mv = wait(f"version {STEPS} from the trainer on A", recipe, 900, trained)
        assert isinstance(mv, ModelVersion)
        assert Path(mv.path).is_relative_to(hosts.hosts["a"].dir)  # a path on A, which B cannot see

        def served() -> dict[str, int] | None:
            try:
                (out,) = recipe.check()
            except RuntimeError:  # the ledger not up yet, or nothing recorded
                return None
            (row,) = json.loads(out)
            return row if (row["served_version"] or 0) >= STEPS and row["trainer_step"] else None

        row = wait(f"llm calls by a version >= {STEPS}, as C's ledger answers", recipe, 600, served)
        assert isinstance(row, dict) and row["calls"] > 0
        fetched = sorted((hosts.hosts["b"].dir / "home" / "weights" / "policy").glob("v*/manifest.json"))
        assert fetched, "the engine on B served trained versions without fetching any from the object store"
        assert "fetched from swarm-weights" in recipe.log("B:engine").read_text()
        # the ledger's files are on C alone, and the answer came from there
        assert list((hosts.hosts["c"].dir / "run" / "ledger").rglob("*.parquet"))
        assert not (hosts.hosts["a"].dir / "run" / "ledger").exists()
        # every listener on a host's own address or its loopback, none on all interfaces
        for name, host in hosts.hosts.items():
            bound = listeners(hosts, name)
            assert bound and all(a.rsplit(":", 1)[0] in (host.addr, "127.0.0.1") for a in bound), (
                name,
                bound,
            )
        codes = recipe.stop()
    assert codes and all(code == 0 for code in codes.values()), {
        n: (c, recipe.tail(n, 20)) for n, c in codes.items() if c != 0
    }
