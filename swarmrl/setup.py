"""`swarmrl setup`: create a swarm's streams, KV buckets and object store on NATS servers you run
yourself, as `swarmrl up` does on its own. Service roles may not create streams, so the operator runs
this once, with the operator's URL in `$SWARMRL_NATS`, before the services start
(`infra/multihost.md`); running it again changes nothing.

    SWARMRL_STREAM_REPLICAS=3 swarmrl setup          # a 3-node cluster: every stream on every node
    swarmrl setup --ledger-replicas                  # with `[replicas] ledger` > 1 (LEDGER_PARTS)

A cluster that is still forming (nodes starting, no JetStream meta leader yet) is waited for, up to
`--wait-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from swarmrl.core.config import password_on_command_line, plain_servers


async def setup(url: str, ledger_parts: bool, wait_s: float) -> float:
    """Create everything; returns the seconds it waited for JetStream (at most `wait_s`)."""
    import nats.errors

    from swarmrl.services.common import bus

    start = time.monotonic()
    nc = await bus.connect(url, "setup")
    try:
        while True:
            try:
                await bus.ensure_streams(nc.jetstream(timeout=10), ledger_parts=ledger_parts)
                return time.monotonic() - start
            # No meta leader yet: JetStream times out (a RuntimeError of `ensure_streams`) or answers 503.
            except (nats.errors.Error, RuntimeError, TimeoutError, OSError) as exc:
                if time.monotonic() - start > wait_s:
                    raise RuntimeError(
                        f"JetStream at {','.join(plain_servers(url))} not ready after {wait_s:g} s: {exc!r}"
                    ) from exc
                await asyncio.sleep(1.0)
    finally:
        await bus.close(nc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="swarmrl setup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--ledger-replicas", action="store_true",
                   help="also LEDGER_PARTS, the work queue ledger replicas share (`[replicas] ledger` > 1)")  # fmt: skip
    p.add_argument("--wait-s", type=float, default=120.0, help="how long to wait for JetStream to answer")
    args = p.parse_args(argv)
    if reason := password_on_command_line(argv):
        p.error(reason)
    url = os.environ.get("SWARMRL_NATS", "")
    if not url:
        p.error("no $SWARMRL_NATS: set it to the operator's URL (nats://service:PASSWORD@host:4222,...)")
    waited = asyncio.run(setup(url, args.ledger_replicas, args.wait_s))
    replicas = os.environ.get("SWARMRL_STREAM_REPLICAS", "1")
    print(
        f"swarmrl setup: streams, buckets and object store ready ({replicas} replica(s); waited {waited:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
