"""Strings sent as msgpack `bin` are a contract violation (`schema`), wherever they are."""

import msgpack
import pytest

from swarmrl.schemas import BeginEvent, Sample, WireError, decode, decode_event, encode

BEGIN = msgpack.unpackb(encode(BeginEvent(episode_id="e1", seq=0, client_id="c", task_id="t")))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"task_id": b"t"}, "task_id"),  # validation alone would turn it into "t"
        ({"episode_id": b"e1"}, "episode_id"),
        ({"task": {"name": "x", "args": [1, {"blob": b"\x00"}]}}, "task.args.1.blob"),
        ({"agents": ["a", b"b"]}, "agents.1"),
    ],
)
def test_bin_where_a_string_is_expected_is_a_schema_error(change: dict, where: str) -> None:
    data = msgpack.packb(BEGIN | change, use_bin_type=True)
    with pytest.raises(WireError) as err:
        decode_event(data)
    assert err.value.code == "schema"
    assert str(err.value) == f"schema: {where}: msgpack bin where a string is expected (send str)"


def test_a_bin_key_is_a_schema_error() -> None:
    data = msgpack.packb({**BEGIN, "task": {b"name": "x"}}, use_bin_type=True)
    with pytest.raises(WireError, match=r"task\.b'name' \(a key\): msgpack bin"):
        decode_event(data)


def test_other_records_are_checked_too_and_plain_ones_pass() -> None:
    sample = {"v": 1, "sample_id": b"s", "model": "m", "episode_id": "e", "agent": "a", "task_id": "t",
              "group_key": "g", "token_ids": [1], "loss_mask": [1], "logprobs": [-0.5], "policy_versions": [0],
              "reward": 1.0}  # fmt: skip
    with pytest.raises(WireError, match="sample_id: msgpack bin"):
        decode(msgpack.packb(sample, use_bin_type=True), Sample)
    assert decode(msgpack.packb({**sample, "sample_id": "s"}), Sample).sample_id == "s"
    assert decode_event(msgpack.packb(BEGIN)).task_id == "t"
