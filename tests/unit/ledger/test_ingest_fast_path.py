"""The ledger's fast decode path (`schemas.fastcodec`, msgspec) reaches the codec's verdict on every
input: the same record for a good message, the same reason for a bad one."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from swarmrl.schemas import ActionResult, Event, MergeStats, Sample, TrainStep, decode, decode_event, encode
from swarmrl.schemas import subjects as S
from swarmrl.schemas.fastcodec import FastDecoder, fields
from swarmrl.services.common.lifecycle import check_subject, episode_of
from swarmrl.services.ledger.ingest import Ingest
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
    # where msgspec alone is more lenient than the codec, or stricter than pydantic's lax mode
    ("no version", BEGIN_SUBJECT, _pack({k: v for k, v in BEGIN_MAP.items() if k != "v"})),
    ("newline after a token", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "episode_id": "e1\n"})),
    ("newline in models", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "models": ["policy\n"]})),
    ("int key deep", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"a": {1: "x"}}})),
    ("timestamp ext", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"t": msgpack.Timestamp(1, 0)}})),
    ("bin in messages", LLM_SUBJECT, _pack({**LLM_MAP, "messages": [{"content": b"x"}]})),
    ("bin in a list", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"a": [1, "x", b"y"]}})),
    ("lax int from float", LLM_SUBJECT, _pack({**LLM_MAP, "seq": 3.0})),
    ("lax int from bool", LLM_SUBJECT, _pack({**LLM_MAP, "policy_version": True})),
    ("lax bool from int", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "eval": 1})),
    ("int token in floats", LLM_SUBJECT, _pack({**LLM_MAP, "output_logprobs": [-1, 0, 0]})),
    ("inf ts", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "ts": math.inf})),
    ("lengths differ", LLM_SUBJECT, _pack({**LLM_MAP, "output_logprobs": [0.0]})),
    ("huge logprobs", LLM_SUBJECT, _pack({**LLM_MAP, "output_logprobs": [1e308, 1e308, 0.0]})),
    ("negative seq", LLM_SUBJECT, _pack({**LLM_MAP, "seq": -1})),
    ("empty client", LLM_SUBJECT, _pack({**LLM_MAP, "client_id": ""})),
    ("unknown kind", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "kind": "nope"})),
    ("no kind", BEGIN_SUBJECT, _pack({k: v for k, v in BEGIN_MAP.items() if k != "kind"})),
    ("nan in free-form", BEGIN_SUBJECT, _pack({**BEGIN_MAP, "task": {"x": math.nan}})),
    ("duplicate key", BEGIN_SUBJECT, b"\x82\xa1v\x01\xa1v\x02" + _pack(BEGIN_MAP)[1:]),
    ("no ts", BEGIN_SUBJECT, _pack({k: v for k, v in BEGIN_MAP.items() if k != "ts"})),
]


@pytest.mark.parametrize(("subject", "data"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_episode_events_get_the_codecs_verdict(subject: str, data: bytes) -> None:
    ingest = Ingest()
    if not subject.endswith(".begin"):  # the ordering state must accept a good one
        ingest.episode(BEGIN_SUBJECT, encode(BEGIN), "EPISODES", 1, 0.0)
    got = _outcome(lambda: ingest.episode(subject, data, "EPISODES", 7, 0.0))
    assert got == _outcome(lambda: _reference_episode(subject, data, 7))


def test_fast_path_takes_good_records_with_the_models_values() -> None:
    """Not only a fallback: good records of every kind are decoded here, to the model's own fields."""
    fast = FastDecoder.for_model(Event)
    assert fast is not None
    for ev in episode("e1"):
        record = fast.decode(encode(ev))
        assert record is not None and record.kind == ev.kind
        assert fields(record) == ev.__dict__
    for data in (
        _pack({**BEGIN_MAP, "task_id": b""}),
        _pack({**BEGIN_MAP, "v": 1.0}),
        _pack({**BEGIN_MAP, "seq": 3.0}),
        _pack([BEGIN_MAP]),
        b"\xc1",
    ):
        assert fast.decode(data) is None


def _mutations(base: dict, rng: random.Random) -> Any:
    """Random edits of a good map: each field replaced by a value of another type, dropped, or
    nested; a few new keys. The values are the kinds the codec and pydantic tell apart."""
    values = [
        0, 1, -1, 2**63, -(2**63), 2**64 - 1, 1.0, 0.5, math.nan, math.inf, True, False, None, "",
        "x", "a\n", "é" * 300, b"", b"x", [], [1], [1.5], ["x"], [None], [[1]], {}, {"a": 1}, {"a": b""},
        {"a": {"b": [1, {"c": math.nan}]}}, msgpack.ExtType(3, b"z"), "3", "1e3",
    ]  # fmt: skip
    keys = list(base)
    while True:
        obj = dict(base)
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(keys)
            roll = rng.random()
            if roll < 0.7:
                obj[key] = rng.choice(values)
            elif roll < 0.8:
                obj.pop(key, None)
            elif roll < 0.9 and isinstance(obj.get(key), list) and obj[key]:
                obj[key] = [*obj[key][:-1], rng.choice(values)]  # one bad element at the end
            else:
                obj[rng.choice(["extra", "kind", "v"])] = rng.choice(values)
        yield obj


@pytest.mark.parametrize("which", ["llm", "begin"])
def test_random_edits_get_the_codecs_verdict(which: str) -> None:
    """Hundreds of seeded random edits of a good event: the fast path never accepts what the codec
    refuses, and where both accept, the rows are equal."""
    base, subject = (LLM_MAP, LLM_SUBJECT) if which == "llm" else (BEGIN_MAP, BEGIN_SUBJECT)
    rng = random.Random(7)
    fast = FastDecoder.for_model(Event)
    assert fast is not None
    taken = 0
    for _, obj in zip(range(600), _mutations(base, rng), strict=False):
        data = _pack(obj)
        ingest = Ingest()
        if which == "llm":
            ingest.episode(BEGIN_SUBJECT, encode(BEGIN), "EPISODES", 1, 0.0)
        got = _outcome(lambda data=data, ingest=ingest: ingest.episode(subject, data, "EPISODES", 7, 0.0))
        assert got == _outcome(lambda data=data: _reference_episode(subject, data, 7)), obj
        taken += fast.decode(data) is not None
    assert taken > 20  # the edits that stay valid (another good value) do take the fast path


def test_every_ledger_record_has_a_fast_path() -> None:
    for model in (Event, Sample, TrainStep, MergeStats, ActionResult):
        assert FastDecoder.for_model(model) is not None, model


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
