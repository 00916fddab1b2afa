"""`StreamAccumulator` folds SGLang's streamed `/generate` events, cumulative (SGLang's default) or
incremental (`--incremental-streaming-output`), into the same results."""

from __future__ import annotations

from typing import Any

import pytest

from swarmrl.services.engine.client import EngineError, GenerateResult, StreamAccumulator

IDS = [10, 11, 12, 13]
LPS = [-0.5, -1.25, -0.125, -2.0]
TEXTS = ["a", "ab", "abc", "abcd"]
FINAL = {"type": "length", "length": 4}


def _meta(n: int, entries: list[list[Any]], finish: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": "r",
        "finish_reason": finish,
        "prompt_tokens": 3,
        "completion_tokens": n,
        "weight_version": "7",
        "output_token_logprobs": entries,
        "input_token_logprobs": [],
    }


def cumulative_events(chunk_at: list[int]) -> list[dict[str, Any]]:
    """Events as SGLang sends them by default, one after each count of tokens in `chunk_at`."""
    out = []
    for n in chunk_at:
        entries = [[lp, t, None] for lp, t in zip(LPS[:n], IDS[:n], strict=True)]
        finish = FINAL if n == len(IDS) else None
        out.append({"text": TEXTS[n - 1], "output_ids": IDS[:n], "meta_info": _meta(n, entries, finish)})
    return out


def incremental_events(chunk_at: list[int]) -> list[dict[str, Any]]:
    """The same with --incremental-streaming-output: text, ids and output logprobs sliced per event."""
    out, last = [], 0
    for event in cumulative_events(chunk_at):
        n = len(event["output_ids"])
        meta = {
            **event["meta_info"],
            "output_token_logprobs": event["meta_info"]["output_token_logprobs"][last:],
        }
        out.append({"text": TEXTS[n - 1][last:], "output_ids": IDS[last:n], "meta_info": meta})
        last = n
    return out


@pytest.mark.parametrize("chunk_at", [[1, 2, 3, 4], [2, 4], [1, 3, 4], [4]])
@pytest.mark.parametrize("events", [cumulative_events, incremental_events])
def test_both_stream_modes_fold_into_the_non_streamed_result(chunk_at: list[int], events) -> None:
    acc = StreamAccumulator()
    results = [acc.add(e) for e in events(chunk_at)]
    final = results[-1]
    whole = GenerateResult.from_response(cumulative_events([4])[0])
    assert final.finished and final.finish_reason == "length"
    assert (final.output_ids, final.output_logprobs, final.text) == (IDS, LPS, "abcd")
    assert (final.output_ids, final.output_logprobs, final.weight_version) == (
        whole.output_ids,
        whole.output_logprobs,
        whole.weight_version,
    )
    for n, r in zip(chunk_at[:-1], results, strict=False):
        assert not r.finished and r.finish_reason == ""
        assert (r.output_ids, r.output_logprobs, r.text) == (IDS[:n], LPS[:n], TEXTS[n - 1])


def test_without_logprobs_and_without_output_ids() -> None:
    acc = StreamAccumulator()
    event = cumulative_events([4])[0]
    no_lp = {
        **event,
        "meta_info": {k: v for k, v in event["meta_info"].items() if k != "output_token_logprobs"},
    }
    assert acc.add(no_lp).output_logprobs == []
    old = {k: v for k, v in event.items() if k != "output_ids"}  # ids named only by the logprob entries
    assert StreamAccumulator().add(old).output_ids == IDS


def test_an_error_event_raises_the_servers_message() -> None:
    with pytest.raises(EngineError) as err:
        StreamAccumulator().add({"error": {"message": "prompt too long"}})
    assert err.value.status == 400 and err.value.message == "prompt too long"
    with pytest.raises(EngineError, match="not a JSON object"):
        StreamAccumulator().add([1, 2])
