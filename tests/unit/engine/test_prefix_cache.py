"""The embedded engine's prefix cache: the store on its own, then the engine reusing it (real tiny model)."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.prefix_cache import BLOCK, PrefixCache
from tests.unit.engine.helpers import params, reference_logprobs, wait_until


def _kv(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake KV whose every entry is its token id, so a slice shows which tokens it came from."""
    t = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(2, -1, 4).contiguous()
    return [(t.clone(), -t.clone()) for _ in range(layers)]


def test_lookup_finds_the_longest_cached_prefix_token_by_token() -> None:
    cache = PrefixCache(1 << 20)
    a = list(range(100, 150))
    cache.insert(a, lambda: _kv(a))
    n, kv = cache.lookup([*a[:37], 7, 8, 9])  # diverges inside the third block
    assert n == 37 and torch.equal(kv[0][0][0, :, 0], torch.tensor(a[:37], dtype=torch.float32))
    assert cache.lookup([*a, 1, 2])[0] == len(a)
    assert cache.lookup(a, limit=20)[0] == 20  # never past the limit
    assert cache.lookup([1, *a])[0] == 0  # a prefix, not a substring
    assert cache.lookup(a[: BLOCK - 1])[0] == 0  # shorter than a block: nothing to hash
    assert cache.lookup(a, adapter="red")[0] == 0  # another adapter's KV is another KV
    st = cache.stats()
    assert st["hit_tokens"] == 37 + 50 + 20 and st["lookups"] == 6


def test_an_extension_replaces_its_prefix_and_the_budget_evicts_least_recent() -> None:
    a = list(range(64))
    one = sum(k.nbytes + v.nbytes for k, v in _kv(a))
    cache = PrefixCache(3 * one)
    cache.insert(a, lambda: _kv(a))
    cache.insert(a, lambda: _kv(a))  # all of it is cached already
    assert len(cache) == 1
    longer = [*a, 1, 2, 3]
    cache.insert(longer, lambda: _kv(longer))  # a's entry is a prefix of it: replaced
    assert len(cache) == 1 and cache.lookup([*longer, 5])[0] == len(longer)
    others = [[1000 * i + j for j in range(64)] for i in range(1, 4)]
    for seq in others:
        cache.insert(seq, lambda s=seq: _kv(s))
    assert cache.nbytes <= 3 * one
    assert cache.lookup(longer)[0] == 0  # the least recently used went first
    assert all(cache.lookup(seq)[0] == 64 for seq in others)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.lookup(others[0])[0] == 0
    off = PrefixCache(0)
    off.insert(a, lambda: _kv(a))
    assert len(off) == 0


def test_cached_prefixes_give_the_same_tokens_and_logprobs(tiny_model_dir: Path) -> None:
    """A second turn (the first turn's prompt and reply plus new tokens) and a group's siblings
    reuse cached KV, and every logprob still equals one plain forward's over prompt + output."""
    core = EngineCore(tiny_model_dir, max_batch=8)
    try:
        system = [(7 * i) % 500 + 3 for i in range(70)]
        greedy = params(core, temperature=0, max_new_tokens=12, ignore_eos=True)
        first = core.submit([*system, 11, 12], greedy).result(30)
        assert first.cached_tokens == 0
        turn2 = [*system, 11, 12, *first.output_ids, 40, 41, 42]
        siblings = [[*system, 11, 12], [*system, 13]]
        outs = [core.submit(p, greedy).result(30) for p in [turn2, *siblings]]
        assert outs[0].cached_tokens == len(system) + 2 + len(first.output_ids) - 1  # the last was never fed
        assert outs[1].cached_tokens == len(system) + 1  # all but the last prompt token
        assert outs[2].cached_tokens == len(system)
        assert outs[1].output_ids == first.output_ids
        for prompt, out in zip([turn2, *siblings], outs, strict=True):
            ref = reference_logprobs(core, prompt, out.output_ids, 0.0)
            torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=1e-4)
        sampled = params(core, temperature=1.0, max_new_tokens=10, ignore_eos=True, seed=5)
        # one prefill of rows with and without a cached prefix (a miss is all padding in the past)
        prompts = [[*system, 20 + i] for i in range(5)] + [list(range(600, 640)), [600, 601]]
        batch = [core.submit(p, sampled) for p in prompts]
        outs = [fut.result(30) for fut in batch]
        assert [o.cached_tokens for o in outs] == [len(system)] * 5 + [0, 0]
        for prompt, out in zip(prompts, outs, strict=True):
            ref = reference_logprobs(core, prompt, out.output_ids, 1.0)
            torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=1e-4)
        # input logprobs need the logits of their positions: never served from the cache
        scored = core.submit(turn2, greedy, logprob_start_len=len(system)).result(30)
        assert scored.cached_tokens <= len(system) and len(scored.input_logprobs) == len(turn2) - len(system)
        assert core.stats()["prefix_cache"]["hit_tokens"] > 0
    finally:
        core.close()


def test_rows_admitted_together_compute_what_they_share_once(tiny_model_dir: Path) -> None:
    """One admission of a group's four equal prompts, three other questions on the same system
    prompt and an unrelated prompt: the shared tokens are computed once (waves), and the long rows
    do not pad the short ones (buckets); every logprob still equals one plain forward's."""
    core = EngineCore(tiny_model_dir, max_batch=16)
    try:
        system = [(7 * i) % 500 + 3 for i in range(70)]
        group = [*system, 11, 12, 13]
        others = [[*system, 40 + i, 41] for i in range(3)]
        lone = list(range(600, 610))
        prompts = [group] * 4 + others + [lone]
        running = core.submit([5, 6, 7], params(core, max_new_tokens=60, ignore_eos=True))
        wait_until(lambda: core.stats()["running"] == 1, what="a running request")
        done: list[tuple[bool, str]] = []
        reload = threading.Thread(
            target=lambda: done.append(core.update_weights_from_disk(str(tiny_model_dir)))
        )
        reload.start()  # the rows queued behind a reload are admitted together once it is applied
        wait_until(lambda: done or core.stats()["reload_pending"], what="the reload to wait for the batch")
        before = core.stats()["prefill"]
        sampled = params(core, temperature=1.0, max_new_tokens=6, ignore_eos=True, seed=3)
        outs = [f.result(30) for f in [core.submit(p, sampled) for p in prompts]]
        reload.join(30)
        running.result(30)
        assert done and done[0][0], done
        n = len(group)
        assert [o.cached_tokens for o in outs] == [0, n - 1, n - 1, n - 1, *[len(system)] * 3, 0]
        after = core.stats()["prefill"]
        assert after["tokens"] - before["tokens"] == n + 3 * 1 + 3 * 2 + len(lone)
        # only the three one-token rows pad, by one each, next to the two-token ones
        assert after["padded_tokens"] - before["padded_tokens"] == after["tokens"] - before["tokens"] + 3
        for prompt, out in zip(prompts, outs, strict=True):
            ref = reference_logprobs(core, prompt, out.output_ids, 1.0)
            torch.testing.assert_close(torch.tensor(out.output_logprobs), ref, atol=1e-4, rtol=1e-4)
    finally:
        core.close()


def test_new_weights_and_flushes_clear_the_cache(tiny_model_dir: Path, other_weights_dir: Path) -> None:
    core = EngineCore(tiny_model_dir, max_batch=4)
    try:
        prompt = list(range(3, 60))
        greedy = params(core, temperature=0, max_new_tokens=6, ignore_eos=True)
        core.submit(prompt, greedy).result(30)
        assert core.submit(prompt, greedy).result(30).cached_tokens == len(prompt) - 1
        done: list[tuple[bool, str]] = []
        reload = threading.Thread(
            target=lambda: done.append(core.update_weights_from_disk(str(other_weights_dir)))
        )
        reload.start()
        reload.join(30)
        assert done and done[0][0], done
        new = core.submit(prompt, greedy).result(30)
        assert new.cached_tokens == 0  # computed by the new weights, not read from the old ones
        ref = reference_logprobs(core, prompt, new.output_ids, 0.0)
        torch.testing.assert_close(torch.tensor(new.output_logprobs), ref, atol=1e-4, rtol=1e-4)
        core.flush_cache()
        wait_until(lambda: core.stats()["prefix_cache"]["entries"] == 0, what="the flush")
        assert core.submit(prompt, greedy).result(30).cached_tokens == 0
    finally:
        core.close()


def test_turned_off_it_caches_nothing(tiny_model_dir: Path) -> None:
    core = EngineCore(tiny_model_dir, prefix_cache_mib=0)
    try:
        prompt = list(range(3, 60))
        greedy = params(core, temperature=0, max_new_tokens=4)
        core.submit(prompt, greedy).result(30)
        assert core.submit(prompt, greedy).result(30).cached_tokens == 0
        assert core.stats()["prefix_cache"]["entries"] == 0
    finally:
        core.close()
