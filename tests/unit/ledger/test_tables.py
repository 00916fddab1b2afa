import json

import pyarrow as pa
import pytest

from swarmrl.schemas import EvalResult, MergeStats, Sample, WireError
from swarmrl.services.ledger.columns import to_arrow
from swarmrl.services.ledger.tables import TABLES, event_row, metric_row, sample_row
from tests.unit.ledger.factories import episode, train_step


def test_begin_event_row_keeps_fields_and_position() -> None:
    begin = episode("e1")[0]
    table, row = event_row(begin, "EPISODES", 17)
    assert table == "events"
    assert (row["stream"], row["stream_seq"], row["kind"], row["seq"]) == ("EPISODES", 17, "begin", 0)
    assert json.loads(row["task"]) == {"name": "arith", "n": 3}
    assert row["models"] == ["policy"] and row["client_version"] == "v1"
    assert to_arrow("events", [row]).num_rows == 1


def test_llm_event_goes_to_llm_calls_with_exact_token_ids() -> None:
    llm = episode("e1")[1]
    table, row = event_row(llm, "EPISODES", 2)
    assert table == "llm_calls"
    arrow = to_arrow(table, [row])
    assert arrow.column("output_ids").to_pylist() == [[7, 8, 2**40]]
    assert arrow.column("output_logprobs").to_pylist() == [[-0.5, -0.25, -0.125]]
    assert (row["n_prompt"], row["n_output"]) == (3, 3)
    assert json.loads(row["messages"]) == [{"role": "user", "content": "2+2?"}]


def test_int_beyond_64_bits_is_a_schema_error_not_a_failed_flush() -> None:
    llm = episode("e1")[1].model_copy(update={"output_ids": [1, 2**64 - 1, 3]})
    with pytest.raises(WireError) as err:
        event_row(llm, "EPISODES", 2)
    assert err.value.code == "schema"


def test_token_lists_keep_the_whole_int64_range_and_refuse_beyond_it() -> None:
    edge = [-(2**63), -1, 0, 2**63 - 1]
    llm = episode("e1")[1].model_copy(update={"prompt_ids": edge, "output_logprobs": [-0.5, 0, -1e300]})
    _, row = event_row(llm, "EPISODES", 2)
    assert (row["prompt_ids"].typecode, row["prompt_ids"].tolist()) == ("q", edge)
    assert (row["output_logprobs"].typecode, row["output_logprobs"].tolist()) == ("d", [-0.5, 0.0, -1e300])
    for bad in ([-(2**63) - 1], [1, 2**63]):
        with pytest.raises(WireError, match="llm_calls.prompt_ids holds a value"):
            event_row(llm.model_copy(update={"prompt_ids": bad}), "EPISODES", 2)


def test_bytes_in_free_form_map_become_base64_json() -> None:
    begin = episode("e1")[0].model_copy(update={"task": {"blob": b"\x00\x01"}})
    _, row = event_row(begin, "EPISODES", 1)
    assert json.loads(row["task"]) == {"blob": "AAE="}


def test_sample_and_metric_rows() -> None:
    sample = Sample(
        sample_id="e1.solver.0",
        model="policy",
        episode_id="e1",
        agent="solver",
        task_id="t",
        group_key="t",
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.1, -0.2],
        policy_versions=[-1, 3, 3],
        reward=1.0,
    )
    row = sample_row(sample, "SAMPLES", 5)
    assert (row["n_tokens"], row["n_trained"]) == (3, 2)
    assert to_arrow("samples", [row]).num_rows == 1
    step = train_step(
        policy_version=2,
        loss=0.1,
        reward_mean=0.5,
        reward_std=0.1,
        samples=8,
        tokens=100,
        trained_tokens=40,
        tokens_per_s=10.0,
        staleness_mean=0.5,
        staleness_max=1,
        wall_s=2.0,
        extra={"kl": 0.01},
    )
    for record, table in [
        (step, "train_steps"),
        (EvalResult(model="p", step=1, task="arith", success_rate=0.5, n=4), "evals"),
        (MergeStats(episode_id="e1", status="merged"), "merges"),
    ]:
        name, row = metric_row(record, "METRICS", 9)
        assert name == table and to_arrow(name, [row]).num_rows == 1


def test_every_table_has_its_stream_position() -> None:
    for schema in TABLES.values():
        assert schema.field("stream").type == pa.string() and schema.field("stream_seq").type == pa.int64()
