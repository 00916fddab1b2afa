"""`swarmrl up --seed N` (added for research): the trainers, engines and clients get it; 0 changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmrl.launch import plan_services, spawn_clients
from swarmrl.up import parse_args


class Recorder:
    """A Supervisor stand-in that records what would be started."""

    def __init__(self) -> None:
        self.spawned: dict[str, tuple[list[str], dict[str, str]]] = {}

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        python: bool = True,
        role: str = "",
    ) -> Any:
        self.spawned[name] = (argv, env or {})


class Ids:
    run_dir = Path("/x")  # no dataset task here: spawn_clients writes no tasks file under it

    def mint(self, names: list[str]) -> dict[str, Path]:
        return {n: Path(f"/x/{n}.json") for n in names}


def launched(argv: list[str]) -> tuple[Recorder, dict[str, Any]]:
    """The clients `up` would start, and the resolved configuration of each service process."""
    _, swarm = parse_args(argv)
    sup = Recorder()
    spawn_clients(sup, swarm, "calculator", Ids())  # type: ignore[arg-type]
    return sup, {p.name: p.config for p in plan_services(swarm, {"policy": Path("/m")}, Path("/r"))}


def test_the_seed_reaches_every_process() -> None:
    sup, configs = launched(["--seed", "3"])
    assert configs["trainer"].seed == 3 and configs["engine"].seed == 3
    assert [sup.spawned[f"client-calculator-{i}"][1]["SWARMRL_CLIENT_SEED"] for i in (0, 1)] == [
        "31000",
        "31001",
    ]


def test_seed_0_is_what_up_always_did() -> None:
    sup, configs = launched([])
    assert parse_args([])[1].run.seed == 0 and configs["trainer"].seed == 0
    assert [sup.spawned[f"client-calculator-{i}"][1]["SWARMRL_CLIENT_SEED"] for i in (0, 1)] == [
        "1000",
        "1001",
    ]
