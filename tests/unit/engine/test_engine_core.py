"""The embedded engine against the real tiny model: batching, logprobs, stopping, weight reloads."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest
import torch

from swarmrl.services.engine.engine_core import EngineCore
from tests.unit.engine.helpers import params, reference_logprobs, wait_until

PROMPTS = [[5, 17, 33, 90, 4], [200, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19], [640]]


def test_single_and_batch_generate(engine: EngineCore) -> None:
    one = engine.submit(PROMPTS[0], params(engine, max_new_tokens=6, temperature=0)).result(30)
    assert len(one.output_ids) == len(one.output_logprobs) == 6
    assert one.finish_reason == {"type": "length", "length": 6} and one.prompt_tokens == 5
    assert one.weight_version == engine.weight_version and isinstance(one.text, str)
    futures = [engine.submit(p, params(engine, max_new_tokens=3 + i)) for i, p in enumerate(PROMPTS)]
    outs = [f.result(30) for f in futures]
    assert [len(o.output_ids) for o in outs] == [3, 4, 5, 6]
    assert [o.prompt_tokens for o in outs] == [len(p) for p in PROMPTS]
    assert all(all(lp <= 0.0 for lp in o.output_logprobs) for o in outs)


def test_concurrent_requests_share_decode_steps(engine: EngineCore) -> None:
    before = engine.stats()["decode_steps"]
    futures = [engine.submit(p, params(engine, max_new_tokens=12, ignore_eos=True)) for p in PROMPTS * 2]
    outs = [f.result(30) for f in futures]
    assert all(len(o.output_ids) == 12 for o in outs)
    assert engine.stats()["max_batch_seen"] > 1
    # 8 requests x 12 tokens in far fewer than 96 steps: they decoded together
    assert engine.stats()["decode_steps"] - before < 48


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_a_plain_forward_pass(engine: EngineCore, temperature: float) -> None:
    """Rows join a running batch at different times (left padding, cache joins and cuts), yet every
    logprob equals log_softmax(logits / T) of one unbatched forward over prompt + output."""
    sp = dict(temperature=temperature, top_p=0.9, max_new_tokens=16, ignore_eos=True, seed=3)
    first = engine.submit([9] * 20, params(engine, **{**sp, "max_new_tokens": 24}))
    steps = engine.stats()["decode_steps"]
    wait_until(lambda: engine.stats()["decode_steps"] >= steps + 3, what="the first request to decode")
    later = [engine.submit(p, params(engine, **sp)) for p in PROMPTS]
    for prompt, fut in zip([[9] * 20, *PROMPTS], [first, *later], strict=True):
        out = fut.result(30)
        ref = reference_logprobs(engine, prompt, out.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=1e-4)
        if temperature == 0.0:  # greedy tokens are the argmax of the same forward
            with torch.no_grad():
                logits = engine.model(input_ids=torch.tensor([prompt + out.output_ids])).logits[0]
            assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == out.output_ids


def test_greedy_and_seeded_generation_repeat(engine: EngineCore) -> None:
    for sp in (dict(temperature=0), dict(temperature=1.0, seed=11)):
        a = engine.submit(PROMPTS[2], params(engine, max_new_tokens=10, ignore_eos=True, **sp)).result(30)
        b = engine.submit(PROMPTS[2], params(engine, max_new_tokens=10, ignore_eos=True, **sp)).result(30)
        assert a.output_ids == b.output_ids and a.output_logprobs == pytest.approx(b.output_logprobs)


def test_stop_token_ids_end_generation_at_the_first_match(engine: EngineCore) -> None:
    base = engine.submit(
        PROMPTS[0], params(engine, temperature=0, max_new_tokens=12, ignore_eos=True)
    ).result(30)
    stop_tok = base.output_ids[4]
    first = base.output_ids.index(stop_tok)
    out = engine.submit(
        PROMPTS[0],
        params(engine, temperature=0, max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok]),
    ).result(30)
    assert out.finish_reason == {"type": "stop", "matched": stop_tok}
    assert out.output_ids == base.output_ids[: first + 1]  # the stop token is returned, with its logprob
    assert len(out.output_logprobs) == first + 1


def test_stop_strings_trim_the_text(engine: EngineCore) -> None:
    sp = dict(temperature=0, max_new_tokens=20, ignore_eos=True)
    base = engine.submit(PROMPTS[1], params(engine, **sp)).result(30)
    assert len(base.text) >= 6, base.text
    stop = base.text[3:5]
    out = engine.submit(PROMPTS[1], params(engine, **sp, stop=[stop, "never-seen-xyz"])).result(30)
    assert out.finish_reason == {"type": "stop", "matched": stop}
    assert out.text == base.text[: base.text.find(stop)]
    assert out.output_ids == base.output_ids[: len(out.output_ids)] and len(out.output_ids) < 20
    kept = engine.submit(PROMPTS[1], params(engine, **sp, stop=stop, no_stop_trim=True)).result(30)
    assert stop in kept.text


def test_max_new_tokens_and_context_limit_finish_with_length(tiny_model_dir: Path) -> None:
    core = EngineCore(tiny_model_dir, context_length=32)
    try:
        out = core.submit(list(range(10, 40)), params(core, max_new_tokens=50, ignore_eos=True)).result(30)
        assert out.finish_reason == {"type": "length", "length": 2} and len(out.output_ids) == 2
        zero = core.submit([10], params(core, max_new_tokens=0)).result(30)
        assert zero.output_ids == [] and zero.finish_reason["type"] == "length"
        with pytest.raises(ValueError, match="context length is 32"):
            core.submit(list(range(10, 42)), params(core))
    finally:
        core.close()


def test_bad_prompts_are_refused(engine: EngineCore) -> None:
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], params(engine))
    with pytest.raises(ValueError, match=rf"\[{engine.vocab_size}\] outside the vocabulary"):
        engine.submit([1, engine.vocab_size], params(engine))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([-1], params(engine))


def test_weight_reload_waits_for_the_batch_and_bumps_the_version(
    tiny_model_dir: Path, other_weights_dir: Path
) -> None:
    core = EngineCore(tiny_model_dir, weight_version="0")
    try:
        greedy = dict(temperature=0, max_new_tokens=8, ignore_eos=True)
        before = core.submit(PROMPTS[0], params(core, **greedy)).result(30)
        running = core.submit(PROMPTS[1], params(core, max_new_tokens=60, ignore_eos=True))
        wait_until(lambda: core.stats()["running"] == 1, what="a running request")
        result: list[tuple[bool, str]] = []
        reload = threading.Thread(
            target=lambda: result.append(core.update_weights_from_disk(str(other_weights_dir), "5"))
        )
        reload.start()
        wait_until(lambda: result or core.stats()["reload_pending"], what="the reload to wait for the batch")
        after = core.submit(PROMPTS[0], params(core, **greedy))  # queued behind the reload
        reload.join(30)
        assert result and result[0][0], result
        assert running.result(30).weight_version == "0"  # finished on the old weights
        new = after.result(30)
        assert new.weight_version == "5" and new.output_ids != before.output_ids
        ref = reference_logprobs(core, PROMPTS[0], new.output_ids, 0.0)
        torch.testing.assert_close(torch.tensor(new.output_logprobs), ref, atol=1e-4, rtol=1e-4)
        assert core.model_path == str(other_weights_dir)
        ok, _ = core.update_weights_from_disk(str(tiny_model_dir))  # no version given: bumped
        assert ok and core.weight_version == "6"
        again = core.submit(PROMPTS[0], params(core, **greedy)).result(30)
        assert again.output_ids == before.output_ids
    finally:
        core.close()


def test_bad_checkpoints_leave_the_weights_alone(engine: EngineCore, tmp_path: Path) -> None:
    version = engine.weight_version
    ok, message = engine.update_weights_from_disk(str(tmp_path / "missing"))
    assert not ok and "is not a directory" in message
    ok, message = engine.update_weights_from_disk(str(tmp_path))
    assert not ok and "no *.safetensors" in message
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    ok, message = engine.update_weights_from_disk(str(tmp_path))
    assert not ok and "missing" in message
    assert engine.weight_version == version


def test_close_aborts_what_is_left(tiny_model_dir: Path) -> None:
    core = EngineCore(tiny_model_dir)
    fut = core.submit([5, 6], params(core, max_new_tokens=2000, ignore_eos=True))
    wait_until(lambda: core.stats()["running"] == 1, what="a running request")
    core.close()
    assert fut.result(10).finish_reason["type"] == "abort"
    with pytest.raises(RuntimeError, match="closed"):
        core.submit([5], params(core))


def test_the_cache_goes_by_the_name_this_transformers_takes(engine: EngineCore) -> None:
    """transformers 5.x takes the KV cache as `cache` and warns that `past_key_values` goes in 5.40:
    prefill and decode pass it by the name the model's forward declares, so nothing warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.submit(PROMPTS[1], params(engine, max_new_tokens=4, ignore_eos=True)).result(30)
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
