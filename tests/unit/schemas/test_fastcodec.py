"""`schemas.fastcodec`: decoders generated from the pydantic records accept good records with the
model's own values, refuse what the codec refuses, and are not made for models they cannot mirror.
(The ledger's verdict-for-verdict comparison on episode events is `tests/unit/ledger/test_ingest_fast_path.py`.)"""

from __future__ import annotations

import math
from array import array

import msgpack
import pytest
from pydantic import BaseModel, field_validator

from swarmrl.schemas import (
    ActionResult,
    EvalResult,
    MergeStats,
    Sample,
    SampleDrops,
    TrainStep,
    WireError,
    decode,
    encode,
)
from swarmrl.schemas.events import Record
from swarmrl.schemas.fastcodec import PACKED, FastDecoder, fields, model_of

RECORDS: list[BaseModel] = [
    Sample(
        sample_id="e1.solver.policy.0", model="policy", episode_id="e1", agent="solver", task_id="t",
        group_key="t", token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.5], policy_versions=[-1, 3],
        reward=1.0,
    ),
    TrainStep(
        model="policy", step=3, policy_version=4, loss=0.5, reward_mean=0.25, reward_std=0.1, samples=8,
        tokens=900, trained_tokens=300, tokens_per_s=1e3, staleness_mean=0.5, staleness_max=1, wall_s=2.0,
        extra={"kl": 0.01}, sample_ids=["a", "b"], dropped={"g": "stale"},
    ),
    EvalResult(model="policy", step=3, task="calculator", success_rate=0.75, n=40),
    SampleDrops(model="policy", step=3, dropped={"g": "stale"}),
    MergeStats(episode_id="e1", status="merged", agents=2, sample_models=["policy"]),
    MergeStats(episode_id="e2", status="empty"),  # an Optional left None
    ActionResult(
        action_id="a1", episode_id="e1", kind="python", status="ok", result={"stdout": "4\n", "n": [1, None]},
        queued_s=0.1, run_s=0.2, act_s=0.3,
    ),
]  # fmt: skip


def _codec(data: bytes, model: type[BaseModel]) -> object:
    try:
        return decode(data, model).__dict__  # type: ignore[type-var]
    except WireError as exc:
        return exc.code


def _lists(values: dict) -> dict:
    """`values` with packed arrays as lists (what the model holds)."""
    return {k: v.tolist() if isinstance(v, array) else v for k, v in values.items()}


@pytest.mark.parametrize("packed", [False, True], ids=["lists", "packed"])
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_good_records_decode_to_the_models_values(record: BaseModel, packed: bool) -> None:
    fast = FastDecoder.for_model(type(record), packed=packed)
    assert fast is not None
    got = fast.decode(encode(record))
    assert got is not None and model_of(got) is type(record)
    assert _lists(fields(got)) == record.__dict__ == fields(record)
    if isinstance(record, Sample):  # its numbers come packed when the C module is built
        kinds = {type(got.token_ids), type(got.logprobs)}
        assert kinds == ({array} if packed and PACKED else {list})
        if packed and PACKED:
            assert (got.token_ids.typecode, got.logprobs.typecode) == ("q", "d")


@pytest.mark.parametrize(
    ("record", "edit"),
    [
        (RECORDS[0], {"logprobs": [0.0, math.nan]}),  # a NaN in a list of floats
        (RECORDS[0], {"reward": math.inf}),
        (RECORDS[0], {"loss_mask": [1]}),  # the after-validator: lengths differ
        (RECORDS[1], {"extra": {"kl": math.nan}}),  # a NaN in a map of floats
        (RECORDS[1], {"step": 3.0}),  # pydantic's lax int: accepted there, not here
        (RECORDS[4], {"status": "other"}),
        (RECORDS[4], {"sample_models": ["policy", 3]}),
        (RECORDS[6], {"run_s": math.nan}),  # a NaN in an Optional float
        (RECORDS[6], {"result": {"stdout": b"4"}}),  # bin in a free-form field
        (RECORDS[6], {"result": {"n": {2: "x"}}}),  # a non-string key deep in a free-form field
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["lists", "packed"])
def test_what_the_fast_path_refuses_the_codec_decides(record: BaseModel, edit: dict, packed: bool) -> None:
    model = type(record)
    data = msgpack.packb({**msgpack.unpackb(encode(record)), **edit}, use_bin_type=True, strict_types=False)
    fast = FastDecoder.for_model(model, packed=packed)
    assert fast is not None and fast.decode(data) is None
    _codec(data, model)  # whatever the codec says stands (accepted, or a WireError code)


@pytest.mark.parametrize(
    "edit",
    [
        {"token_ids": [1, 2**63]},  # beyond int64: the codec takes it, the ledger dead-letters it
        {"token_ids": [1, 2.0]},  # pydantic's lax int
        {"token_ids": [1, True]},
        {"logprobs": [0.0, 2**53 + 1]},  # an int a float64 cannot hold exactly
        {"logprobs": [0.0, "x"]},
        {"token_ids": "12"},
    ],
)
def test_numbers_the_packed_path_refuses_go_to_the_codec(edit: dict) -> None:
    data = msgpack.packb({**msgpack.unpackb(encode(RECORDS[0])), **edit})
    fast = FastDecoder.for_model(Sample, packed=True)
    assert fast is not None and fast.decode(data) is None


def test_packed_numbers_equal_the_lists_for_every_msgpack_width() -> None:
    ids = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33, -128, -129]
    ids += [-(2**15) - 1, -(2**31) - 1, -(2**63)]
    logprobs = [0.0, -0.5, -1e-300, -3.4e38, 0, -7, -(2**53)]  # ints in a float list are floats
    record = RECORDS[0].model_copy(
        update={"token_ids": ids, "loss_mask": [1] * len(ids), "logprobs": logprobs}
    )
    record = record.model_copy(update={"policy_versions": [0] * len(ids), "logprobs": logprobs + [0.0] * 12})
    data = encode(record)
    lists = FastDecoder.for_model(Sample).decode(data)  # type: ignore[union-attr]
    packed = FastDecoder.for_model(Sample, packed=True).decode(data)  # type: ignore[union-attr]
    assert lists is not None and packed is not None
    assert _lists(fields(packed)) == fields(lists) == decode(data, Sample).__dict__
    assert [type(x) for x in packed.logprobs.tolist()] == [float] * len(ids)


def test_models_it_cannot_mirror_get_no_fast_path() -> None:
    class Checked(Record):
        name: str

        @field_validator("name")
        @classmethod
        def _upper(cls, value: str) -> str:
            return value.upper()  # a conversion msgspec cannot know about

    class Aliased(Record):
        name: str = ""
        model_config = {**Record.model_config, "populate_by_name": True}

    class Tupled(Record):
        pair: tuple[int, int] = (0, 0)

    class Stripped(Record):
        name: str = ""
        model_config = {**Record.model_config, "str_strip_whitespace": True}

    assert FastDecoder.for_model(Checked) is None
    assert FastDecoder.for_model(Tupled) is None
    assert FastDecoder.for_model(Stripped) is None
    assert FastDecoder.for_model(Aliased) is not None  # plain config changes are fine


def test_without_the_c_module_packed_numbers_stay_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmrl.schemas import fastcodec

    monkeypatch.setattr(fastcodec, "_numbers", None)  # as installed without a C compiler
    fast = FastDecoder.for_model(Sample, packed=True)
    assert fast is not None
    got = fast.decode(encode(RECORDS[0]))
    assert got is not None and type(got.token_ids) is list and fields(got) == RECORDS[0].__dict__
