"""The fault injector of `bench/chaos.py`: SIGKILLs clients, services and a NATS node of a running swarm.

- Clients: every second, with probability 1/`client_every_s`, while the clients' touched fraction
  (training episodes open at their client's kill / training episodes begun, followed live on
  `swarm.ep.*.*.{begin,end,abort}`) is under `touch_target`, one client is killed, picked at random
  weighted by its open episodes among those busy enough (at least `busy_frac` of the most it had
  open in the last minute) and within the kill budget: `up`'s supervisor gives a child that exits 5 times in 120 s
  up as a crash loop (`RestartPolicy`), so a client is killed at most `kills_per_window` (3) times
  in any 120 s, its exits of other causes counted (`restarts.jsonl`), and not before it has run
  `min_alive_s` (a restarted client begins all its groups at once: killing it right away again
  would touch many episodes that barely started).
- Services and nodes: a schedule drawn at start (seeded), `service_kills` kills of each of merger,
  trainer, ledger, gateway and engine and `node_kills` node faults (SIGKILL, `node_down_s` down,
  restarted on its store), at uniform random times in the fault window, at least `min_gap_s` apart
  (a node fault keeps the others away for its down time too). A target that is being restarted is
  waited for (60 s at most).

Processes are found by name in `<run>/pids.json`, re-read before every kill. Every fault is recorded
with its wall time; a node fault also with the time its node was current again (every stream's
replica on it current, `/healthz` ok).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import benchutil  # noqa: F401  # puts the repository on the path, for tests.support
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from swarmrl.launch import client_name
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.kv_watch import live_keys
from swarmrl.supervisor import RESTARTS_FILE, RestartPolicy
from tests.support.nats_cluster import NatsCluster

SERVICES = ("merger", "trainer", "ledger", "gateway", "engine")
BUSY_WINDOW_S = 60.0
"""A client is busy with at least `busy_frac` of the most episodes it had open in this many seconds."""


@dataclass
class FaultConfig:
    client_every_s: float = 4.0
    touch_target: float = 0.4
    busy_frac: float = 0.75
    kills_per_window: int = 3
    min_alive_s: float = 15.0
    service_kills: int = 2
    node_kills: int = 1
    node_down_s: float = 20.0
    min_gap_s: float = 40.0
    seed: int = 0


def read_pids(run_dir: Path) -> dict[str, int]:
    try:
        return dict(json.loads((run_dir / "pids.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being rewritten
        return {}


def read_journal(run_dir: Path) -> list[dict[str, Any]]:
    """`restarts.jsonl`: the supervisor's exits and restarts."""
    path = run_dir / "logs" / RESTARTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed child stays one until `up` reaps it)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def plan(cfg: FaultConfig, rng: random.Random, window: float) -> list[tuple[float, str]]:
    """(seconds into the window, kind) of every service and node fault, sorted."""
    kinds = [k for k in SERVICES for _ in range(cfg.service_kills)] + ["nats-node"] * cfg.node_kills
    rng.shuffle(kinds)
    length = [cfg.node_down_s if k == "nats-node" else 0.0 for k in kinds]
    # Uniform over the valid schedules: n sorted points in the slack, then each pushed back by the
    # lengths and gaps of the faults before it.
    slack = window - sum(length) - cfg.min_gap_s * max(len(kinds) - 1, 0)
    if slack < 0:
        raise ValueError(
            f"cannot fit {len(kinds)} faults {cfg.min_gap_s:g} s apart (node faults {cfg.node_down_s:g} s "
            f"long) into a fault window of {window:.0f} s: give more --minutes or fewer kills"
        )
    points = sorted(rng.uniform(0, slack) for _ in kinds)
    out, pushed = [], 0.0
    for point, kind, dur in zip(points, kinds, length, strict=True):
        out.append((point + pushed, kind))
        pushed += dur + cfg.min_gap_s
    return out


@dataclass
class Injector:
    cfg: FaultConfig
    run_dir: Path
    cluster: NatsCluster
    faults: list[dict[str, Any]] = field(default_factory=list)
    open: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Client name (episode owner) -> its open training episodes, as seen live."""
    recent: dict[str, deque[tuple[float, int]]] = field(default_factory=lambda: defaultdict(deque))
    """Client name -> (time, open episodes) of the last `BUSY_WINDOW_S`, sampled every second."""
    begun: int = 0
    touched: int = 0
    first_step: asyncio.Event = field(default_factory=asyncio.Event)
    t0: float = field(default_factory=time.time)
    _nc: NATS | None = None
    _kills: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    _owners: set[str] = field(default_factory=set)
    _owners_read: float = 0.0
    _born: dict[int, float] = field(default_factory=dict)  # pid -> when we first saw it in pids.json

    def __post_init__(self) -> None:
        self.rng = random.Random(self.cfg.seed)

    def _record(self, kind: str, target: str, **extra: Any) -> dict[str, Any]:
        now = time.time()
        fault = {"kind": kind, "target": target, "ts": now, "t": round(now - self.t0, 2), **extra}
        self.faults.append(fault)
        print(f"chaos: [{fault['t']:.0f}s] kill {kind} {target} {extra or ''}", flush=True)
        return fault

    # -- watching the swarm ---------------------------------------------------------------------

    async def watch(self) -> None:
        self._nc = nc = await bus.connect(self.cluster.service_url, "chaos-injector")
        for kind in ("begin", "end", "abort"):
            await nc.subscribe(S.episode_filter("*", kind), cb=self._on_event)
        await nc.subscribe(f"{S.METRICS_PREFIX}.>", cb=self._on_metric)

    async def _on_metric(self, msg: Msg) -> None:
        if msg.subject.split(".")[2] == "train":  # swarm.metrics.train.<model>: a trainer step
            self.first_step.set()

    def _is_client(self, owner: str) -> bool:
        """`owner` is one of up's client processes (not the evaluator, not an outside agent)."""
        if owner not in self._owners and time.monotonic() - self._owners_read > 1.0:
            self._owners_read = time.monotonic()
            self._owners = {client_name(n) for n in read_pids(self.run_dir) if n.startswith("client-")}
        return owner in self._owners

    async def _on_event(self, msg: Msg) -> None:
        _, _, owner, episode_id, kind = msg.subject.split(".")
        if not self._is_client(owner):
            return
        if kind == "begin":
            self.begun += 1
            self.open[owner].add(episode_id)
        else:
            self.open[owner].discard(episode_id)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    # -- faults ---------------------------------------------------------------------------------

    async def clients(self, until: float) -> None:
        """Kill clients at random until `until` (wall time), keeping the touched fraction near the target."""
        window_s = RestartPolicy().window_s
        while time.time() < until:
            await asyncio.sleep(1.0)
            now = time.time()
            for owner, eps in list(self.open.items()):
                self.recent[owner].append((now, len(eps)))
                while self.recent[owner][0][0] < now - BUSY_WINDOW_S:
                    self.recent[owner].popleft()
            if self.rng.random() > 1.0 / self.cfg.client_every_s:
                continue
            if self.begun and self.touched / self.begun >= self.cfg.touch_target:
                continue
            exits = defaultdict(list)
            for r in read_journal(self.run_dir):
                if r.get("event") == "exit":
                    exits[r["name"]].append(r["ts"])
            pids = read_pids(self.run_dir)
            for pid in pids.values():
                self._born.setdefault(pid, now)
            candidates, weights = [], []
            for name, pid in pids.items():
                owner = client_name(name)
                # our kills the supervisor has not journaled yet count too
                unseen = [t for t in self._kills[name] if t > max(exits[name], default=0.0)]
                recent = [t for t in exits[name] + unseen if now - t < window_s]
                busy = len(self.open[owner])
                most = max((n for _, n in self.recent[owner]), default=0)
                if (
                    name.startswith("client-")
                    and running(pid)
                    and now - self._born[pid] >= self.cfg.min_alive_s
                    and len(recent) < self.cfg.kills_per_window
                    and busy >= max(1, self.cfg.busy_frac * most)
                ):
                    candidates.append(name)
                    weights.append(busy)
            if not candidates:
                continue
            name = self.rng.choices(candidates, weights)[0]
            owner = client_name(name)
            open_now = len(self.open[owner])
            os.kill(pids[name], signal.SIGKILL)
            self._kills[name].append(time.time())
            self.touched += open_now
            self.open[owner] = set()
            self._record("client", name, pid=pids[name], open_episodes=open_now)

    async def scheduled(self, start: float, schedule: list[tuple[float, str]]) -> None:
        """The service and node faults of `schedule` (`plan`: seconds after `start`, a wall time)."""
        for offset, kind in schedule:
            await asyncio.sleep(max(0.0, start + offset - time.time()))
            if kind == "nats-node":
                await self.node_fault()
            else:
                await self.service_fault(kind)

    async def service_fault(self, kind: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = read_pids(self.run_dir)
            names = sorted(n for n in pids if n == kind or n.startswith(f"{kind}-"))
            live = [n for n in names if running(pids[n])]
            if kind == "trainer" and len(live) > 1:  # a lead and its standbys: the lead, which trains
                live = [n for n in live if n in await self._trainer_leads()] or live
            if live:
                name = self.rng.choice(live)
                os.kill(pids[name], signal.SIGKILL)
                self._record(kind, name, pid=pids[name])
                return
            await asyncio.sleep(0.5)
        print(f"chaos: no running {kind} to kill in 60 s; skipped", flush=True)

    async def _trainer_leads(self) -> set[str]:
        """The trainer processes holding a model's lead lease (services/trainer/lead.py)."""
        assert self._nc is not None
        try:
            kv = await self._nc.jetstream().key_value(S.LEASES_BUCKET)
            keys = await live_keys(self._nc.jetstream(), kv, "trainer.lead.>")
            return {(await kv.get(k)).value.decode() for k in keys}
        except Exception as exc:  # a broker away: any trainer, as without standbys
            print(f"chaos: trainer leads unknown ({exc!r})", flush=True)
            return set()

    async def node_fault(self) -> None:
        i = self.rng.randrange(len(self.cluster.nodes))
        name = self.cluster.names()[i]
        await asyncio.to_thread(self.cluster.kill, i)
        fault = self._record("nats-node", name, down_s=self.cfg.node_down_s)
        await asyncio.sleep(self.cfg.node_down_s)
        await asyncio.to_thread(self.cluster.restart, i)
        fault["restarted_after_s"] = round(time.time() - fault["ts"], 2)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self.cluster.healthy, i) and await self._current(name):
                fault["recovered_after_s"] = round(time.time() - fault["ts"], 2)
                # held down on purpose: its recovery counts from its restart
                fault["caught_up_s"] = round(fault["recovered_after_s"] - fault["restarted_after_s"], 2)
                print(f"chaos: {name} current again after {fault['caught_up_s']}s", flush=True)
                return
            await asyncio.sleep(0.25)
        fault["recovered_after_s"] = None
        print(f"chaos: {name} not current 180 s after its restart", flush=True)

    async def _current(self, node: str) -> bool:
        """Every stream has a replica on `node` that is current (or `node` leads it)."""
        assert self._nc is not None
        js = self._nc.jetstream()
        for stream in S.STREAM_SUBJECTS:
            with contextlib.suppress(Exception):
                info = (await js.stream_info(stream)).cluster
                if info is not None and (
                    info.leader == node or any(r.name == node and r.current for r in info.replicas or [])
                ):
                    continue
            return False
        return True
