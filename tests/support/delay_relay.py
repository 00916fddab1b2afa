"""A delaying TCP relay: latency between two hosts where the kernel has no `netem` (`tests/support/netns.py`).

    python tests/support/delay_relay.py --port 15999 --config relay.json   # in a host's namespace

The host's nftables `redirect` every new TCP connection to a shaped peer here; the relay reads
where each was going (`SO_ORIGINAL_DST`), connects there itself with the mark `RELAY_MARK` (which
the redirect rule leaves alone), and copies bytes both ways. Each chunk is held for the delay the
config file gives the peer's address, `{"10.0.0.3": [mean_ms, jitter_ms]}` (uniform in mean +-
jitter), never released before the chunk ahead of it (a byte stream keeps its order); a peer not in
the file gets none. The file is read again whenever it changes, so a benchmark turns latency on and
off while connections stay up. Reading stops while more than `MAX_QUEUED` bytes wait in one
direction, so TCP's own flow control applies. A connection the peer does not accept within
`CONNECT_TIMEOUT_S` is reset, as a refused one would be.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import struct
import time
from collections import deque
from pathlib import Path

RELAY_MARK = 0x2A
"""Firewall mark of the relay's own connections (`SO_MARK`): the redirect skips them."""
SO_ORIGINAL_DST = 80
"""`getsockopt(SOL_IP, SO_ORIGINAL_DST)`: the destination a redirected connection had (linux/netfilter_ipv4.h)."""
MAX_QUEUED = 4 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
CHUNK = 64 * 1024


def applied_path(config: Path) -> Path:
    """Where the relay writes the modification time (ns) of the config it applies."""
    return config.with_name(config.name + ".applied")


class Delays:
    """The config file's delays per peer address, re-read when its modification time changes."""

    def __init__(self, path: Path) -> None:
        self.path, self.mtime, self.table = path, 0, dict[str, tuple[float, float]]()

    def refresh(self) -> None:
        """Read the file again if it changed, then say which version applies (`applied_path`)."""
        with contextlib.suppress(OSError, ValueError):
            mtime = self.path.stat().st_mtime_ns
            if mtime != self.mtime:
                raw = json.loads(self.path.read_text() or "{}")
                self.table = {addr: (float(v[0]), float(v[1])) for addr, v in raw.items()}
                self.mtime = mtime
                applied_path(self.path).write_text(str(mtime))

    def sample_s(self, addr: str) -> float:
        mean, jitter = self.table.get(addr, (0.0, 0.0))
        return max(0.0, random.uniform(mean - jitter, mean + jitter)) / 1000.0


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delays: Delays, peer: str) -> None:
    """Copy `reader` to `writer`, each chunk held for a delay sampled per chunk, in order."""
    queue: deque[tuple[float, bytes]] = deque()
    queued, ready, room = 0, asyncio.Event(), asyncio.Event()
    room.set()
    done = False

    async def release() -> None:
        nonlocal queued
        try:
            while queue or not done:
                if not queue:
                    ready.clear()
                    await ready.wait()
                    continue
                at, data = queue[0]
                if (wait := at - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                queue.popleft()
                queued -= len(data)
                writer.write(data)
                await writer.drain()
                if queued <= MAX_QUEUED:
                    room.set()
            with contextlib.suppress(OSError):
                writer.write_eof()
        finally:
            room.set()  # a writer that failed must not leave the reader waiting for room

    sender = asyncio.create_task(release())
    last = 0.0
    try:
        while data := await reader.read(CHUNK):
            last = max(last, time.monotonic() + delays.sample_s(peer))
            queue.append((last, data))
            queued += len(data)
            ready.set()
            if queued > MAX_QUEUED:
                room.clear()
                await room.wait()
            if sender.done():
                break
    finally:
        done = True
        ready.set()
        await sender


async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, delays: Delays) -> None:
    sock = client_w.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack("!2xH4s8x", raw)
    addr = socket.inet_ntoa(packed)
    up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, RELAY_MARK)
    up.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(up, (addr, port)), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        up.close()
        # closed with a reset: the dialer sees the connection refused, not a silent hang
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client_w.close()
        return
    peer_r, peer_w = await asyncio.open_connection(sock=up)
    try:
        await asyncio.gather(pump(client_r, peer_w, delays, addr), pump(peer_r, client_w, delays, addr))
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        for w in (peer_w, client_w):
            w.close()


async def serve(port: int, config: Path) -> None:
    delays = Delays(config)
    delays.refresh()
    server = await asyncio.start_server(lambda r, w: relay(r, w, delays), "127.0.0.1", port)
    print(f"delay relay listening on 127.0.0.1:{port}, delays from {config}", flush=True)
    async with server:
        while True:
            await asyncio.sleep(0.2)
            delays.refresh()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="delay_relay.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--port", type=int, required=True, help="port on this namespace's loopback")
    p.add_argument("--config", type=Path, required=True, help="JSON: peer address -> [mean_ms, jitter_ms]")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
