"""Process layout of a swarm on one machine: what `swarmrl up` starts for a `Swarm` description.

Per model its engines (models sharing a base may share them) and trainer(s); ledger, merger and
gateway, each `[replicas]` times; the actions service and tracker when used. Per task `clients`
client processes, each with its own NATS identity (`AgentIds`): a connect file (mode 0600) named by
`$SWARMRL_CONNECT_FILE`, never on its command line. Outside agents get `connect.json` in the run dir.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmrl.agents.tasks import get_task
from swarmrl.agents.tasks.dataset import write_tasks_file
from swarmrl.core.config import ServiceConfig, plain_servers, write_config_file
from swarmrl.infra.credentials import AgentCredential, AgentRegistry, reload_servers
from swarmrl.infra.nats_server import free_port
from swarmrl.schemas import subjects as S
from swarmrl.supervisor import Supervisor
from swarmrl.swarm import Swarm, service_config

SERVE = ["-m", "swarmrl.cli", "serve"]
CONNECT_FILE = "connect.json"
OUTSIDE = "outside"
"""The identity `connect.json` carries, for agents started outside `up`."""


@dataclass
class AgentIds:
    """Mints the NATS identities of a run's clients, their connect files under `<run dir>/clients/`."""

    registry: AgentRegistry
    nats_url: str
    """Where agents connect (credentials in it, if any, are dropped: agents log in by nkey)."""
    swarm: Swarm
    run_dir: Path

    def mint(self, names: list[str]) -> dict[str, Path]:
        """A fresh identity per process name, one config reload for all; returns name -> connect file."""
        servers = plain_servers(self.nats_url)
        extra = {
            "models": list(self.swarm.models),
            "tasks": {
                name: {"roles": t.roles, "num_repeat": self.swarm.num_repeat(name)}
                for name, t in self.swarm.tasks.items()
            },
        }
        out = {}
        for name in names:
            cred = self.registry.mint(client_name(name), servers, reload=False)
            path = self.run_dir / (CONNECT_FILE if name == OUTSIDE else f"clients/{name}.json")
            out[name] = AgentCredential(cred.name, cred.seed, servers, extra).write(path)
        reload_servers(self.registry.conf_dir)
        return out

    def revoke(self, names: list[str]) -> None:
        for name in names:
            self.registry.revoke(client_name(name), reload=False)
        reload_servers(self.registry.conf_dir)


def client_name(process: str) -> str:
    """The NATS identity of client process `process` (`client-team_calculator-0` -> `team-calculator-0`)."""
    return S.owner_name(process.removeprefix("client-"))


@dataclass
class Proc:
    """One service process of a swarm: its name under `up`, its service and its configuration."""

    name: str
    service: str
    config: ServiceConfig
    processes: int = 1
    """More than 1: started under `accelerate launch` with this many processes (`accelerate_launch`)."""


def plan_services(swarm: Swarm, model_dirs: dict[str, Path], run_dir: Path) -> list[Proc]:
    """Every service process of `swarm` on this machine, in start order, each configured by
    `service_config` plus where it runs here. Replicas share their work by leases in NATS KV."""
    n = swarm.replicas
    procs = _replicas(swarm, "ledger", n.ledger, run_dir=run_dir)
    urls: dict[str, list[str]] = {}
    for name in swarm.models:
        if swarm.engine_owner(name) != name:
            continue
        for i in range(n.engine):
            cfg = service_config(swarm, "engine", name, model_path=str(model_dirs[name]), port=free_port(),
                                 adapters=swarm.adapters(name))  # fmt: skip
            procs.append(Proc(_replica(_proc("engine", name, swarm), i, n.engine), "engine", cfg))
            urls.setdefault(name, []).append(f"http://127.0.0.1:{cfg.port}")
    engines = [f"{name}={url}" for name in swarm.models for url in urls[swarm.engine_owner(name)]]
    lora = [name for owner in urls for name in swarm.adapters(owner)]
    procs += _replicas(swarm, "merger", n.merger)
    for name in swarm.models:  # more than one: a lead and its standbys (services/trainer/lead.py)
        procs += _replicas(swarm, "trainer", n.trainer, name, model_path=str(model_dirs[name]),
                           run_dir=str(run_dir))  # fmt: skip
    for i in range(n.gateway):
        cfg = service_config(swarm, "gateway", engine=engines, lora=lora, port=free_port())
        procs.append(Proc(_replica("gateway", i, n.gateway), "gateway", cfg))
    if uses_actions(swarm):
        procs.append(Proc("actions", "actions", service_config(swarm, "actions")))
    tracker = service_config(swarm, "tracker", run_dir=run_dir)
    if tracker.track:
        procs.append(Proc("tracker", "tracker", tracker))
    return procs


def _replicas(swarm: Swarm, service: str, n: int, model: str | None = None, **placement: Any) -> list[Proc]:
    """The `n` processes of `service` (of `model`), each told its name as its `replica` when `n` > 1."""
    base = service if model is None else _proc(service, model, swarm)
    procs = []
    for i in range(n):
        name = _replica(base, i, n)
        cfg = service_config(swarm, service, model, replica=name if n > 1 else "", **placement)
        procs.append(Proc(name, service, cfg, 1 if model is None else swarm.models[model].trainer_processes))
    return procs


def spawn_services(
    sup: Supervisor,
    procs: list[Proc],
    run_dir: Path,
    service_url: str,
    role_urls: dict[str, str] | None = None,
) -> None:
    """Start `procs`, each as `swarmrl serve NAME --config <run dir>/config/<process>.json`, with
    credentials by environment: its role's NATS user from `role_urls`, else `service_url`'s."""
    # One torch thread each: engines and trainers share the cores.
    env = {
        "SWARMRL_NATS": service_url,
        "SWARMRL_SECRET": secrets.token_urlsafe(32),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    for proc in procs:
        path = write_config_file(run_dir / "config" / f"{proc.name}.json", proc.service, proc.config)
        launch, launch_env = accelerate_launch(proc.processes) if proc.processes > 1 else ([], {})
        nats = {"SWARMRL_NATS": (role_urls or {}).get(proc.service, service_url)}
        argv = [*launch, *SERVE, proc.service, "--config", str(path)]
        sup.spawn(proc.name, argv, env | nats | launch_env, role=proc.service)


def accelerate_launch(processes: int) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment that run a `python -m` command as `processes` processes of one job
    under `accelerate launch` (DDP over NCCL with GPUs, else over gloo)."""
    import torch

    argv = [
        "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()),
    ]  # fmt: skip
    return argv, {} if torch.cuda.is_available() else {"ACCELERATE_USE_CPU": "true"}


def uses_actions(swarm: Swarm) -> bool:
    """Whether the swarm runs an actions service: some built-in client's task has tool actions."""
    return swarm.run.actions != "off" and any(
        t.command is None and t.clients > 0 and get_task(name).tool_actions is not None
        for name, t in swarm.tasks.items()
    )


def _proc(kind: str, model: str, swarm: Swarm) -> str:
    """Process name: `engine` / `trainer` for a one-model swarm, `engine-<model>` otherwise."""
    return kind if len(swarm.models) == 1 else f"{kind}-{model}"


def _replica(name: str, i: int, n: int) -> str:
    """Process name of replica `i` of `n`: `name` alone, else `name-<i>`."""
    return f"{name}-{i}" if n > 1 else name


def client_argv(swarm: Swarm, task: str) -> list[str]:
    """Command line of `task`'s clients: its own command, or the built-in runner."""
    t = swarm.tasks[task]
    if t.command is not None:
        return list(t.command)
    roles = [arg for role, model in t.roles.items() for arg in ("--role", f"{role}={model}")]
    return [
        "-m", "swarmrl.agents.runner", "--task", task, *roles,
        "--num-repeat", str(swarm.num_repeat(task)), "--concurrency", str(t.concurrency),
        *(["--max-tokens", str(n)] if (n := swarm.max_tokens(task)) else []),
        "--abort-rate", str(swarm.run.abort_rate),
        *(["--tool-actions"] if uses_actions(swarm) and get_task(task).tool_actions else []),
    ]  # fmt: skip


def client_names(swarm: Swarm, task: str, generation: int = 0) -> list[str]:
    """Process names of `task`'s clients in restart generation `generation` (0: the first)."""
    suffix = f"-g{generation}" if generation else ""
    return [f"client-{task}-{i}{suffix}" for i in range(swarm.tasks[task].clients)]


def spawn_clients(
    sup: Supervisor, swarm: Swarm, task: str, ids: AgentIds, generation: int = 0, version: str = ""
) -> list[str]:
    """Start `task`'s client processes; returns their names. `generation` counts restarts, so each
    has its own names, identities, seeds and logs."""
    t = swarm.tasks[task]
    names = client_names(swarm, task, generation)
    files = ids.mint(names)
    tasks_file = write_tasks_file(ids.run_dir / "config" / "tasks.json", swarm.tasks)
    for i, name in enumerate(names):
        env = {
            "PYTHONUNBUFFERED": "1",
            "SWARMRL_CONNECT_FILE": str(files[name]),
            "SWARMRL_TASK": task,
            "SWARMRL_ROLES": json.dumps(t.roles),
            "SWARMRL_NUM_REPEAT": str(swarm.num_repeat(task)),
            # the run's seed shifts every client's stream; seed 0 keeps the streams `up` always used
            "SWARMRL_CLIENT_SEED": str(1000 + 100 * generation + i + 10_000 * swarm.run.seed),
        }
        if version:
            env["SWARMRL_CODE_VERSION"] = version
        if tasks_file is not None:  # the dataset tasks' rows and reward functions
            env["SWARMRL_TASKS_FILE"] = str(tasks_file)
        builtin = t.command is None
        argv = client_argv(swarm, task) + (["--seed", env["SWARMRL_CLIENT_SEED"]] if builtin else [])
        sup.spawn(name, argv, env, python=builtin, role="client")
    return names
