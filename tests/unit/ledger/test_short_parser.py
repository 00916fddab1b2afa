"""`client._ShortParser` reads the same protocol stream as nats-py's parser, however the reads cut it:
the short path's deliveries in order with their subject, reply, data and stream sequence; status
messages to their handler; everything else (pings, other subscriptions) to nats-py's path. With either
reader: the C module `_deliveries`, and `_read_deliveries`, its Python reference, which it must match
on any bytes, valid or not."""

from __future__ import annotations

import asyncio
import random

import pytest
from nats.aio.msg import Msg

from swarmrl.services.ledger import client as C

READERS = ["python", "c"]

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


def _reader(name: str):  # type: ignore[no-untyped-def]
    if name == "python":
        return C._read_deliveries
    if C._deliveries is None:
        pytest.skip("the C module _deliveries is not built (no compiler at install): Python reads")
    return C._deliveries.read


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("step", [1, 7, 64, 10_000])
def test_every_cut_of_the_stream_reads_the_same(
    step: int, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(C, "read", _reader(reader))
    raw, want = _stream()
    for first in range(0, min(step, len(raw)), max(step // 8, 1)):  # cuts at many offsets
        nc = _Client()
        assert isinstance(nc._ps, C._ShortParser)
        got: list[tuple[str, str, bytes]] = []
        statuses: list[str] = []

        def on_msgs(msgs: list[C.Delivery], got: list[tuple[str, str, bytes]] = got) -> None:
            assert all(type(m) is C.Delivery and m.seq == C.ack_seq(m.reply) for m in msgs)
            got.extend((m.subject, m.reply, m.data) for m in msgs)

        nc._short[SHORT] = (on_msgs, statuses.append)
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


def test_ack_seq_reads_both_ack_subject_layouts_as_nats_py_does() -> None:
    v1 = "$JS.ACK.EPISODES.ledger-episodes.1.42.40.1700000000000000000.7"
    v2 = "$JS.ACK._.ACCHASH.EPISODES.ledger-episodes.1.43.41.1700000000000000000.7.tok"
    for reply, seq in ((v1, 42), (v2, 43)):
        assert C.ack_seq(reply) == seq == Msg(_client=None, reply=reply).metadata.sequence.stream  # type: ignore[arg-type]
        assert C.Delivery("s", reply, b"", seq).metadata.sequence.stream == seq
    for reply in (
        "",
        "_INBOX.x",
        "$JS.ACK.S.c.1.x.2.3.4",
        "$JS.ACK.S.c.1.2",
        "$JS.ACK.S.c.1.-2.2.3.4",
        "$JS.ACK",
    ):
        assert C.ack_seq(reply) == 0, reply


def _outcome(reader, buf: bytes, pos: int, sids: dict[int, object]):  # type: ignore[no-untyped-def]
    try:
        out = reader(buf, pos, sids, C.Delivery)
    except (UnicodeDecodeError, ValueError) as exc:
        return type(exc).__name__
    assert all(type(m) is C.Delivery for m in out[2])
    return out


def _random_stream(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(1, 12)):
        sid = rng.choice([SHORT, SHORT, SHORT, OTHER, 12345678901234567890])
        subject = rng.choice(["swarm.ep.a.e1.llm", "s", "x.\xc3\xa9", "\xff.bad"]).encode("latin-1")
        reply = rng.choice(
            [
                b"",
                b"$JS.ACK.EPISODES.led.1.%d.3.17.0" % rng.randint(0, 10**6),
                b"$JS.ACK._.H.S.c.1.%d.2.3.4.t" % rng.randint(0, 99),
                b"_INBOX.abc",
            ]
        )
        data = rng.randbytes(rng.randint(0, 40)) + rng.choice([b"", b"\r\nMSG a 7 3\r\n"])
        blank = rng.choice([b" ", b"\t", b"  "])
        if rng.random() < 0.5:
            head = [b"MSG", subject, b"%d" % sid, *([reply] if reply else []), b"%d" % len(data)]
            parts.append(blank.join(head) + b"\r\n" + data + b"\r\n")
        else:
            status = rng.random() < 0.3
            headers = (
                b"NATS/1.0 %d Some Status \r\n\r\n" % rng.choice([404, 408, 409])
                if status
                else b"NATS/1.0\r\nK: v\r\n\r\n"
            )
            body = b"" if status else data
            head = [
                b"HMSG",
                subject,
                b"%d" % sid,
                *([reply] if reply else []),
                b"%d" % len(headers),
                b"%d" % (len(headers) + len(body)),
            ]
            parts.append(blank.join(head) + b"\r\n" + headers + body + b"\r\n")
        if rng.random() < 0.1:
            parts.append(rng.choice([b"PING\r\n", b"+OK\r\n", b"-ERR 'x'\r\n"]))
    return b"".join(parts)


def test_the_c_reader_reads_what_the_python_reference_reads_on_any_bytes() -> None:
    c = _reader("c")
    rng = random.Random(11)
    sids: dict[int, object] = {SHORT: None}
    checked = 0
    for _ in range(600):
        buf = bytearray(_random_stream(rng))
        for _ in range(rng.randint(0, 4)):  # damage: flipped, inserted, deleted bytes; a cut end
            at = rng.randrange(len(buf))
            kind = rng.random()
            if kind < 0.4:
                buf[at] = (
                    rng.choice(b" \t\r\n0123456789MSGH.$\xff") if rng.random() < 0.7 else rng.randrange(256)
                )
            elif kind < 0.7:
                buf[at:at] = bytes([rng.randrange(256)])
            else:
                del buf[at : at + rng.randint(1, 8)]
        if rng.random() < 0.3:
            del buf[rng.randrange(len(buf) + 1) :]
        for pos in sorted({0, *(rng.randrange(len(buf) + 1) for _ in range(3))}):
            assert _outcome(c, bytes(buf), pos, sids) == _outcome(C._read_deliveries, bytes(buf), pos, sids)
            assert _outcome(c, buf, pos, sids) == _outcome(
                C._read_deliveries, buf, pos, sids
            )  # bytearray too
            checked += 1
    assert checked > 1500


def test_the_c_reader_reads_a_valid_stream_as_the_python_reference_from_every_offset() -> None:
    c = _reader("c")
    raw, _ = _stream()
    for sids in ({SHORT: None}, {SHORT: None, OTHER: None}, {}):
        runs = 0
        for pos in range(len(raw) + 1):
            got = c(raw, pos, sids, C.Delivery)
            assert got == C._read_deliveries(raw, pos, sids, C.Delivery)
            runs += got[1] >= 0
        assert (runs >= 13) == bool(sids)  # a run starts at each delivery line of ours
