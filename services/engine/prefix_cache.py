"""The embedded engine's prefix cache: KV of token sequences already computed, reused by later prompts
that share a prefix (a task's system prompt, a GRPO group's prompt, an episode's earlier turns).

Entries are indexed per adapter by the chained hash of each full block of `BLOCK` tokens (vLLM's
scheme), evicted least recently used past `capacity_bytes`, and cleared whenever weights change.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

BLOCK = 16
"""Tokens per hashed block: a lookup matches full blocks by hash, then single tokens."""

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer: keys and values of one sequence, `[kv_heads, n, head_dim]` each."""


@dataclass
class _Entry:
    eid: int
    tokens: list[int]
    kv: KV
    nbytes: int
    keys: list[tuple[str | None, int]]


class PrefixCache:
    """LRU store of (tokens, KV) entries with a block-hash index; `capacity_bytes` 0 disables it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[tuple[str | None, int], int] = {}
        self._ids = itertools.count()
        self.lookups = 0
        self.hit_tokens = 0
        """Prompt tokens served from the cache (SGLang's `cached_tokens`, summed)."""
        self.lookup_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, tokens: list[int], adapter: str | None = None, limit: int | None = None, count: bool = True
    ) -> tuple[int, KV]:
        """The longest cached prefix of `tokens` (at most `limit` tokens): its length and KV (views).
        `count=False` leaves it out of the stats (a lookup the caller repeats before using it)."""
        n, entry = self._match(tokens, adapter, len(tokens) if limit is None else limit)
        if count:
            self.record(len(tokens), n)
        return (n, [(k[:, :n], v[:, :n]) for k, v in entry.kv]) if entry is not None and n else (0, [])

    def record(self, tokens: int, hit: int) -> None:
        """Count a lookup of `tokens` prompt tokens that served `hit` of them (in `stats`)."""
        self.lookups += 1
        self.lookup_tokens += tokens
        self.hit_tokens += hit

    def insert(self, tokens: list[int], kv_of: Callable[[], KV], adapter: str | None = None) -> None:
        """Store `tokens` with their KV (`kv_of()`, called only if stored), unless an entry already holds
        them all; an entry that is a prefix of `tokens` is replaced."""
        if self.capacity_bytes <= 0 or len(tokens) < BLOCK:
            return
        n, old = self._match(tokens, adapter, len(tokens), touch=False)
        if n == len(tokens):
            return
        if old is not None and n == len(old.tokens):
            self._drop(old.eid)
        kv = kv_of()
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.capacity_bytes:
            return
        eid = next(self._ids)
        keys = [(adapter, h) for h in block_hashes(tokens)]
        self._entries[eid] = _Entry(eid, list(tokens), kv, nbytes, keys)
        for key in keys:
            self._index[key] = eid  # the newest entry holding a block answers for it
        self.nbytes += nbytes
        while self.nbytes > self.capacity_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "bytes": self.nbytes,
            "lookups": self.lookups,
            "lookup_tokens": self.lookup_tokens,
            "hit_tokens": self.hit_tokens,
        }

    def _match(
        self, tokens: list[int], adapter: str | None, limit: int, touch: bool = True
    ) -> tuple[int, _Entry | None]:
        best: int | None = None
        blocks = 0
        for i, h in enumerate(block_hashes(tokens[: limit - limit % BLOCK])):
            eid = self._index.get((adapter, h))
            if eid is None:
                break
            best, blocks = eid, i + 1
        if best is None:
            return 0, None
        entry = self._entries[best]
        n = blocks * BLOCK
        if entry.tokens[:n] != tokens[:n]:  # a hash collision
            return 0, None
        end = min(limit, len(entry.tokens))
        while n < end and entry.tokens[n] == tokens[n]:
            n += 1
        if touch:
            self._entries.move_to_end(best)
        return n, entry

    def _drop(self, eid: int) -> None:
        entry = self._entries.pop(eid)
        self.nbytes -= entry.nbytes
        for key in entry.keys:
            if self._index.get(key) == eid:
                del self._index[key]


def block_hashes(tokens: Sequence[int]) -> Iterator[int]:
    """The chained hash of each full block of `tokens`: block i's hash covers blocks 0..i."""
    h = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, *tokens[start : start + BLOCK]))
        yield h
