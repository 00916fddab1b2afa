"""A NATS client whose pull-consumer inboxes skip nats-py's per-message subscription machinery.

Consumes: whatever its connection receives; the deliveries to inboxes registered with `short_path`
go straight to their handlers, a run of them at a time, everything else is nats-py's. Publishes:
nothing of its own.

nats-py hands each message it reads to its subscription through header parsing, a `Msg`, an
asyncio queue, a task and an awaited callback: about 10 µs of CPU per message on a 2-core machine.
On the short path the parser reads a run of deliveries to one subscription (a pull request's batch)
in one call, `read`, into `Delivery` tuples: the C module `_deliveries` when pip could build it
(a few hundred instructions a delivery), else `_read_deliveries`, the same logic in Python (about
28,000: a regular expression per protocol line, the strings, the ack subject split). Headers are not
read on this path (the ledger does not read the headers of the streams it registers; dead letters,
whose headers it records, take nats-py's path). Messages keep the order they were read in, status
messages included. Anything else (pings, other subscriptions, a line cut across reads) is nats-py's
own parser's.

It relies on nats-py's private `Client._process_msg(sid, subject, reply, data, headers)` (what its
protocol parser calls for every message), `Client._ps` (the parser), `Parser.buf`/`Parser.state`
and `Subscription._id`. Where a nats-py release names them otherwise, `SHORT_PATH` is False and
every message takes nats-py's own path: slower, still right.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import parser as nats_parser

try:
    from swarmrl.services.ledger import _deliveries  # type: ignore[attr-defined]  # C, built by pip when it can
except ImportError:  # no compiler when installed: the same reading in Python
    _deliveries = None

SHORT_PATH = list(inspect.signature(NATS._process_msg).parameters) == [
    "self", "sid", "subject", "reply", "data", "headers"
] and all(hasattr(nats_parser, name) for name in ("Parser", "AWAITING_CONTROL_LINE"))  # fmt: skip
"""nats-py calls `_process_msg` as `PullClient` expects."""
_STATUS_LINE = b"NATS/1.0 "
"""Start of a status message's header block (`NATS/1.0 404 No Messages`); a message's own headers
start `NATS/1.0\\r\\n`."""


class Delivery(NamedTuple):
    """A message of a pull consumer, as the ledger reads it (what of nats-py's `Msg` it uses)."""

    subject: str
    reply: str
    """The ack subject: publishing to it acks the message (and, `AckPolicy.ALL`, all before it)."""
    data: bytes
    seq: int
    """The stream sequence, read from the ack subject (`ack_seq`); 0 if it is not one."""
    headers: dict[str, str] | None = None
    """None on the short path, which does not read them."""

    @classmethod
    def of(cls, msg: Msg) -> Delivery:
        """A message read by nats-py's own path."""
        return cls(msg.subject, msg.reply or "", msg.data, ack_seq(msg.reply or ""), msg.headers)

    @property
    def metadata(self) -> Msg.Metadata:
        """Stream, sequences, timestamp: nats-py's reading of the ack subject."""
        return Msg(_client=None, reply=self.reply).metadata  # type: ignore[arg-type]


def ack_seq(reply: str) -> int:
    """The stream sequence in a JetStream ack subject, 0 if `reply` is none. Two layouts:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>` and, with a
    domain, `$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<stream seq>...` (11+ tokens)."""
    tokens = reply.split(".")
    if tokens[:2] != ["$JS", "ACK"]:
        return 0
    at = 5 if len(tokens) == 9 else 7 if len(tokens) >= 11 else None
    if at is None or not (tokens[at].isascii() and tokens[at].isdigit() and len(tokens[at]) <= 19):
        return 0
    return int(tokens[at])


OnMsgs = Callable[[list[Delivery]], None]
OnStatus = Callable[[str], None]
Read = tuple[int, int, list[Delivery], str | None, int, bool]
"""(pos, sid, deliveries, status, payload bytes, cut): see `_read_deliveries`."""

# The protocol's delivery lines (`MSG <subject> <sid> [reply] <size>`, `HMSG ... <header size> <size>`),
# matched at a position rather than at the buffer's start, so a batch is read without moving bytes.
# Numbers (subscription ids, sizes) of more than 18 digits are not read here: nats-py's parser decides.
_MSG_LINE = re.compile(rb"MSG[ \t]+(\S+)[ \t]+(\d{1,18})[ \t]+(?:(\S+)[ \t]+)?(\d{1,18})\r\n")
_HMSG_LINE = re.compile(
    rb"HMSG[ \t]+(\S+)[ \t]+(\d{1,18})[ \t]+(?:(\S+)[ \t]+)?(\d{1,18})[ \t]+(\d{1,18})\r\n"
)


def _read_deliveries(
    buf: bytearray | bytes, pos: int, sids: Mapping[int, object], cls: type[Delivery]
) -> Read:
    """The deliveries at `buf[pos:]` to one subscription (the first one's, which must be in `sids`).

    Returns where reading stopped, the subscription id (-1: none read), the deliveries, the text of
    the status message that ended the run (None: none did), their payload bytes, and whether it
    stopped at a delivery not yet whole. It stops before anything else: another command, another
    subscription, a line not (yet) whole or not as nats-server writes it. The C module `_deliveries`
    reads the same; this is its reference (the tests compare them) and its stand-in.
    """
    end = len(buf)
    run = -1
    out: list[Delivery] = []
    nbytes = 0
    while pos < end:
        head = buf[pos]
        if head == 0x48:  # H
            m = _HMSG_LINE.match(buf, pos)
            if m is None:
                break
            hlen, total = int(m[4]), int(m[5])
        elif head == 0x4D:  # M
            m = _MSG_LINE.match(buf, pos)
            if m is None:
                break
            hlen, total = 0, int(m[4])
        else:
            break
        sid = int(m[2])
        if hlen > total:
            break
        if run < 0:
            if sid not in sids:  # another subscription's: nats-py's
                break
            run = sid
        elif sid != run:
            break
        start = m.end()
        if end < start + total + 2:  # the rest comes with the next read
            return pos, run, out, None, nbytes, True
        pos = start + total + 2
        nbytes += total - hlen
        if (
            head == 0x48 and hlen == total and buf[start : start + len(_STATUS_LINE)] == _STATUS_LINE
        ):  # a status
            status = bytes(buf[start + len(_STATUS_LINE) : start + hlen]).strip().decode(errors="replace")
            return pos, run, out, status, nbytes, False
        reply = m[3].decode() if m[3] else ""
        out.append(cls(m[1].decode(), reply, bytes(buf[start + hlen : start + total]), ack_seq(reply)))
    return pos, run, out, None, nbytes, False


read = _deliveries.read if _deliveries is not None else _read_deliveries
"""`_read_deliveries`, in C when built."""


class _ShortParser(nats_parser.Parser):  # type: ignore[misc]  # nats-py's parser is untyped
    """nats-py's parser, with the deliveries to short-path subscriptions read a run at a time."""

    async def parse(self, data: bytes = b"") -> None:
        short: dict[int, tuple[OnMsgs, OnStatus]] = self.nc._short
        if short and self.state == nats_parser.AWAITING_CONTROL_LINE:
            buf = self.buf
            buf.extend(data)
            data = b""
            pos, cut = self._deliver(buf, short)
            del buf[:pos]
            if cut:  # keep the partial delivery for the next read, on this path
                return
        await super().parse(data)  # the rest (nothing, when the reads were all ours)

    def _deliver(self, buf: bytearray, short: dict[int, tuple[OnMsgs, OnStatus]]) -> tuple[int, bool]:
        """Hand the runs of deliveries at the start of `buf` to their handlers; where reading
        stopped, and whether at a delivery cut short."""
        pos = 0
        stats = self.nc.stats
        while True:
            pos, sid, msgs, status, nbytes, cut = read(buf, pos, short, Delivery)
            if sid < 0:
                return pos, False
            stats["in_msgs"] += len(msgs) + (status is not None)
            stats["in_bytes"] += nbytes
            on_msgs, on_status = short[sid]
            if msgs:
                on_msgs(msgs)
            if status is not None:
                on_status(status)
            if cut or (not msgs and status is None):
                return pos, cut


class PullClient(NATS):
    """nats-py's client, with a short path for registered subscriptions (`short_path`). Connect it
    with `bus.connect(url, name, client=PullClient())`."""

    def __init__(self) -> None:
        super().__init__()
        if SHORT_PATH:
            self._ps = _ShortParser(self)
        self._short: dict[int, tuple[OnMsgs, OnStatus]] = {}
        """Subscription id -> its handlers. A JetStream delivery's subject is the message's own, not
        the inbox: the subscription id is what tells whose it is."""

    def short_path(
        self, sub: Subscription, on_msgs: OnMsgs | None, on_status: OnStatus | None = None
    ) -> bool:
        """Hand the messages of `sub` to `on_msgs` (as `Delivery` lists, in order) and its status
        messages (`404`, `408 Request Timeout`, ...: the end of a pull request) to `on_status`;
        `on_msgs=None`: back to nats-py's path. Register before the first pull request. False: not
        available (see `SHORT_PATH`)."""
        sid = getattr(sub, "_id", None)  # nats-py's own name for it; there is no public one
        if not SHORT_PATH or not isinstance(sid, int):
            return False
        if on_msgs is None or on_status is None:
            self._short.pop(sid, None)
        else:
            self._short[sid] = (on_msgs, on_status)
        return True

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        # `headers` is None for a message without (nats-py's annotation says bytes).
        handlers = self._short.get(sid)
        if handlers is None:
            return await super()._process_msg(sid, subject, reply, data, headers)
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        if not data and headers and headers.startswith(_STATUS_LINE):
            handlers[1](headers[len(_STATUS_LINE) :].strip().decode(errors="replace"))
        else:
            reply_str = reply.decode()
            handlers[0]([Delivery(subject.decode(), reply_str, data, ack_seq(reply_str))])
