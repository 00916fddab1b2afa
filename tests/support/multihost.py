"""The multi-host recipe (`infra/multihost.md`) run as written on network-namespace hosts
(`tests/support/netns.py`).

Used by `tests/e2e/test_multihost.py` and `bench/partitions.py`:

    with Hosts(["a", "b", "c"], root) as hosts, Recipe(RECIPE, hosts) as swarm:
        swarm.start()            # every block up to the checks, in order; `run=` blocks keep running
        print(swarm.check())     # the output of the `check` blocks
    # leaving: the `stop` order, SIGTERM each and wait; then every host's namespace is emptied

The recipe's code blocks carry their host and kind in the info string: ```` ```sh host=A ```` runs to
completion on host A (`all`: on each host), ```` ```sh host=A run=trainer ```` starts a process that
keeps running (named `A:trainer`), ```` ```sh host=A check ```` only on `check()`, ```` ```text copy ````
copies files between hosts' directories (`A:secrets.env -> B:secrets.env C:secrets.env`) and
```` ```text stop ```` gives the order `stop()` follows. Each block runs as `bash -euo pipefail -c TEXT`
in its host's namespace with `A_ADDR`, `B_ADDR`, `C_ADDR` and `HOST_DIR` set and the other hosts'
directories hidden, so a step that reads another host's files fails here as it would on real hosts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import Hosts

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "infra" / "multihost.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
HOSTS = ("A", "B", "C")


@dataclass
class Block:
    host: str
    """`A`, `B`, `C`, or `all` (sh blocks); "" for copy and stop blocks."""
    kind: str
    """`sh` (runs to completion), `run` (keeps running), `check`, `copy` or `stop`."""
    text: str
    name: str = ""
    line: int = 0


def parse(path: Path) -> list[Block]:
    """The recipe's blocks in order (fenced blocks without `host=`, `copy` or `stop` are prose)."""
    source = path.read_text()
    out = []
    for m in FENCE.finditer(source):
        lang, info, text = m.group(1), m.group(2).split(), m.group(3)
        line = source.count("\n", 0, m.start()) + 1
        attrs = dict(a.split("=", 1) for a in info if "=" in a)
        if lang == "text" and info[:1] in (["copy"], ["stop"]):
            out.append(Block("", info[0], text, line=line))
        elif lang == "sh" and "host" in attrs:
            kind = "run" if "run" in attrs else "check" if "check" in info else "sh"
            out.append(Block(attrs["host"], kind, text, attrs.get("run", ""), line))
    return out


@dataclass
class Recipe:
    """The recipe on `hosts` (named a, b, c for the recipe's A, B, C)."""

    path: Path
    hosts: Hosts
    env: dict[str, str] = field(default_factory=dict)
    """More environment for every command (over this process's, less its SWARMRL_* variables)."""
    timeout_s: float = 600.0
    """Longest a block that runs to completion may take."""
    blocks: list[Block] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.blocks = parse(self.path)
        self.logs = self.hosts.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Recipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def host(self, label: str) -> str:
        return label.lower()

    def dir(self, label: str) -> Path:
        return self.hosts.hosts[self.host(label)].dir

    def environ(self, label: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SWARMRL_", "SWARM_"))}
        env |= {f"{h}_ADDR": self.hosts.hosts[self.host(h)].addr for h in HOSTS}
        env |= {"HOST_DIR": str(self.dir(label)), "PYTHONUNBUFFERED": "1"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env | self.env

    def start(self) -> None:
        """Every block but the checks and the stop order, in the recipe's order."""
        for block in self.blocks:
            if block.kind in ("check", "stop"):
                continue
            if block.kind == "copy":
                self._copy(block)
            for label in HOSTS if block.host == "all" else [block.host] if block.host else []:
                if block.kind == "run":
                    self._spawn(label, block)
                else:
                    self.sh(label, block.text, block.line)

    def sh(self, label: str, text: str, line: int = 0) -> str:
        """Run `text` on host `label` to completion; its output, or RuntimeError with it."""
        argv = self.hosts.argv(self.host(label), ["bash", "-euo", "pipefail", "-c", text])
        done = subprocess.run(
            argv, env=self.environ(label), cwd=self.dir(label), capture_output=True, text=True,
            timeout=self.timeout_s,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.path.name}:{line} on host {label} exited {done.returncode}:\n{text}\n"
                f"--- output:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return done.stdout

    def check(self) -> list[str]:
        """The output of every `check` block."""
        return [self.sh(b.host, b.text, b.line) for b in self.blocks if b.kind == "check"]

    def _spawn(self, label: str, block: Block) -> None:
        name = f"{label}:{block.name}"
        log = self.log(name)
        self.procs[name] = self.hosts.popen(
            self.host(label), ["bash", "-euo", "pipefail", "-c", block.text], env=self.environ(label), log=log
        )
        self.started[name] = time.time()

    def log(self, name: str) -> Path:
        return self.logs / f"{name.replace(':', '-')}.log"

    def _copy(self, block: Block) -> None:
        for line in block.text.strip().splitlines():
            src, _, dests = line.partition("->")
            s_host, _, s_path = src.strip().partition(":")
            for dest in dests.split():
                d_host, _, d_path = dest.partition(":")
                target = self.dir(d_host) / d_path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.dir(s_host) / s_path, target)

    def dead(self) -> dict[str, int]:
        """Processes that exited on their own (name -> exit code)."""
        return {
            n: p.returncode
            for n, p in self.procs.items()
            if p.poll() is not None and n not in self.exit_codes
        }

    def stop(self, grace_s: float = 60.0, keep: tuple[str, ...] = ()) -> dict[str, int]:
        """SIGTERM every process in the recipe's stop order (then any other) but those named in `keep`
        (e.g. the NATS nodes, to read the streams before they go), each waited for up to `grace_s`
        (then SIGKILL); returns name -> exit code (-9: killed)."""
        order = [n for b in self.blocks if b.kind == "stop" for n in b.text.split()]
        for name in [*order, *(n for n in self.procs if n not in order)]:
            proc = self.procs.get(name)
            if proc is None or name in self.exit_codes or name in keep:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    self.exit_codes[name] = -9
                    continue
            self.exit_codes[name] = proc.returncode
        return dict(self.exit_codes)

    def tail(self, name: str, n: int = 40) -> str:
        path = self.log(name)
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"


def listeners(hosts: Hosts, name: str) -> list[str]:
    """The TCP addresses host `name`'s processes listen on (`ss -ltn` in its namespace)."""
    out = subprocess.run(
        ["ip", "netns", "exec", hosts.hosts[name].netns, "ss", "-ltnH"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(line.split()[3] for line in out.splitlines() if line.strip())


def secrets_env(path: Path) -> dict[str, str]:
    """The VAR=value lines of a `secrets.env` (`swarmrl nats --new-secrets`)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def operator_url(hosts: Hosts, secrets: dict[str, str]) -> str:
    """The operator's URL on every node, for watching from this (the root) namespace."""
    pw = secrets["SWARM_SERVICE_PASSWORD"]
    return ",".join(f"nats://service:{pw}@{h.addr}:4222" for h in hosts.hosts.values())
