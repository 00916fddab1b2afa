"""`KVBatch` over `RoomyLayer` caches against transformers' own `DynamicCache`: the same logits through
prefill, joins of rows of different lengths, decode steps and retirements, with decode writing in place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import Cache

from swarmrl.services.engine.kv_batch import KVBatch, RoomyLayer, cache_argument, left_padded, new_cache

PROMPTS = [[5, 17, 33, 90, 4], [200, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19], [640, 3, 9]]


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@torch.inference_mode()
def _drive(model: torch.nn.Module, make: Callable[[], Cache]) -> list[torch.Tensor]:
    """Prefill two pieces, join them, decode 6 steps, retire rows 1 and 3, decode 6 more: every
    step's logits, fed greedy tokens so both caches see the same inputs only if they agree."""
    arg, batch, logits = cache_argument(model), KVBatch[int](torch.device("cpu")), []
    pieces, last = [], []
    for rows in ([0, 1], [2, 3]):
        ids, mask, positions = left_padded([PROMPTS[r] for r in rows], batch.device)
        cache = make()
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{arg: cache}
        )
        pieces.append((rows, cache, mask))
        last.append(out.logits[:, -1])
    batch.join(pieces)
    step = torch.cat(last)
    lengths = [len(p) for p in PROMPTS]
    for n in range(12):
        if n == 6:
            keep = [0, 2]
            batch.retain(keep)
            step, lengths = step[keep], [lengths[i] for i in keep]
        logits.append(step)
        token = step.argmax(-1, keepdim=True)
        positions = torch.tensor([[length + n] for length in lengths])
        out = model(
            input_ids=token,
            attention_mask=batch.grow_mask(),
            position_ids=positions,
            use_cache=True,
            **{arg: batch.cache},
        )
        step = out.logits[:, -1]
    return logits


def test_roomy_caches_give_the_logits_dynamic_caches_give(model: torch.nn.Module) -> None:
    roomy, dynamic = _drive(model, new_cache), _drive(model, DynamicCache)
    assert len(roomy) == len(dynamic) == 12
    for a, b in zip(roomy, dynamic, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_decode_step_writes_in_place_until_the_room_runs_out(model: torch.nn.Module) -> None:
    arg, cache = cache_argument(model), new_cache()
    ids, mask, positions = left_padded(PROMPTS[:2], torch.device("cpu"))
    model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{arg: cache})
    layer = cache.layers[0]
    assert isinstance(layer, RoomyLayer)
    width, storage = ids.shape[1], layer.keys.untyped_storage().data_ptr()
    moved = []
    for n in range(max(2 * RoomyLayer.ROOM, 64)):
        mask = torch.cat([mask, mask.new_ones(2, 1)], dim=1)
        model(
            input_ids=torch.tensor([[7], [8]]),
            attention_mask=mask,
            position_ids=positions[:, -1:] + n + 1,
            use_cache=True,
            **{arg: cache},
        )
        assert layer.keys.shape[2] == width + n + 1
        if layer.keys.untyped_storage().data_ptr() != storage:
            moved.append(n)
            storage = layer.keys.untyped_storage().data_ptr()
    # the prefill left ROOM spare columns: the step that needs one more copies (with ROOM more), no other does
    assert moved == [RoomyLayer.ROOM]
