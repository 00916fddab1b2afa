"""`swarmrl nats`: run the embedded JetStream server alone (for a multi-process or multi-node trial).

    swarmrl nats                                        # one server on 127.0.0.1:4222, fresh passwords
    swarmrl nats --new-secrets > secrets.env            # passwords for servers you run yourself
    swarmrl nats --node 1 --host 10.0.0.1 --routes 10.0.0.1,10.0.0.2,10.0.0.3   # node 1 of 3, on one host

A cluster node (`--node N`, config `cluster-node<N>.conf`) listens for clients, routes and monitoring
on `--host` only, dials the `--routes` hosts, and takes every user's password from the environment
(`SWARM_<ROLE>_PASSWORD`, as `--new-secrets` prints them): every node of a cluster must have the same.
Its conf dir is `<store dir>/conf`: agents minted there (`swarmrl credentials mint --conf-dir`) are
accepted by this node; copy its `agents.json` to the other nodes' conf dirs for them too.
`infra/multihost.md` runs a swarm over three hosts this way.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import threading
from pathlib import Path

from swarmrl.infra.credentials import password_var
from swarmrl.infra.nats_server import ROLES, NatsServer, new_passwords

GATEWAY_SECRET_VAR = "SWARMRL_SECRET"
"""The gateways' episode-token secret (`[gateway] secret`): one value shared by every gateway."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="swarmrl nats", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--port", type=int, default=4222, help="client port (default 4222; 0 = random)")
    add("--store-dir", type=Path, default=Path("runs/nats"), help="JetStream store directory")
    add("--new-secrets", action="store_true",
        help="print fresh passwords for every user (and the gateways' token secret) as VAR=value lines, "
        "for an environment file every host reads, and exit")  # fmt: skip
    add("--node", type=int, choices=(1, 2, 3), default=None, help="run node N of a 3-node cluster")
    add("--host", default="127.0.0.1", help="address to listen on (client, route and monitoring ports)")
    add(
        "--routes",
        default="",
        help="cluster nodes as HOST[:PORT],... (route port default 6222), this one included",
    )
    add("--cluster-port", type=int, default=6222, help="route port of this node")
    add("--monitor-port", type=int, default=8222, help="HTTP monitoring port of a node (0: none)")
    args = parser.parse_args(argv)
    if args.new_secrets:
        for role, password in new_passwords().items():
            print(f"{password_var(role)}={password}")
        print(f"{GATEWAY_SECRET_VAR}={secrets.token_urlsafe(32)}")
        return 0
    server = NatsServer(store_dir=args.store_dir, port=args.port, host=args.host)
    if args.node is not None:
        missing = [password_var(r) for r in ROLES if not os.environ.get(password_var(r))]
        if missing or not args.routes:
            parser.error(f"--node needs --routes and every password in the environment (missing: {missing})")
        server = cluster_node(args)
    server.start()
    agent_file = server.agent.write(args.store_dir / "agent.json")
    # a single server made its own passwords: its URL says the operator's; a node's are in the environment
    url = server.plain_url if args.node is not None else f"service URL: {server.service_url}"
    print(
        f"{url}\nagent connect file: {agent_file}\n"
        f"more agents: swarmrl credentials mint NAME --conf-dir {server.conf_dir}",
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


def cluster_node(args: argparse.Namespace) -> NatsServer:
    """Node `args.node` of the cluster `swarmrl` on `args.host`, passwords from the environment."""
    nodes = [r.strip().partition(":") for r in args.routes.split(",") if r.strip()]
    routes = [f"nats-route://{host}:{port or 6222}" for host, _, port in nodes]
    flags = ["--cluster", f"nats://{args.host}:{args.cluster_port}", "--routes", ",".join(routes)]
    if args.monitor_port:
        flags += ["-m", str(args.monitor_port)]  # on --host: nats-server binds monitoring with the clients
    return NatsServer(
        store_dir=args.store_dir, port=args.port, host=args.host, config=f"cluster-node{args.node}.conf",
        passwords={role: os.environ[password_var(role)] for role in ROLES}, extra_args=flags,
    )  # fmt: skip
