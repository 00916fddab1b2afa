"""`client._ShortParser` reads the same protocol stream as nats-py's parser, however the reads cut it:
the short path's deliveries in order with their subject, reply and data; status messages to their
handler; everything else (pings, other subscriptions) to nats-py's path."""

from __future__ import annotations

import asyncio

import pytest

from swarmrl.services.ledger import client as C

SHORT, OTHER = 7, 9


def _hmsg(subject: str, sid: int, reply: str, headers: bytes, data: bytes) -> bytes:
    line = f"HMSG {subject} {sid} {reply} {len(headers)} {len(headers) + len(data)}\r\n".encode()
    return line + headers + data + b"\r\n"


def _stream() -> tuple[bytes, list[tuple[str, str, bytes]]]:
    """A protocol stream and the deliveries the short path should see, in order."""
    parts: list[bytes] = []
    want: list[tuple[str, str, bytes]] = []
    for i in range(12):
        subject = f"swarm.ep.agent.e{i}.llm"
        reply = f"$JS.ACK.EPISODES.ledger-EPISODES.1.{i + 1}.{i + 1}.1763900000000000000.{11 - i}"
        data = bytes(range(i * 7 % 256, 256))[: 40 + i] + b"\r\nMSG 1 2 3\r\n"  # protocol-like bytes inside
        parts.append(_hmsg(subject, SHORT, reply, f"NATS/1.0\r\nNats-Msg-Id: m{i}\r\n\r\n".encode(), data))
        want.append((subject, reply, data))
        if i == 3:
            parts.append(b"PING\r\n")
        if i == 5:
            parts.append(f"MSG other.subject {OTHER} 5\r\nhello\r\n".encode())
        if i == 7:
            parts.append(f"MSG plain.subject {SHORT} 3\r\nabc\r\n".encode())  # no headers, no reply
            want.append(("plain.subject", "", b"abc"))
    parts.append(f"HMSG _INBOX.x {SHORT} 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n".encode())
    return b"".join(parts), want


class _Client(C.PullClient):
    """A PullClient that is never connected: what reaches nats-py's own handlers is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.others: list[tuple[int, bytes]] = []
        self.pings = 0

    async def _process_msg(self, sid, subject, reply, data, headers) -> None:  # type: ignore[no-untyped-def]
        if sid in self._short:
            return await super()._process_msg(sid, subject, reply, data, headers)
        self.others.append((sid, data))

    async def _process_ping(self) -> None:
        self.pings += 1


@pytest.mark.parametrize("step", [1, 7, 64, 10_000])
def test_every_cut_of_the_stream_reads_the_same(step: int) -> None:
    raw, want = _stream()
    for first in range(0, min(step, len(raw)), max(step // 8, 1)):  # cuts at many offsets
        nc = _Client()
        assert isinstance(nc._ps, C._ShortParser)
        got: list[tuple[str, str, bytes]] = []
        statuses: list[str] = []
        nc._short[SHORT] = (lambda m, got=got: got.append((m.subject, m.reply, m.data)), statuses.append)
        cuts = [0, first, *range(first + step, len(raw), step), len(raw)]

        async def feed(nc=nc, cuts=cuts) -> None:
            for a, b in zip(cuts, cuts[1:], strict=False):
                await nc._ps.parse(raw[a:b])

        asyncio.run(feed())
        assert got == want
        assert statuses == ["404 No Messages"]
        assert nc.others == [(OTHER, b"hello")]
        assert nc.pings == 1
        assert nc.stats["in_msgs"] == len(want) + 1  # the status message counts too
