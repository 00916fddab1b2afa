"""NATS plumbing shared by all services: connect, create streams/buckets idempotently, dead-letter.

The stream layout comes from `swarmrl.schemas.subjects`; nothing here invents a subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue

from swarmrl.schemas import MAX_EVENT_BYTES
from swarmrl.schemas import subjects as S
from swarmrl.services.common.retry import backoff

log = logging.getLogger("swarmrl.bus")

ENSURE_STREAMS_S = 60.0
"""How long `ensure_streams` waits through JetStream answering 503 (a config reload) before failing."""
DUPLICATE_WINDOW_S = 120.0
"""JetStream de-duplicates a re-published Nats-Msg-Id within this window (agents' retries)."""
SERVICE_DUPLICATE_WINDOW_S = 1800.0
"""Window for streams written by services: a service restarted after a long outage replays what it
had published but not yet acked upstream, and must still be de-duplicated."""

MAX_MSG_BYTES = 8 * 1024 * 1024
"""Largest message (headers included) a stream stores: the bundled server's max_payload."""
EPISODE_MSG_BYTES = MAX_EVENT_BYTES + 4096
"""Largest EPISODES message: the contract's event limit plus room for headers (the msg id), so the broker
refuses an agent's oversized event at publish time, and every stored one can be dead-lettered whole."""
DEAD_LETTER_MAX_BYTES = 6 * 1024 * 1024
"""A dead letter (payload and headers) above this, or above the server's max_payload, carries only
the first `DEAD_LETTER_KEEP_BYTES` of the original and its size and SHA-256 (headers below): a
publish the server refuses for size would close the service's connection and lose the dead letter."""
DEAD_LETTER_KEEP_BYTES = 64 * 1024
MAX_DELIVERIES = 5
"""A message delivered more often than this has crashed or stalled its consumer that often: it is
dead-lettered as `poison` and acked instead (`drop_poison`). Every restart counts (a graceful stop
naks what a service holds), and so do the messages in flight beside the one that crashed it."""

REASON_HEADER = "Swarm-Reason"
SUBJECT_HEADER = "Swarm-Subject"
SERVICE_HEADER = "Swarm-Service"
# on a truncated dead letter: the original payload's length in bytes and hex SHA-256
ORIGINAL_SIZE_HEADER = "Swarm-Original-Size"
ORIGINAL_SHA256_HEADER = "Swarm-Original-Sha256"


PING_INTERVAL_S = 5.0
MAX_OUTSTANDING_PINGS = 3
"""A connection with this many pings unanswered (each `PING_INTERVAL_S` apart) is dead and replaced at
once: a network cut leaves TCP open but silent, and with nats-py's defaults (2 minutes, 2) a service
was heard again only 25-30 s after a 30 s cut healed (`bench/results/partitions.md`)."""


async def connect(url: str, name: str) -> NATS:
    """Connect with reconnects forever (a broker restart pauses a service, never kills it); the user
    and password of `url` go as options, for every server (`split_credentials`)."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error (%s): %s", name, exc)

    servers, (user, password) = split_credentials(url)
    nc = NATS()
    await nc.connect(
        servers=servers,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]  # seconds: nats-py annotates int, sleeps any number
        ping_interval=PING_INTERVAL_S,  # type: ignore[arg-type]
        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        error_cb=on_error,
        user=user,
        password=password,
    )
    return nc


def split_credentials(url: str) -> tuple[list[str], tuple[str | None, str | None]]:
    """The servers of `url` (comma-separated) without credentials, and the one user and password they
    carry (None, None: none, or not the same in all). A cluster's servers announce each other without
    credentials: left in the URLs, nats-py pooled each node twice, and the bare entry's reconnects
    failed with `Authorization Violation`."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    parts = [urlsplit(u) for u in urls]
    users = {(p.username, p.password) for p in parts}
    if len(users) != 1 or None in next(iter(users)):
        return urls, (None, None)
    user, password = next(iter(users))
    bare = [urlunsplit(p._replace(netloc=p.netloc.rsplit("@", 1)[-1])) for p in parts]
    return bare, (unquote(user or ""), unquote(password or ""))


async def close(nc: NATS, drain: bool = False, flush_s: int | None = None) -> None:
    """Close a connection on the way out (`drain`: let its subscriptions finish what they hold;
    `flush_s`: first flush the last acks or naks for up to that long, where a drain would wait on
    expired fetches). A broker already gone is logged, not raised, so the rest of the shutdown runs;
    what a failed flush loses comes back as redeliveries."""
    if flush_s is not None and not nc.is_closed:
        try:
            await nc.flush(timeout=flush_s)
        except (OSError, RuntimeError, nats.errors.Error, TimeoutError) as exc:
            log.warning("final flush failed: %r", exc)
    try:
        await (nc.drain() if drain else nc.close())
    except (OSError, RuntimeError, nats.errors.Error) as exc:
        log.warning("nats connection closed with an error (the server is gone?): %r", exc)


def stream_replicas() -> int:
    return int(os.environ.get("SWARMRL_STREAM_REPLICAS", "1"))


async def ensure_streams(js: JetStreamContext, *, ledger_parts: bool = False) -> None:
    """Create (or update to the current config) every swarmrl stream and KV bucket, idempotently;
    `ledger_parts`: also LEDGER_PARTS, for ledger replicas (a work queue nobody reads would grow).
    Writes only what is missing or differs: a service role may only read what the operator (`swarmrl
    up`) set up. Retried through 503s for up to ENSURE_STREAMS_S: a nats-server config reload (an
    account added, an agent minted) makes JetStream answer 503 for a moment
    (`tests/integration/test_research_accounts.py`)."""
    await backoff(functools.partial(_ensure_streams, js, ledger_parts), seconds=ENSURE_STREAMS_S)


async def _ensure_streams(js: JetStreamContext, ledger_parts: bool) -> None:
    replicas = stream_replicas()
    for name, subjects in {**S.STREAM_SUBJECTS, **S.WORK_STREAM_SUBJECTS}.items():
        episodes = name == S.EPISODES_STREAM
        cfg = api.StreamConfig(
            name=name, subjects=subjects, storage=api.StorageType.FILE, num_replicas=replicas,
            retention=api.RetentionPolicy.WORK_QUEUE if name in S.WORK_STREAM_SUBJECTS else None,
            duplicate_window=DUPLICATE_WINDOW_S if episodes else SERVICE_DUPLICATE_WINDOW_S,
            max_msg_size=EPISODE_MSG_BYTES if episodes else MAX_MSG_BYTES,
        )  # fmt: skip
        await _add_or_update(js, cfg)
    await _ensure_parts(js, S.EPISODE_PARTS_STREAM, S.EPISODE_PARTITION_TRANSFORM, replicas)
    if ledger_parts:
        await _ensure_parts(js, S.LEDGER_PARTS_STREAM, S.LEDGER_PARTITION_TRANSFORM, replicas)
    await _ensure_bucket(js, S.MODELS_BUCKET, history=16, replicas=replicas)
    # direct gets: an agent reads its own key through $JS.API.DIRECT.GET.<...>.<key>
    await _ensure_bucket(js, S.CLIENTS_BUCKET, history=1, replicas=replicas, direct=True)
    await _ensure_bucket(js, S.LEASES_BUCKET, history=1, ttl=LEASE_TTL_S, replicas=replicas)
    await _ensure_bucket(js, S.GROUPS_BUCKET, history=1, ttl=GROUPS_TTL_S, replicas=replicas)
    try:  # empty until a trainer shares its weights
        await js.object_store(S.WEIGHTS_BUCKET)
    except NotFoundError:
        await js.create_object_store(
            S.WEIGHTS_BUCKET, api.ObjectStoreConfig(storage=api.StorageType.FILE, replicas=replicas)
        )


async def _ensure_bucket(js: JetStreamContext, bucket: str, **config: Any) -> None:
    """Create KV `bucket` with `config` unless it exists (an existing one keeps its own)."""
    try:
        await js.key_value(bucket)
    except NotFoundError:
        await js.create_key_value(bucket=bucket, **config)


GROUPS_TTL_S = 3600.0
"""How long the gateways remember an admitted group (`services/gateway/admission.py`): far longer than
a group takes to play, or than the trainer waits for one (`group_timeout_s`)."""
LEASE_TTL_S = 6.0
"""A lease or presence key not renewed for this long is gone (`services/common/leases.py`): how long a
dead replica's partitions wait for a new owner. Fixed when the bucket is created."""


async def _ensure_parts(js: JetStreamContext, name: str, transform: tuple[str, str], replicas: int) -> None:
    """EPISODE_PARTS (LEDGER_PARTS): every EPISODES message again, under its partition's subject, as a
    work queue for the mergers (ledgers), with the services' size limit (a source refused here would
    stall every later event). Created beside an EPISODES stream that holds events, it starts after them."""
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    src, dest = transform
    last = (await js.stream_info(S.EPISODES_STREAM)).state.last_seq
    source = api.StreamSource(
        name=S.EPISODES_STREAM,
        opt_start_seq=last + 1 if last else None,
        subject_transforms=[api.SubjectTransform(src=src, dest=dest)],
    )
    cfg = api.StreamConfig(
        name=name, sources=[source], storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.WORK_QUEUE, num_replicas=replicas, max_msg_size=MAX_MSG_BYTES,
    )  # fmt: skip
    try:
        await js.add_stream(cfg)
    except nats.errors.TimeoutError as exc:
        raise _not_allowed(name, "is missing") from exc


def source_position(msg: Msg) -> tuple[str, int]:
    """(stream, sequence) of a JetStream message in its origin stream: for one a stream sourced
    (EPISODE_PARTS, LEDGER_PARTS), from its `Nats-Stream-Source` header (`<stream> <seq> ...`)."""
    source = (msg.headers or {}).get("Nats-Stream-Source")
    if source:
        stream, seq, *_ = source.split(" ", 2)
        return stream, int(seq)
    meta = msg.metadata
    return meta.stream, int(meta.sequence.stream)


def source_seq(msg: Msg) -> int:
    return source_position(msg)[1]


def _not_allowed(stream: str, state: str) -> RuntimeError:
    return RuntimeError(
        f"stream {stream} {state} and this NATS user may not set it up (a permissions violation is logged "
        "above if so): connect once with the swarm's operator user (`swarmrl up` does)"
    )


STREAM_FIELDS = ("subjects", "storage", "retention", "duplicate_window", "num_replicas", "max_msg_size")
"""The stream settings swarmrl sets; a stream whose settings all match is left alone."""


async def _add_or_update(js: JetStreamContext, cfg: api.StreamConfig) -> None:
    assert cfg.name is not None
    try:
        have: api.StreamConfig | None = (await js.stream_info(cfg.name)).config
    except NotFoundError:
        have = None
    want = {f: getattr(cfg, f) for f in STREAM_FIELDS if getattr(cfg, f) is not None}
    if have is not None and all(getattr(have, f) == v for f, v in want.items()):
        return
    try:
        if have is None:
            await js.add_stream(cfg)
        else:  # exists with another config: bring it to ours
            await js.update_stream(cfg)
    except nats.errors.TimeoutError as exc:  # what a request the server refuses for permissions becomes
        raise _not_allowed(cfg.name, "is missing" if have is None else "differs from this version's") from exc


async def models_kv(js: JetStreamContext) -> KeyValue:
    try:
        return await js.key_value(S.MODELS_BUCKET)
    except NotFoundError as exc:  # nats.py raises BucketNotFoundError (a NotFoundError)
        raise RuntimeError(f"KV bucket {S.MODELS_BUCKET!r} missing; is the swarm set up?") from exc


@dataclass
class DeadLetters:
    """Publishes bad input to `swarm.dlq.<service>` with the original bytes and the reason; counts it.

    A dead letter never fails for size: one too large for the DLQ keeps a prefix of the original
    plus its size and digest (`DEAD_LETTER_MAX_BYTES`).
    """

    nc: NATS
    """The connection: its JetStream publishes the dead letters, its `max_payload` bounds them."""
    service: str
    counts: Counter[str] = field(default_factory=Counter)

    async def send(
        self, msg: Msg | None, reason: str, *, data: bytes | None = None, subject: str = ""
    ) -> None:
        code = reason.split(":", 1)[0]
        # an EPISODE_PARTS message under the EPISODES subject its agent published to
        subject = S.unpartitioned(subject or (msg.subject if msg is not None else ""))
        payload = data if data is not None else (msg.data if msg is not None else b"")
        headers = {REASON_HEADER: reason[:4000], SUBJECT_HEADER: subject, SERVICE_HEADER: self.service}
        if msg is not None and (msg.reply or "").startswith("$JS.ACK."):
            # Idempotent like every publish: a message dead-lettered again after a crash (its ack lost)
            # is de-duplicated by its stream position.
            stream, seq = source_position(msg)  # a partition's message by its EPISODES position
            headers["Nats-Msg-Id"] = f"dlq.{self.service}.{stream}.{seq}"
        payload = self._fit(payload, headers)
        log.warning("dead-letter service=%s subject=%s reason=%s", self.service, subject, reason[:300])
        await self.nc.jetstream().publish(S.dlq_subject(self.service), payload, headers=headers)
        self.counts[code] += 1  # after the publish: a caller retrying a failed send counts it once

    def _fit(self, payload: bytes, headers: dict[str, str]) -> bytes:
        """`payload`, or its prefix (with size and digest added to `headers`) if it would not fit."""
        limit = min(DEAD_LETTER_MAX_BYTES, self.nc.max_payload)  # what the server accepts
        if len(payload) + _headers_size(headers) + 200 <= limit:  # 200: the two headers below
            return payload
        headers[ORIGINAL_SIZE_HEADER] = str(len(payload))
        headers[ORIGINAL_SHA256_HEADER] = hashlib.sha256(payload).hexdigest()
        return payload[:DEAD_LETTER_KEEP_BYTES]


def _headers_size(headers: dict[str, str]) -> int:
    """Bytes of the NATS header block: `NATS/1.0\\r\\n`, `key: value\\r\\n` each, a blank line."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


async def drop_poison(msgs: list[Msg], dead_letters: DeadLetters) -> list[Msg]:
    """`msgs` less those delivered more than `MAX_DELIVERIES` times, each dead-lettered as `poison` and
    acked; one the DLQ does not take now stays unacked (it comes back after the ack wait) and is not
    handed on either."""
    kept = []
    for msg in msgs:
        delivered = msg.metadata.num_delivered or 0
        if delivered <= MAX_DELIVERIES:
            kept.append(msg)
            continue
        reason = f"poison: delivered {delivered} times (more than {MAX_DELIVERIES})"
        try:
            await dead_letters.send(msg, f"{reason}; it may crash its consumer")
            await msg.ack()
        except (nats.errors.Error, OSError) as exc:  # the broker is away: it returns after its ack wait
            log.warning("subject=%s could not dead-letter a poison message: %r", msg.subject, exc)
    return kept


async def durable_pull(
    js: JetStreamContext,
    stream: str,
    durable: str,
    subject: str | list[str] = ">",
    *,
    ack_wait_s: float = 60.0,
    max_ack_pending: int = 50_000,
    max_deliver: int = -1,
    start_seq: int = 0,
    ack_policy: api.AckPolicy = api.AckPolicy.EXPLICIT,
    pending_bytes_limit: int = 256 * 1024 * 1024,
) -> JetStreamContext.PullSubscription:
    """Bind to (creating if needed) a durable pull consumer; a restarted service resumes from its ack floor.

    `start_seq` > 0: a newly created consumer starts at that stream sequence (an existing one keeps its
    position). `AckPolicy.ALL`: one ack covers every earlier message, for a consumer that handles them
    strictly in order. `pending_bytes_limit`: nats-py drops what arrives beyond it as a slow consumer
    (0: no limit). Several subjects make one consumer that delivers them in stream order.
    """
    subjects = [subject] if isinstance(subject, str) else subject
    cfg = api.ConsumerConfig(
        durable_name=durable, ack_policy=ack_policy, ack_wait=ack_wait_s, max_ack_pending=max_ack_pending,
        max_deliver=max_deliver, opt_start_seq=start_seq if start_seq > 0 else None,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if start_seq > 0 else api.DeliverPolicy.ALL,
        filter_subject=subjects[0] if len(subjects) == 1 and subjects[0] != ">" else None,
        filter_subjects=subjects if len(subjects) > 1 else None,
    )  # fmt: skip
    return await js.pull_subscribe(
        subjects[0], durable=durable, stream=stream, config=cfg, pending_bytes_limit=pending_bytes_limit
    )


async def resume_durable(
    js: JetStreamContext, stream: str, durable: str, seq: int, where: object, **options: Any
) -> JetStreamContext.PullSubscription:
    """`durable_pull` on `stream` from right after `seq`, where the service's own record `where` says it
    got to (that record, not the consumer's position, is the truth: the old consumer is deleted first),
    with cumulative acks (`AckPolicy.ALL`); `options`: `durable_pull`'s. A `seq` past the stream's end
    is from another life of the stream, which resuming would mix in: refused."""
    last = (await js.stream_info(stream)).state.last_seq
    if seq > last:
        raise RuntimeError(
            f"{where} holds {stream} messages up to seq {seq}, but the stream ends at seq {last}: it was "
            "recreated; give this run a fresh --run-dir"
        )
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(stream, durable)
    return await durable_pull(js, stream, durable, start_seq=seq + 1, ack_policy=api.AckPolicy.ALL, **options)


async def batches(
    sub: JetStreamContext.PullSubscription,
    stop: asyncio.Event,
    batch: int = 256,
    timeout: float = 0.5,
    *,
    dead_letters: DeadLetters | None,
    drain_s: float = 0.0,
) -> AsyncIterator[list[Msg]]:
    """Yield fetched batches until `stop` is set; an empty fetch yields [] so callers can flush on time.

    Poison messages are dead-lettered instead of yielded (`drop_poison`), unless `dead_letters` is
    None: for a cumulative-ack consumer (`AckPolicy.ALL`), where acking one would ack the batch before
    it. `drain_s`: once `stop` is set, go on for up to this long until a batch comes back short.
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    while True:
        if stop.is_set():
            deadline = loop.time() + drain_s if deadline is None else deadline
            if loop.time() >= deadline:
                return
        try:
            msgs = await sub.fetch(batch, timeout=timeout)
        except TimeoutError:  # nats.errors.TimeoutError, or the plain one nats.py raises as a fetch expires
            msgs = []
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
            if stop.is_set():
                return
            await asyncio.sleep(0.2)
            continue
        except ServiceUnavailableError:
            # 503 to a pull request: the consumer's leader is gone (a cluster node died) and its
            # replicas have not elected another yet; the consumer and its messages are safe.
            await asyncio.sleep(0.5)
            continue
        yield msgs if dead_letters is None else await drop_poison(msgs, dead_letters)
        if deadline is not None and len(msgs) < batch:
            return
