"""Control plane of a running `swarmrl up`: `swarm.ctl.<verb>` on NATS (`nats.micro`), reachable
with the service credentials only (agents live in an account that does not import it).
`swarmrl clients`, `status` and `down` are its client side. Requests and replies are JSON:

    swarm.ctl.restart {"task": "calculator", "version": "v2"}   # version optional
    -> {"ok": true, "task": "calculator", "old": [...], "new": [...], "generation": 1,
        "version": "v2", "drained_s": 4.2, "killed": []}
    swarm.ctl.list {}
    -> {"ok": true, "tasks": {"calculator": {"clients": [...], "generation": 0, "version": "..."}}}
    swarm.ctl.status {}  -> {"ok": true, "run_dir": ..., "uptime_s": ..., "processes": {...}, "restarts": {...},
                             "progress": {...}, "tasks": {...}}
    swarm.ctl.down {}    -> {"ok": true, "stopping": true}   (then `up` stops every service, as on Ctrl-C)
    errors -> {"ok": false, "error": "unknown task 'x'; tasks: ['calculator']"}

A restart drains the task's clients (SIGTERM: the runner starts no new group and ends those in
flight within `--drain-s`), kills them after `drain_s + grace_s`, retires them from the supervisor
(so their exit does not stop the run), then starts the next generation. `handle_request` and
`Restarter` are apart from NATS so tests reach them directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmrl.supervisor import Supervisor, terminate

if TYPE_CHECKING:
    from swarmrl.launch import AgentIds

log = logging.getLogger("swarmrl.up")

SERVICE_NAME = "swarmrl-control"
VERBS = ("list", "restart", "status", "down")
DRAIN_S = 30.0
"""The built-in runner's `--drain-s` default: how long clients may take to finish their groups."""
GRACE_S = 15.0
"""On top of the drain: time to publish the aborts and close before a client is killed."""
Reply = dict[str, Any]
Spawn = Callable[[str, int, str], list[str]]
"""(task, generation, version) -> names of the processes started."""


class ControlError(ValueError):
    """A request that cannot be served; the message is the reply's `error`."""


def _agents_dir() -> Path:
    spec = importlib.util.find_spec("swarmrl.agents")  # imports only `swarmrl`, not the SDK
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swarmrl.agents not found")
    return Path(next(iter(spec.submodule_search_locations)))


def client_code_files(agents_dir: Path | None = None) -> list[Path]:
    """The files a built-in client runs that change between iterations: runner, SDK, task modules."""
    root = agents_dir or _agents_dir()
    return [root / "runner.py", root / "sdk.py", *sorted((root / "tasks").glob("*.py"))]


def builtin_client_version(agents_dir: Path | None = None) -> str:
    """Default `client_version` of the built-in runner: `sha1-<12 hex>` over the paths and contents
    of `client_code_files()`, a missing one as empty (the SDK's own default hashes `sys.argv[0]`
    alone, the runner, so an edited task or SDK would not show)."""
    root = agents_dir or _agents_dir()
    h = hashlib.sha1()
    for f in sorted(client_code_files(root)):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        with contextlib.suppress(FileNotFoundError):
            h.update(f.read_bytes())
        h.update(b"\0")
    return "sha1-" + h.hexdigest()[:12]


def default_client_version(swarm: Any, task: str) -> str:
    """`client_version` `up` gives `task`'s clients: the code hash for the built-in runner, "" (the
    SDK's own default) for a task's own `command`."""
    return builtin_client_version() if swarm.tasks[task].command is None else ""


@dataclass
class TaskClients:
    names: list[str]
    generation: int = 0
    version: str = ""


@dataclass
class Restarter:
    """Replaces one task's client processes at a time, generation by generation."""

    sup: Supervisor
    spawn: Spawn
    clients: dict[str, TaskClients]
    default_version: Callable[[str], str] = lambda task: ""  # "": the client's own default
    on_change: Callable[[], None] = lambda: None
    on_retired: Callable[[list[str]], None] = lambda names: None  # `up` revokes their NATS identities
    drain_s: float = DRAIN_S
    grace_s: float = GRACE_S
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def tasks(self) -> list[str]:
        return sorted(self.clients)

    def check_task(self, task: str) -> TaskClients:
        if task not in self.clients:
            raise ControlError(f"unknown task {task!r}; tasks: {self.tasks()}")
        return self.clients[task]

    def status(self) -> Reply:
        return {
            "ok": True,
            "tasks": {
                t: {"clients": c.names, "generation": c.generation, "version": c.version}
                for t, c in sorted(self.clients.items())
            },
        }

    async def restart(self, task: str, version: str | None = None) -> Reply:
        if not self.check_task(task).names:
            raise ControlError(f"task {task!r} has no client processes to restart (clients = 0)")
        async with self._lock:  # one restart at a time: generations stay in order
            old = list(self.clients[task].names)
            t0 = time.monotonic()
            killed = await self.drain(old)
            drained_s = time.monotonic() - t0
            self.on_retired(old)
            new_version = version or self.default_version(task)
            generation = self.clients[task].generation + 1
            new = self.spawn(task, generation, new_version)
            self.clients[task] = TaskClients(new, generation, new_version)
            self.on_change()
        log.info(
            "restarted %s clients: %s -> %s (generation %d, version %r, drained in %.1fs, killed %s)",
            task, old, new, generation, new_version, drained_s, killed,
        )  # fmt: skip
        return {
            "ok": True, "task": task, "old": old, "new": new, "generation": generation,
            "version": new_version, "drained_s": round(drained_s, 2), "killed": killed,
        }  # fmt: skip

    async def drain(self, names: list[str]) -> list[str]:
        """Stop `names` (SIGKILL after drain + grace) in a thread, so the event loop keeps supervising
        the swarm meanwhile; returns the killed."""
        return await asyncio.to_thread(terminate, self.sup.retire(names), self.drain_s + self.grace_s)

    async def close(self, timeout: float = 15.0) -> None:
        """Stop retired clients still draining when the run ends (as `up` stops the current ones)."""
        draining = {n: p for n, p in self.sup.retired.items() if p.poll() is None}
        await asyncio.to_thread(terminate, draining, timeout)


@dataclass
class Plane:
    """What the control verbs act on: the client restarts, the run's status, and how to stop it."""

    restarter: Restarter
    status: Callable[[], Reply] = lambda: {}  # the run's, beside each task's clients
    down: Callable[[], None] = lambda: None  # asks `up` to stop, as Ctrl-C does


async def handle_request(verb: str, data: bytes, plane: Plane) -> Reply:
    """One request (`verb`, its JSON body) -> its reply; every failure is an `{"ok": false}` reply."""
    try:
        req = json.loads(data) if data.strip() else {}
        if not isinstance(req, dict):
            raise ControlError(f"a request is a JSON object, got {type(req).__name__}")
        restarter = plane.restarter
        if verb == "list":
            return restarter.status()
        if verb == "status":
            return {"ok": True, **plane.status(), "tasks": restarter.status()["tasks"]}
        if verb == "down":
            plane.down()
            return {"ok": True, "stopping": True}
        if verb == "restart":
            task, version = req.get("task"), req.get("version")
            if not isinstance(task, str) or not task:
                raise ControlError(f"restart needs a task name (tasks: {restarter.tasks()}), got {task!r}")
            if version is not None and not isinstance(version, str):
                raise ControlError(f"version must be a string, got {version!r}")
            return await restarter.restart(task, version or None)
        raise ControlError(f"unknown verb {verb!r}; verbs: {list(VERBS)}")
    except json.JSONDecodeError as exc:
        return {"ok": False, "error": f"request is not JSON ({exc}): {data[:200]!r}"}
    except ControlError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a failed restart must not take the swarm down; the caller hears why
        log.exception("control request %s failed: %r", verb, data[:200])
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


class ControlService:
    """`handle_request` served on `swarm.ctl.<verb>` with `nats.micro` (service `swarmrl-control`)."""

    def __init__(self, nats_url: str, plane: Plane, run_dir: Path) -> None:
        self.nats_url, self.plane, self.run_dir = nats_url, plane, run_dir
        self.nc: Any = None
        self.service: Any = None

    async def start(self) -> ControlService:
        from nats import micro

        from swarmrl.schemas import subjects as S
        from swarmrl.services.common import bus

        self.nc = await bus.connect(self.nats_url, "up-control")
        self.service = await micro.add_service(
            self.nc, name=SERVICE_NAME, version="1.0.0", description="control of a running swarmrl up",
            metadata={"run_dir": str(self.run_dir)},
        )  # fmt: skip
        for verb in VERBS:

            async def serve(req: Any, verb: str = verb) -> None:
                reply = await handle_request(verb, req.data, self.plane)
                await req.respond(json.dumps(reply).encode())

            await self.service.add_endpoint(name=verb, subject=S.control_subject(verb), handler=serve)
        return self

    async def close(self) -> None:
        """Stop serving, then the retired clients still draining."""
        if self.service is not None:
            with contextlib.suppress(Exception):
                await self.service.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
        self.service = self.nc = None
        await self.plane.restarter.close()


async def start_control(
    sup: Supervisor,
    swarm: Any,
    run_dir: Path,
    clients: dict[str, list[str]],
    ids: AgentIds,
    nats_url: str,
    status: Callable[[], Reply],
    down: Callable[[], None],
) -> ControlService:
    """The control plane of `up.supervise`: restarts of `swarm`'s clients (`clients`: task -> names;
    each generation gets new identities from `ids`), `status` and `down`. One that cannot start is
    logged and the run goes on without it (its `close` still stops the retired clients)."""
    from swarmrl.launch import spawn_clients

    default_version = functools.partial(default_client_version, swarm)
    restarter = Restarter(
        sup,
        lambda task, generation, version: spawn_clients(sup, swarm, task, ids, generation, version),
        {t: TaskClients(clients.get(t, []), 0, default_version(t)) for t in swarm.tasks},
        default_version=default_version,
        on_retired=ids.revoke,
    )
    service = ControlService(nats_url, Plane(restarter, status, down), run_dir)
    try:
        await asyncio.wait_for(service.start(), timeout=30)
    except Exception as exc:
        log.warning(
            "no control plane on NATS (%r): `swarmrl clients/status/down` will not reach this run", exc
        )
        await service.close()
    return service
