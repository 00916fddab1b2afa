"""How the embedded engine splits one prefill into forwards (pure logic, no tensors).

Consumes: the rows admitted together (their prompts, adapters, and how much of each the prefix
cache already holds). Publishes nothing; `engine_core._prefill` runs the plan.

Two things make a single left-padded forward over all new rows wasteful on CPU, where a forward
costs about what its tokens cost, pads included:

- Rows that share uncached tokens compute them once each. The eight episodes of a GRPO group
  arrive together with the same prompt, and right after a weight update (which clears the prefix
  cache) every prompt of a task repeats the same system prompt and tool specs. `waves` lets one
  row compute what others share and the others follow in a later wave, from the prefix cache.
- Rows of very different lengths pad to the longest: a cache miss of 250 tokens next to seven
  hits of 20 makes every row compute 250. `buckets` groups rows of similar length, weighing the
  pads a merge costs against a forward's fixed cost.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from swarmrl.services.engine.prefix_cache import BLOCK, block_hashes

FORWARD_TOKENS = 16
"""A forward's fixed cost (Python, one call per layer and weight) in prompt tokens of one row: the
tiny model on 2 CPU cores takes ~3 ms for a 1-token forward and ~0.2 ms per further token."""


def waves(
    prompts: Sequence[Sequence[int]], cached: Sequence[int], adapters: Sequence[Hashable]
) -> tuple[list[int], list[int]]:
    """Split rows into those to prefill now and those that wait for them (indices, in order).

    A row waits when a row taken before it (in order) holds at least one more full block of its
    prompt than the prefix cache does (`cached[i]` tokens): once that row's KV is in the cache, the
    waiting row computes only what follows. Blocks are the prefix cache's (`BLOCK` tokens, chained
    hashes, per adapter), so what a waiting row expects is what its next lookup finds.
    """
    now: list[int] = []
    later: list[int] = []
    seen: set[tuple[Hashable, int]] = set()
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True)):
        hashes = list(block_hashes(prompt))
        first = -(-cached[i] // BLOCK)  # the first block that would add a whole block to the hit
        if first < len(hashes) and (adapter, hashes[first]) in seen:
            later.append(i)
            continue
        now.append(i)
        seen.update((adapter, h) for h in hashes)
    return now, later


def buckets(lengths: Sequence[int], forward_tokens: int = FORWARD_TOKENS) -> list[list[int]]:
    """Group rows (by index) into forwards that minimise the tokens computed, pads included, plus
    `forward_tokens` per forward. Rows are taken longest first; a forward holds a run of them."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    # best[j]: the cheapest cost of the first j rows (longest first); cut[j]: where its last forward starts
    best = [0] + [0] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], cut[j] = min((best[i] + forward_tokens + (j - i) * lengths[order[i]], i) for i in range(j))
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j] : j])
        j = cut[j]
    return out[::-1]
