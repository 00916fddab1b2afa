"""The ledger's fast decode path (`ingest.quick_unpack`) reaches the codec's verdict on every input:
the same record for a good message, the same reason for a bad one."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from swarmrl.schemas import MergeStats, Sample, decode, decode_event, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common.lifecycle import check_subject, episode_of
from swarmrl.services.ledger.ingest import Ingest, quick_unpack
from swarmrl.services.ledger.tables import event_row, metric_row, sample_row
from tests.unit.ledger.factories import episode

BEGIN, LLM, ENV, REWARD, END = episode("e1")
LLM_MAP = msgpack.unpackb(encode(LLM))
BEGIN_MAP = msgpack.unpackb(encode(BEGIN))


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _reference_episode(subject: str, data: bytes, seq: int) -> tuple[str, dict]:
    """The ledger's episode path before the fast path: the codec, then the row (no ordering state)."""
    episode_of(subject)
    ev = decode_event(data)
    check_subject(subject, ev)
    return event_row(ev, "EPISODES", seq)


def _outcome(fn: Callable[[], tuple[str, dict]]) -> tuple[str, Any]:
    try:
        table, row = fn()
    except Exception as exc:  # the handler dead-letters any exception (`internal: ...` if unexpected)
        return "error", repr(exc)
    return table, {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items() if k != "ts"}


MARKED_FLOAT = struct.unpack(">d", bytes.fromhex("bfe0c40000000001"))[0]  # about -0.52
LLM_SUBJECT = S.episode_subject("e1", "llm")
BEGIN_SUBJECT = S.episode_subject("e1", "begin")
CASES: list[tuple[str, str, bytes]] = [
    ("good llm", LLM_SUBJECT, encode(LLM)),
    ("good begin", BEGIN_SUBJECT, encode(BEGIN)),
    ("bin value", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task_id": b"t"})),
    ("empty bin value", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task_id": b""})),
    ("empty bin deep", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"a": [1, {"b": b""}]}})),
    ("bin key", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {b"name": "x"}})),
    ("empty bin key", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {b"": "x"}})),
    ("bin16 empty", BEGIN_SUBJECT, _pack(BEGIN_MAP)[:-1] + b"\xc5\x00\x00"),
    # the marker bytes of an empty bin inside a good message: the codec decides, and accepts it
    ("marker in a number", LLM_SUBJECT, _pack({**LLM_MAP, "prompt_ids": [0xC400, 0xC5000000]})),
    ("marker in a float", LLM_SUBJECT, _pack({**LLM_MAP, "output_logprobs": [MARKED_FLOAT, 0.0, 0.0]})),
    ("version 99", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "v": 99})),
    ("version True", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "v": True})),
    ("version list", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "v": [1]})),  # the codec's TypeError, as before
    ("not a map", BEGIN_SUBJECT, _pack([1, 2])),
    ("not msgpack", BEGIN_SUBJECT, b"\xc1"),
    ("truncated", LLM_SUBJECT, encode(LLM)[:-3]),
    ("trailing bytes", LLM_SUBJECT, encode(LLM) + b"\x00"),
    ("ext type", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"x": msgpack.ExtType(5, b"ab")}})),
    ("schema", BEGIN_SUBJECT, _pack({"v": 1, "kind": "begin"})),
    ("lax int from str", LLM_SUBJECT, _pack({**LLM_MAP, "seq": "3"})),
    ("nan logprob", LLM_SUBJECT, _pack({**LLM_MAP, "output_logprobs": [math.nan, 0.0, 0.0]})),
    ("uint64 token", LLM_SUBJECT, _pack({**LLM_MAP, "output_ids": [1, 2**64 - 1, 3]})),
    ("int64 min token", LLM_SUBJECT, _pack({**LLM_MAP, "output_ids": [1, -(2**63), 3]})),
    ("big str int token", LLM_SUBJECT, _pack({**LLM_MAP, "prompt_ids": [str(2**70)]})),
    ("subject mismatch", BEGIN_SUBJECT, encode(LLM)),
    ("not owner", "swarm.ep.mallory.e1.begin", encode(BEGIN)),
    ("no episode subject", "swarm.ep.e1.begin", encode(BEGIN)),
    ("unknown field", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "extra": 1})),
]


@pytest.mark.parametrize(("subject", "data"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_episode_events_get_the_codecs_verdict(subject: str, data: bytes) -> None:
    ingest = Ingest()
    if not subject.endswith(".begin"):  # the ordering state must accept a good one
        ingest.episode(BEGIN_SUBJECT, encode(BEGIN), "EPISODES", 1, 0.0)
    got = _outcome(lambda: ingest.episode(subject, data, "EPISODES", 7, 0.0))
    assert got == _outcome(lambda: _reference_episode(subject, data, 7))


def test_only_certain_maps_take_the_fast_path() -> None:
    assert quick_unpack(encode(LLM)) == LLM_MAP
    for data in (
        _pack({**BEGIN_MAP, "task_id": b""}),
        _pack({**BEGIN_MAP, "task_id": b"x"}),
        _pack({**BEGIN_MAP, "v": 1.0}),
        _pack([BEGIN_MAP]),
        b"\xc1",
    ):
        assert quick_unpack(data) is None


def test_samples_and_metrics_get_the_codecs_verdict() -> None:
    sample = Sample(
        sample_id="e1.solver.policy.0", model="policy", episode_id="e1", agent="solver", task_id="t",
        group_key="t", token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.5], policy_versions=[-1, 3],
        reward=1.0,
    )  # fmt: skip
    smap = msgpack.unpackb(encode(sample))
    ingest = Ingest()
    subject = S.samples_subject("policy")
    for data in (encode(sample), _pack({**smap, "agent": b"solver"}), _pack({**smap, "agent": b""})):
        got = _outcome(lambda data=data: ingest.sample(subject, data, "SAMPLES", 3))
        want = _outcome(lambda data=data: ("samples", sample_row(decode(data, Sample), "SAMPLES", 3)))
        assert got == want
    merge = MergeStats(episode_id="e1", status="empty")
    mmap = msgpack.unpackb(encode(merge))
    for data in (encode(merge), _pack({**mmap, "reason": b""})):
        got = _outcome(lambda data=data: ingest.metric(S.MERGE_METRICS_SUBJECT, data, "METRICS", 4))
        want = _outcome(lambda data=data: metric_row(decode(data, MergeStats), "METRICS", 4))
        assert got == want
