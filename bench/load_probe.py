"""What `bench/load.py` watches while it ramps: `Probe` samples the processes and the broker, `Records`
reads what the load processes append (calls, episodes, open-episode gauges)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from benchutil import proc_cpu_s

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Probe:
    """Samples CPU per process, the machine's CPU, engine stats, JetStream consumers and NATS /varz."""

    def __init__(self, js: Any, http: Any, pids: dict[str, int], engines: dict[str, str], varz: str) -> None:
        self.js, self.http, self.engines, self.varz = js, http, engines, varz
        self.procs = pids
        self.samples: list[dict[str, Any]] = []

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process (from /proc: Linux, as swarmrl), and the machine's busy ones."""
        out = {}
        for name, pid in self.procs.items():
            with contextlib.suppress(OSError, ValueError, IndexError):  # exited
                out[name] = proc_cpu_s(pid)
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        out["@machine_busy"] = (sum(cpu[:8]) - cpu[3] - cpu[4]) / CLK_TCK  # all but idle and iowait
        return out

    def memory(self) -> dict[str, float]:
        """Resident memory (VmRSS) of each process now, in MiB."""
        out = {}
        for name, pid in self.procs.items():
            with contextlib.suppress(OSError, ValueError, StopIteration):
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                out[name] = round(
                    int(next(ln for ln in status if ln.startswith("VmRSS:")).split()[1]) / 1024, 1
                )
        return out

    async def connections(self) -> int:
        """Client connections nats-server holds now (`/varz`)."""
        try:
            return int((await self.http.get(self.varz, timeout=5)).json().get("connections", 0))
        except Exception:
            return -1

    def sockets(self, names: list[str]) -> dict[str, int]:
        """Open sockets of each of `names` at the end of a stage: a load process's are NATS plus its HTTP
        pool to the gateways, a gateway's the agents' connections plus its pool to the engines."""
        out = {}
        for name in names:
            with contextlib.suppress(OSError):
                fds = Path(f"/proc/{self.procs[name]}/fd").iterdir()
                out[name] = sum(os.readlink(fd).startswith("socket:") for fd in fds)
        return out

    async def consumers(self) -> dict[str, dict[str, int | str]]:
        from nats.js.errors import NotFoundError

        from swarmrl.schemas import subjects as S

        out: dict[str, dict[str, int | str]] = {}
        streams = [S.EPISODE_PARTS_STREAM, S.LEDGER_PARTS_STREAM, *S.STREAM_SUBJECTS]
        for stream in streams:
            with contextlib.suppress(NotFoundError):
                for c in await self.js.consumers_info(stream):
                    out[f"{stream}/{c.name}"] = {
                        "delivered": c.delivered.consumer_seq if c.delivered else 0,
                        "pending": int(c.num_pending or 0), "ack_pending": int(c.num_ack_pending or 0),
                    }  # fmt: skip
        kv = await self.js.key_value(S.LEASES_BUCKET)
        with contextlib.suppress(Exception):  # which ledger replica holds the non-partitioned streams
            out["@ledger_lease16"] = {
                "holder": (await kv.get(f"ledger.lease.{S.EPISODE_PARTITIONS}")).value.decode()
            }
        return out

    async def sample(self) -> None:
        s: dict[str, Any] = {
            "t": time.time(),
            "cpu": self.cpu(),
            "memory": self.memory(),
            "engines": {},
            "varz": {},
        }
        for name, url in self.engines.items():
            with contextlib.suppress(Exception):
                s["engines"][name] = (await self.http.get(f"{url}/engine_stats", timeout=5)).json()
        with contextlib.suppress(Exception):
            v = (await self.http.get(self.varz, timeout=5)).json()
            s["varz"] = {
                k: v.get(k) for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes", "cpu", "connections")
            }
        with contextlib.suppress(Exception):
            s["consumers"] = await self.consumers()
        self.samples.append(s)

    def at(self, t: float) -> dict[str, Any]:
        return min(self.samples, key=lambda s: abs(s["t"] - t))

    def between(self, a: float, b: float) -> list[dict[str, Any]]:
        return [s for s in self.samples if a <= s["t"] <= b]


class Records:
    """The load processes' JSON-lines files, read as they grow."""

    def __init__(self, paths: list[Path]) -> None:
        self.offsets = dict.fromkeys(paths, 0)
        self.calls: list[list[Any]] = []
        self.episodes: list[list[Any]] = []
        self.finals: list[dict[str, int]] = []
        self.gauges: dict[Path, list[tuple[float, int]]] = {p: [] for p in paths}
        """Per load process: (time, agents with an episode open) every second."""
        self.ready = 0

    def read(self) -> None:
        for path, off in self.offsets.items():
            if not path.exists():
                continue
            with path.open() as f:
                f.seek(off)
                data = f.read()
            end = data.rfind("\n") + 1  # only whole lines
            self.offsets[path] = off + len(data[:end].encode())
            for line in data[:end].splitlines():
                rec = json.loads(line)
                {"c": self.calls, "e": self.episodes}.get(rec[0], []).append(rec)
                if rec[0] == "o":
                    self.gauges[path].append((rec[1], rec[2]))
                if rec[0] == "final":
                    self.finals.append(rec[1])
                self.ready += rec[0] == "ready"
