"""A local 3-node JetStream cluster on one machine, for trials and chaos runs (`bench/chaos.py`).

Three `NatsServer`s from `cluster-node{1,2,3}.conf`, each on random client, route and monitoring
ports (the command line overrides the config file's) with its own store dir, and one shared conf dir:
the agent registry there reaches every node (each writes `<config name>.pid` into it, so a mint or a
revocation reloads all three). Every user's password is the same on every node. Any node can
be SIGKILLed and started again on its own store and ports; streams created with 3 replicas
(`SWARMRL_STREAM_REPLICAS=3`) lose nothing while two nodes are up.

    with NatsCluster(tmp / "nats") as cluster:
        env = {"SWARMRL_NATS": cluster.service_url, "SWARMRL_STREAM_REPLICAS": "3"}
        ...  # swarmrl up --nats-conf cluster.conf_dir
        cluster.kill(1)
        cluster.restart(1)
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmrl.infra.nats_server import NatsServer, free_ports, new_passwords

SIZE = 3
"""Nodes; one config per node (`cluster-node<i>.conf`) ships in infra/nats."""


@dataclass
class NatsCluster:
    """Three JetStream nodes forming the cluster `swarmrl`; node indexes are 0, 1, 2."""

    root: Path
    nodes: list[NatsServer] = field(default_factory=list)
    monitor_ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        passwords = new_passwords()
        # every node's client, route and monitor ports at once: picked one by one, two could be the same
        ports = free_ports(3 * SIZE)
        client_ports, route_ports, self.monitor_ports = (ports[k * SIZE : (k + 1) * SIZE] for k in range(3))
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        for i in range(SIZE):
            name = f"node{i + 1}"
            flags = ["--cluster", f"nats://127.0.0.1:{route_ports[i]}", "--routes", routes]
            self.nodes.append(
                NatsServer(
                    store_dir=self.root / name,
                    port=client_ports[i],
                    config=f"cluster-{name}.conf",
                    log_file=self.root / f"{name}.log",
                    passwords=dict(passwords),
                    shared_conf_dir=self.conf_dir,
                    extra_args=[*flags, "-m", str(self.monitor_ports[i])],
                )
            )

    @property
    def conf_dir(self) -> Path:
        return self.root / "conf"

    def url(self, role: str = "service") -> str:
        """Every node's URL for `role` (comma-separated), for clients that fail over between them."""
        return ",".join(node.url(role) for node in self.nodes)

    @property
    def service_url(self) -> str:
        return self.url("service")

    @property
    def plain_url(self) -> str:
        return ",".join(node.plain_url for node in self.nodes)

    @property
    def password_env(self) -> dict[str, str]:
        """Every user's password variable, as the nodes read them (and `up --nats` for role URLs)."""
        return self.nodes[0].password_env

    def names(self) -> list[str]:
        """Server names (`swarmrl-node1`, ...): what stream info lists as replicas."""
        return [f"swarmrl-node{i + 1}" for i in range(SIZE)]

    def start(self, timeout: float = 60.0) -> NatsCluster:
        try:
            first = self.nodes[0].start()
            for node in self.nodes[1:]:
                node.first_agent = first.first_agent  # one registry: mint the test identity once
                node.start()
            self.wait_ready(timeout)
        except BaseException:  # a node that did not start must not leave the others running
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, i: int) -> None:
        """SIGKILL node `i` (its store stays), and forget its pid file: a reload must not signal a
        process that might reuse the pid."""
        self.nodes[i].stop(kill=True)
        self.nodes[i].pid_file.unlink(missing_ok=True)

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start node `i` again on its store, ports and passwords, serving clients when this returns
        (`wait_ready` / `healthy`: caught up with the cluster)."""
        self.nodes[i].restart(timeout)

    def alive(self, i: int) -> bool:
        proc = self.nodes[i].proc
        return proc is not None and proc.poll() is None

    def monitor(self, i: int, path: str, timeout: float = 2.0) -> dict[str, Any]:
        """GET a monitoring endpoint of node `i` (`/jsz`, `/healthz`, ...) as JSON; {} if it does not answer."""
        url = f"http://127.0.0.1:{self.monitor_ports[i]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:  # /healthz answers 503 with a JSON body while unhealthy
            body = exc.read()
        except OSError:
            return {}
        with contextlib.suppress(ValueError):
            return dict(json.loads(body or b"{}"))
        return {}

    def healthy(self, i: int) -> bool:
        """Node `i` is up, knows the meta leader, and every stream and consumer it holds is current."""
        return self.alive(i) and self.monitor(i, "/healthz").get("status") == "ok"

    def meta_leader(self, i: int) -> str:
        """The JetStream meta leader as node `i` sees it ("" while there is none)."""
        return str(self.monitor(i, "/jsz").get("meta_cluster", {}).get("leader") or "")

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until every running node agrees on a meta leader and is healthy; returns the seconds
        it took. Raises TimeoutError with what each node reports."""
        start = time.monotonic()
        while True:
            running = [i for i in range(SIZE) if self.alive(i)]
            leaders = {self.meta_leader(i) for i in running}
            if running and len(leaders) == 1 and "" not in leaders and all(map(self.healthy, running)):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                state = {self.names()[i]: (self.meta_leader(i), self.healthy(i)) for i in running}
                raise TimeoutError(
                    f"nats cluster in {self.root} not ready after {timeout}s: "
                    f"(meta leader, healthy) per running node: {state}"
                )
            time.sleep(0.2)
