"""A NATS client whose pull-consumer inboxes skip nats-py's per-message subscription machinery.

Consumes: whatever its connection receives; the deliveries to inboxes registered with `short_path`
go straight to their handlers, everything else is nats-py's. Publishes: nothing of its own.

nats-py hands each message it reads to its subscription through header parsing, a `Msg`, an
asyncio queue, a task and an awaited callback: about 10 µs of CPU per message on a 2-core machine,
of which this path keeps only the `Msg` (without headers: the ledger does not read the headers of
the streams it registers; dead letters, whose headers it records, take nats-py's path). Messages
keep the order they were read in, status messages included.

The parser is shortened too (`_ShortParser`): a run of deliveries to registered subscriptions, as a
pull request's batch arrives, is read in one loop with one regular expression per message, without
a coroutine per message; anything else (pings, other subscriptions, a message cut across reads) is
nats-py's own parser's.

It relies on nats-py's private `Client._process_msg(sid, subject, reply, data, headers)` (what its
protocol parser calls for every message), `Client._ps` (the parser), `Parser.buf`/`Parser.state`
and `Subscription._id`. Where a nats-py release names them otherwise, `SHORT_PATH` is False and
every message takes nats-py's own path: slower, still right.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import parser as nats_parser

SHORT_PATH = list(inspect.signature(NATS._process_msg).parameters) == [
    "self", "sid", "subject", "reply", "data", "headers"
] and all(hasattr(nats_parser, name) for name in ("Parser", "AWAITING_CONTROL_LINE"))  # fmt: skip
"""nats-py calls `_process_msg` as `PullClient` expects."""
_STATUS_LINE = b"NATS/1.0 "
"""Start of a status message's header block (`NATS/1.0 404 No Messages`); a message's own headers
start `NATS/1.0\\r\\n`."""

OnMsg = Callable[[Msg], None]
OnStatus = Callable[[str], None]

# The protocol's delivery lines (`MSG <subject> <sid> [reply] <size>`, `HMSG ... <header size> <size>`),
# matched at a position rather than at the buffer's start, so a batch is read without moving bytes.
_MSG_LINE = re.compile(rb"MSG[ \t]+(\S+)[ \t]+(\d+)[ \t]+(?:(\S+)[ \t]+)?(\d+)\r\n")
_HMSG_LINE = re.compile(rb"HMSG[ \t]+(\S+)[ \t]+(\d+)[ \t]+(?:(\S+)[ \t]+)?(\d+)[ \t]+(\d+)\r\n")


class _ShortParser(nats_parser.Parser):  # type: ignore[misc]  # nats-py's parser is untyped
    """nats-py's parser, with the deliveries to short-path subscriptions read in one loop."""

    async def parse(self, data: bytes = b"") -> None:
        short: dict[int, tuple[OnMsg, OnStatus]] = self.nc._short
        if short and self.state == nats_parser.AWAITING_CONTROL_LINE:
            buf = self.buf
            buf.extend(data)
            data = b""
            pos, end = 0, len(buf)
            stats = self.nc.stats
            while pos < end:
                head = buf[pos]
                if head == 0x48:  # H
                    m = _HMSG_LINE.match(buf, pos)
                    if m is None:
                        break
                    hsize, size = int(m[4]), int(m[5])
                elif head == 0x4D:  # M
                    m = _MSG_LINE.match(buf, pos)
                    if m is None:
                        break
                    hsize, size = 0, int(m[4])
                else:
                    break
                sid = int(m[2])
                handlers = short.get(sid)
                if handlers is None:  # another subscription's: nats-py's
                    break
                start = m.end()
                if end < start + size + 2:  # the rest comes with the next read: keep this one whole
                    del buf[:pos]
                    return
                pos = start + size + 2
                stats["in_msgs"] += 1
                stats["in_bytes"] += size - hsize
                if hsize == size and buf.startswith(_STATUS_LINE, start):  # a status, no payload
                    handlers[1](
                        bytes(buf[start + len(_STATUS_LINE) : start + hsize]).strip().decode(errors="replace")
                    )
                    continue
                reply = m[3]
                handlers[0](
                    Msg(
                        _client=self.nc,
                        subject=m[1].decode(),
                        reply=reply.decode() if reply else "",
                        data=bytes(buf[start + hsize : start + size]),
                        _sid=sid,
                    )
                )
            del buf[:pos]
        await super().parse(data)  # the rest (nothing, when the batch was all ours)


class PullClient(NATS):
    """nats-py's client, with a short path for registered subscriptions (`short_path`). Connect it
    with `bus.connect(url, name, client=PullClient())`."""

    def __init__(self) -> None:
        super().__init__()
        if SHORT_PATH:
            self._ps = _ShortParser(self)
        self._short: dict[int, tuple[OnMsg, OnStatus]] = {}
        """Subscription id -> its handlers. A JetStream delivery's subject is the message's own, not
        the inbox: the subscription id is what tells whose it is."""

    def short_path(self, sub: Subscription, on_msg: OnMsg | None, on_status: OnStatus | None = None) -> bool:
        """Hand the messages of `sub` to `on_msg` and its status messages (`404`, `408 Request
        Timeout`, ...: the end of a pull request) to `on_status`; `on_msg=None`: back to nats-py's
        path. Register before the first pull request. False: not available (see `SHORT_PATH`)."""
        sid = getattr(sub, "_id", None)  # nats-py's own name for it; there is no public one
        if not SHORT_PATH or not isinstance(sid, int):
            return False
        if on_msg is None or on_status is None:
            self._short.pop(sid, None)
        else:
            self._short[sid] = (on_msg, on_status)
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
            handlers[0](
                Msg(_client=self, subject=subject.decode(), reply=reply.decode(), data=data, _sid=sid)
            )
