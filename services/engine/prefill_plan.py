"""How the embedded engine splits one prefill into forwards. On the CPU a forward costs about its
tokens, pads included: `waves` lets one row compute the uncached tokens others share (a GRPO group's
prompt), the others following from the prefix cache; `buckets` groups rows of similar length.
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
    """Split rows into those to prefill now and those that wait (indices, in order): a row waits when
    an earlier one holds at least one more of its prompt's prefix-cache blocks than the cache does."""
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
    best, cut = [0] * (n + 1), [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], cut[j] = min((best[i] + forward_tokens + (j - i) * lengths[order[i]], i) for i in range(j))
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j] : j])
        j = cut[j]
    return out[::-1]
