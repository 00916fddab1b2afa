"""`swarmrl nats`: run the embedded JetStream server alone (for a multi-process or multi-node trial)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from swarmrl.infra.nats_server import NatsServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmrl nats", description=__doc__)
    parser.add_argument("--port", type=int, default=4222, help="client port (default 4222; 0 = random)")
    parser.add_argument("--store-dir", type=Path, default=Path("runs/nats"), help="JetStream store directory")
    args = parser.parse_args(argv)
    server = NatsServer(store_dir=args.store_dir, port=args.port).start()
    agent_file = server.agent.write(args.store_dir / "agent.json")
    print(
        f"service URL: {server.service_url}\nagent connect file: {agent_file}\n"
        f"more agents: swarmrl credentials mint NAME --conf-dir {server.conf_dir}",
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0
