"""Hosts on one machine: network namespaces with their own addresses on one bridge, and the network
faults `bench/partitions.py` injects between them (cuts and packet loss with nftables, latency with
the delaying TCP relay of `tests/support/delay_relay.py`). Linux, as root (`ip netns`, `nft`).

    with Hosts(["a", "b", "c"], tmp / "hosts", shaped=[("b", "c")]) as hosts:
        proc = hosts.popen("a", ["swarmrl", "nats", ...])   # in host a's namespace, a's directory only
        hosts.cut("c")              # c reaches neither a nor b, nor they c, until heal("c")
        hosts.loss("b", "c", 5)     # 5% of the packets between b and c dropped, each way
        hosts.delay("b", "c", 100, 50)   # a shaped pair: every byte held 100 +- 50 ms, each way

Layout: a bridge `swb<id>` in the root namespace holds the operator's address, `.254` of a free /24,
from which tests watch the hosts and which no fault touches. Each host is the namespace
`swarmrl-<id>-<name>` with `eth0` (a veth into the bridge) at `.1`, `.2`, ... and its own loopback,
so every host can bind the same ports. A command run on a host (`argv`) sees the other hosts'
directories (`<root>/<name>`) as empty tmpfs mounts: whatever crosses between hosts crosses the network.

Faults live in each host's nftables table `inet swarmrl`: the set `cut` (addresses dropped both
ways) and the chain `loss` (`numgen random mod 100 < P drop` per lossy peer, on input from `eth0`, so
each direction loses P% once, not again on a relayed connection's loopback leg). A shaped pair's TCP
connections go through a relay on the dialing host from the start (nat `redirect`; the relay's own
connection carries mark `RELAY_MARK` and is left alone), which holds each chunk for its peer's delay
(none until `delay`), so no connection is cut over mid-run. This kernel has no `netem` qdisc; where
one exists, `tc qdisc add dev eth0 root netem delay ...` in a host does the same for all traffic.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmrl.core.rundir import write_private
from tests.support.delay_relay import RELAY_MARK, applied_path

RELAY_PORT = 15999
"""Port of a shaped host's relay, on that host's own loopback."""
TABLE = "swarmrl"


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip netns`, no `nft`): the reason says which."""


def unavailable(need_nft: bool = False) -> str:
    """Why `Hosts` cannot run on this machine ("" if it can): for tests to skip with."""
    if sys.platform != "linux":
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add` as uid 0)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"swarmrl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if need_nft and shutil.which("nft") is None:
        return "no `nft` command (apt-get install nftables; infra/system-packages.txt)"
    return ""


@dataclass
class Host:
    name: str
    netns: str
    addr: str
    dir: Path


@dataclass
class Hosts:
    """Hosts `names` under `root`, each a network namespace with an address of its own (see the
    module docstring); `shaped` pairs get relays, for `delay`. `start()` / `stop()`, or a `with`."""

    names: Sequence[str]
    root: Path
    shaped: Sequence[tuple[str, str]] = ()
    hosts: dict[str, Host] = field(default_factory=dict)
    operator_addr: str = ""
    """This namespace's address on the bridge: where a test or benchmark reaches the hosts from."""
    _id: str = ""
    _bridge: str = ""
    _relays: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _delays: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    _loss: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if len(self.names) > 250 or len(set(self.names)) != len(self.names):
            raise ValueError(f"host names must be distinct and fewer than 251: {list(self.names)}")
        unknown = {h for pair in self.shaped for h in pair} - set(self.names)
        if unknown:
            raise ValueError(f"shaped pairs name hosts {sorted(unknown)} not in {list(self.names)}")

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- setup -------------------------------------------------------------------------------------

    def start(self) -> Hosts:
        if reason := unavailable(need_nft=True):
            raise HostsUnavailable(reason)
        self._id = secrets.token_hex(2)
        self._bridge = f"swb{self._id}"
        net = free_subnet()
        prefix = str(net.network_address).rsplit(".", 1)[0]
        self.operator_addr = f"{prefix}.254"
        try:
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("addr", "add", f"{self.operator_addr}/24", "dev", self._bridge)
            _ip("link", "set", self._bridge, "up")
            for i, name in enumerate(self.names, start=1):
                host = Host(name, f"swarmrl-{self._id}-{name}", f"{prefix}.{i}", self.root / name)
                host.dir.mkdir(parents=True, exist_ok=True)
                veth = f"swv{self._id}{i}"
                _ip("netns", "add", host.netns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
                _ip("link", "set", veth, "master", self._bridge, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
                self.hosts[name] = host
            for name in self.hosts:
                self._nft(name, self._base_rules(name))
            for name in {h for pair in self.shaped for h in pair}:
                self._start_relay(name)
        except BaseException:
            self.stop()
            raise
        return self

    def _base_rules(self, name: str) -> str:
        rules = f"""
        table inet {TABLE} {{
          set cut {{ type ipv4_addr; }}
          chain loss {{ }}
          chain input {{ type filter hook input priority 0; policy accept; ip saddr @cut drop; jump loss; }}
          chain output {{ type filter hook output priority 0; policy accept; ip daddr @cut drop; }}
        }}
        """
        shaped = [self.hosts[b if a == name else a] for a, b in self.shaped if name in (a, b)]
        if shaped:  # only new connections pass a nat chain: every one to a shaped peer, from the start
            peers = ", ".join(h.addr for h in shaped)
            rules += f"""
            table ip {TABLE}_nat {{
              chain output {{
                type nat hook output priority -100; policy accept;
                meta mark {RELAY_MARK} return
                ip daddr {{ {peers} }} meta l4proto tcp redirect to :{RELAY_PORT}
              }}
            }}
            """
        return rules

    def _relay_config(self, name: str) -> Path:
        return self.hosts[name].dir.parent / f".relay-{name}.json"  # outside every host's directory

    def _write_delays(self, name: str) -> Path:
        return write_private(self._relay_config(name), json.dumps(self._delays.get(name, {})))

    def _start_relay(self, name: str) -> None:
        config = self._write_delays(name)
        with open(self.root / f"relay-{name}.log", "ab") as log:  # the child keeps its copy
            # run as a script: it imports only the standard library, so needs no import path there
            relay = Path(__file__).with_name("delay_relay.py")
            cmd = [sys.executable, str(relay), "--port", str(RELAY_PORT), "--config", str(config)]
            proc = subprocess.Popen(self.argv(name, cmd, hide=False), stdout=log, stderr=log)
        self._relays[name] = proc
        deadline = time.monotonic() + 30
        while b"listening" not in (self.root / f"relay-{name}.log").read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"relay of host {name} did not start; see {self.root}/relay-{name}.log")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill every process left in the hosts' namespaces (all started here), then delete them and
        the bridge. Safe to call twice."""
        for host in self.hosts.values():
            for pid in self.pids(host.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self._relays.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        if self._bridge:
            subprocess.run(["ip", "link", "del", self._bridge], capture_output=True)
        self.hosts.clear()
        self._bridge = ""

    # -- running things on a host -----------------------------------------------------------------

    def argv(self, name: str, argv: Sequence[str], hide: bool = True) -> list[str]:
        """`argv` run in host `name`'s namespace; `hide`: with the other hosts' directories covered by
        empty tmpfs mounts (only in this command's mount namespace)."""
        host = self.hosts[name]
        if not hide:
            return ["ip", "netns", "exec", host.netns, *argv]
        mounts = " && ".join(
            f"mount -t tmpfs -o size=64k,mode=0 swarmrl-hidden {shlex.quote(str(h.dir))}"
            for n, h in self.hosts.items()
            if n != name
        )
        return ["ip", "netns", "exec", host.netns, "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]

    def popen(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` on host `name` (its own session, so it and its children share one process
        group); output to `log` (default: discarded)."""
        with open(log, "ab") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
            return subprocess.Popen(
                self.argv(name, argv), env=dict(env or os.environ), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, cwd=self.hosts[name].dir, **kwargs,
            )  # fmt: skip

    def pids(self, name: str) -> list[int]:
        """Every process in host `name`'s network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    # -- faults -------------------------------------------------------------------------------------

    def cut(self, name: str, peers: Sequence[str] | None = None) -> None:
        """Drop every packet between host `name` and `peers` (default: every other host), both ways;
        the operator's address keeps its access."""
        others = [n for n in self.hosts if n != name] if peers is None else peers
        addrs = [self.hosts[p].addr for p in others]
        self._nft(name, f"add element inet {TABLE} cut {{ {', '.join(addrs)} }}")

    def heal(self, name: str | None = None) -> None:
        """Undo `cut` on host `name` (default: on every host)."""
        for n in [name] if name else list(self.hosts):
            self._nft(n, f"flush set inet {TABLE} cut")

    def loss(self, a: str, b: str, percent: float) -> None:
        """Drop `percent`% (an integer percentage, 0 to end it) of the packets between hosts `a` and `b`,
        each direction on its receiving host."""
        if not 0 <= percent <= 100 or percent != int(percent):
            raise ValueError(f"loss percent must be an integer 0-100, got {percent}")
        for x, y in ((a, b), (b, a)):
            self._loss[(x, y)] = percent
            rules = [f"flush chain inet {TABLE} loss"]
            for (host, peer), p in self._loss.items():
                if host == x and p > 0:  # numgen's values are 0-99: a loss of 100% is a plain drop
                    odds = f"numgen random mod 100 < {int(p)} " if p < 100 else ""
                    rules.append(
                        f"add rule inet {TABLE} loss iifname eth0 ip saddr {self.hosts[peer].addr} {odds}drop"
                    )
            self._nft(x, "\n".join(rules))

    def delay(self, a: str, b: str, ms: float, jitter_ms: float = 0.0) -> None:
        """Hold every byte between shaped hosts `a` and `b` for `ms` +- `jitter_ms` (uniform, order kept),
        each way; 0 ends it."""
        if (a, b) not in self.shaped and (b, a) not in self.shaped:
            raise ValueError(
                f"hosts {a} and {b} are not a shaped pair ({list(self.shaped)}): no relay between them"
            )
        for x, y in ((a, b), (b, a)):
            self._delays.setdefault(x, {})[self.hosts[y].addr] = [float(ms), float(jitter_ms)]
            self._write_delays(x)
        for x in (a, b):  # applied when this returns
            config = self._relay_config(x)
            want, deadline = str(config.stat().st_mtime_ns), time.monotonic() + 10
            while not (applied_path(config).exists() and applied_path(config).read_text() == want):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the relay of host {x} did not apply {config} within 10 s")
                time.sleep(0.02)

    def _nft(self, name: str, script: str) -> None:
        _run(["ip", "netns", "exec", self.hosts[name].netns, "nft", "-f", "-"], stdin=script)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.200.0.0/13 that no address or route of this namespace overlaps, picked at random."""
    routes = _run(["ip", "-4", "route", "show", "table", "all"]).splitlines()
    firsts = [line.split()[0] for line in routes if line.strip()]
    taken = [ipaddress.ip_network(first, strict=False) for first in firsts if first[0].isdigit()]
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{200 + secrets.randbelow(8)}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.version == 4 and t.prefixlen > 0):
            return net
    raise HostsUnavailable("no free /24 in 10.200.0.0/13 for the hosts' bridge")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(cmd: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()} {stdin or ''}")
    return done.stdout
