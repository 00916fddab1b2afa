"""Every float field of every record is finite: NaN and ±inf from the wire are `schema` errors that
name the field, and no service can build a record holding one."""

import math

import msgpack
import pytest
from pydantic import BaseModel, ValidationError

from swarmrl.schemas import (
    BeginEvent,
    EndEvent,
    EvalResult,
    LlmEvent,
    MergeStats,
    ModelVersion,
    RewardEvent,
    Sample,
    TrainStep,
    WireError,
    decode,
    decode_event,
    encode,
)
from tests.unit.trainer.samples import make_sample

NAN, INF = math.nan, math.inf
LLM = LlmEvent(
    episode_id="e1", seq=0, client_id="gateway-x", call_id="c", agent="a", model="policy",
    prompt_ids=[1, 2], output_ids=[3, 4, 5, 6], output_logprobs=[-0.1, -0.2, -0.3, -0.4], policy_version=0,
)  # fmt: skip
TRAIN = TrainStep(
    model="policy", step=1, policy_version=1, loss=0.1, reward_mean=0.5, reward_std=0.1, samples=8,
    tokens=100, trained_tokens=50, tokens_per_s=10.0, staleness_mean=0.0, staleness_max=0, wall_s=1.0,
    extra={"clip_frac": 0.1},
)  # fmt: skip

# (a valid record, a change to its wire map, the field the error must name)
CASES = [
    # episode events (agents and the gateway)
    (LLM, {"output_logprobs": [-0.1, -0.2, -0.3, NAN]}, "llm.output_logprobs.3"),
    (RewardEvent(episode_id="e1", seq=1, client_id="c", value=1.0), {"value": -INF}, "reward.value"),
    (EndEvent(episode_id="e1", seq=2, client_id="c"), {"metrics": {"turns": 2.0, "score": INF}}, "end.metrics.score"),
    (BeginEvent(episode_id="e1", seq=0, client_id="c", task_id="t"), {"ts": NAN}, "begin.ts"),
    # samples (merger -> trainer)
    (make_sample("e1", 1.0), {"logprobs": [0.0] * 4 + [-1.0, NAN, -1.0, -1.0]}, "logprobs.5"),
    (make_sample("e1", 1.0), {"reward": INF}, "reward"),
    # metrics and versions
    (TRAIN, {"loss": NAN}, "loss"),
    (TRAIN, {"extra": {"clip_frac": 0.1, "grad_norm": INF}}, "extra.grad_norm"),
    (EvalResult(model="policy", step=1, task="t", success_rate=0.5, n=4), {"success_rate": NAN}, "success_rate"),
    (MergeStats(episode_id="e1", status="merged"), {"ts": -INF}, "ts"),
    (ModelVersion(version=1, path="/p"), {"updated_at": NAN}, "updated_at"),
]  # fmt: skip


def _decode(record: BaseModel, data: bytes) -> BaseModel:
    if isinstance(record, (BeginEvent, LlmEvent, RewardEvent, EndEvent)):
        return decode_event(data)
    return decode(data, type(record))


@pytest.mark.parametrize(("record", "change", "field"), CASES, ids=[c[2] for c in CASES])
def test_a_nonfinite_float_from_the_wire_is_a_schema_error_naming_the_field(
    record: BaseModel, change: dict, field: str
) -> None:
    assert _decode(record, encode(record)) == record  # the record as it was is fine
    raw = msgpack.unpackb(encode(record)) | change
    with pytest.raises(WireError) as err:
        _decode(record, msgpack.packb(raw))
    assert err.value.code == "schema"
    assert f"{field}: Input should be a finite number" in str(err.value), str(err.value)


@pytest.mark.parametrize(("record", "change", "field"), CASES, ids=[c[2] for c in CASES])
def test_no_service_can_build_a_record_holding_one(record: BaseModel, change: dict, field: str) -> None:
    with pytest.raises(ValidationError, match="finite number"):
        type(record).model_validate(record.model_dump() | change)


def test_float32_and_text_spellings_are_refused_too() -> None:
    raw = msgpack.unpackb(encode(LLM))
    # A JavaScript encoder may send float32; a lenient one may send the text "Infinity" or "1e999".
    single = msgpack.packb(raw | {"output_logprobs": [-0.1, NAN, -0.3, -0.4]}, use_single_float=True)
    with pytest.raises(WireError, match=r"llm\.output_logprobs\.1: Input should be a finite number"):
        decode_event(single)
    for text in ("Infinity", "-inf", "NaN", "1e999"):
        with pytest.raises(WireError, match=r"llm\.output_logprobs\.0: Input should be a finite number"):
            decode_event(msgpack.packb(raw | {"output_logprobs": [text, -0.2, -0.3, -0.4]}))


def test_extreme_finite_values_still_pass() -> None:
    extremes = [-1.7976931348623157e308, -5e-324, -0.0, 0.0]
    ev = decode_event(msgpack.packb(msgpack.unpackb(encode(LLM)) | {"output_logprobs": extremes}))
    assert isinstance(ev, LlmEvent) and ev.output_logprobs == extremes
    sample = decode(encode(make_sample("e1", 1.7976931348623157e308)), Sample)
    assert sample.reward == 1.7976931348623157e308
