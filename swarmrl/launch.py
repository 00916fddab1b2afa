"""Process layout of a swarm on one machine: what `swarmrl up` starts for a `Swarm` description.

Per model: one engine and one trainer. Once: ledger, merger, gateway (routing every model by name).
Per task: `clients` client processes, the built-in Python runner or the task's own `command`. Clients
get the agent connection details through a file (`connect.json` in the run dir, mode 0600) named by
`$SWARMRL_CONNECT_FILE`, never on their command line.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from swarmrl.infra.nats_server import free_port
from swarmrl.supervisor import Supervisor
from swarmrl.swarm import Swarm

SERVE = ["-m", "swarmrl.cli", "serve"]
CONNECT_FILE = "connect.json"


def write_connect_file(run_dir: Path, agent_url: str, swarm: Swarm) -> Path:
    """The agent-role connection details for clients and outside agents, readable by the owner only."""
    parts = [urlsplit(u.strip()) for u in agent_url.split(",")]
    servers = [f"{p.scheme}://{p.hostname}:{p.port}" for p in parts]
    info = {
        "nats_url": ",".join(servers),
        "user": parts[0].username or "",
        "password": parts[0].password or "",
        "models": list(swarm.models),
        "tasks": {
            name: {"roles": t.roles, "num_repeat": swarm.num_repeat(name)} for name, t in swarm.tasks.items()
        },
    }
    path = run_dir / CONNECT_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, indent=2)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return path


def agent_url_from_file(path: str | Path) -> str:
    """`nats://user:password@host:port[,...]` from a connect file (for clients built on nats-py)."""
    info = json.loads(Path(path).read_text())
    creds = f"{info['user']}:{info['password']}@" if info.get("user") else ""
    return ",".join(u.replace("://", f"://{creds}", 1) for u in info["nats_url"].split(","))


def spawn_services(
    sup: Supervisor, swarm: Swarm, model_dirs: dict[str, Path], run_dir: Path, service_url: str
) -> None:
    # One torch thread each: engines and trainers share the cores, and oversubscribing them was ~4x slower.
    env = {
        "SWARMRL_NATS": service_url,
        "SWARMRL_SECRET": secrets.token_urlsafe(32),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    sup.spawn("ledger", [*SERVE, "ledger", "--run-dir", str(run_dir)], env)
    engines = []
    for name, m in swarm.models.items():
        port = free_port()
        argv = [*SERVE, "engine", "--model", name, "--model-path", str(model_dirs[name]), "--port", str(port)]
        sup.spawn(_proc("engine", name, swarm), [*argv, *m.engine_args], env)
        engines += ["--engine", f"{name}=http://127.0.0.1:{port}"]
    sup.spawn("merger", [*SERVE, "merger"], env)
    for name, m in swarm.models.items():
        argv = [
            *SERVE, "trainer", "--model", name, "--model-path", str(model_dirs[name]), "--run-dir", str(run_dir),
            "--num-repeat", str(m.num_repeat), "--batch-groups", str(m.batch_groups), "--lr", str(m.lr),
            "--max-steps", str(swarm.run.steps), "--max-tokens-per-micro-batch", str(m.micro_batch_tokens),
        ]  # fmt: skip
        sup.spawn(_proc("trainer", name, swarm), [*argv, *m.trainer_args], env)
    # Admission control bounds one backlog for all models: the tightest model's.
    backlog = min(m.backlog() for m in swarm.models.values())
    gateway = [*SERVE, "gateway", *engines, "--port", str(free_port()), "--max-backlog", str(backlog)]
    if len(swarm.tasks) > 1:
        gateway += [arg for t, w in swarm.weights().items() for arg in ("--task-weight", f"{t}={w:.6g}")]
    sup.spawn("gateway", gateway, env)


def _proc(kind: str, model: str, swarm: Swarm) -> str:
    """Process name: `engine` / `trainer` for a one-model swarm (as before), `engine-<model>` otherwise."""
    return kind if len(swarm.models) == 1 else f"{kind}-{model}"


def trainer_procs(swarm: Swarm) -> list[str]:
    return [_proc("trainer", m, swarm) for m in swarm.models]


def client_argv(swarm: Swarm, task: str) -> list[str]:
    """Command line of `task`'s clients: its own command, or the built-in runner."""
    t = swarm.tasks[task]
    if t.command is not None:
        return list(t.command)
    roles = [arg for role, model in t.roles.items() for arg in ("--role", f"{role}={model}")]
    return [
        "-m", "swarmrl.agents.runner", "--task", task, *roles,
        "--num-repeat", str(swarm.num_repeat(task)), "--concurrency", str(t.concurrency),
        "--max-tokens", str(swarm.run.max_tokens), "--abort-rate", str(swarm.run.abort_rate),
    ]  # fmt: skip


def spawn_clients(
    sup: Supervisor, swarm: Swarm, task: str, connect_file: Path, generation: int = 0, version: str = ""
) -> list[str]:
    """Start `task`'s client processes; returns their process names. `generation` counts restarts
    (`swarmrl clients restart`), so every generation has its own names, seeds and logs."""
    t = swarm.tasks[task]
    names = []
    for i in range(t.clients):
        name = f"client-{task}-{i}" + (f"-g{generation}" if generation else "")
        env = {
            "PYTHONUNBUFFERED": "1",
            "SWARMRL_CONNECT_FILE": str(connect_file),
            "SWARMRL_TASK": task,
            "SWARMRL_ROLES": json.dumps(t.roles),
            "SWARMRL_NUM_REPEAT": str(swarm.num_repeat(task)),
            "SWARMRL_CLIENT_SEED": str(1000 + 100 * generation + i),
        }
        if version:
            env["SWARMRL_CODE_VERSION"] = version
        argv = client_argv(swarm, task)
        if t.command is None:
            argv += ["--seed", env["SWARMRL_CLIENT_SEED"]]
            sup.spawn(name, argv, env)
        else:
            sup.spawn(name, argv, env, python=False)
        names.append(name)
    return names
