"""Merger configuration: `MergerSettings` (a swarm description's `[merger]`) and `MergerConfig`, the
process's whole configuration (`swarmrl serve merger --help`)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.services.merger.timelines import MergeMode, MergeOptions


class MergerSettings(Settings):
    """How episodes are merged into samples, and how the partition consumers run."""

    episode_timeout_s: float = Field(default=300.0, gt=0)
    """An open episode with no event (heartbeats count) for this long, by receive time, is dropped."""
    merge: bool = True
    """Merge prefix timelines; --no-merge keeps every LLM call as its own sample (baseline)."""
    merge_mode: MergeMode = "token"
    """`token`: a call is absorbed when its token ids are a prefix of a longer call's; `text`: the
    messages (and tools) must be a prefix too. Token drift never merges, in either mode."""
    ignore_tools: bool = False
    """Text mode: a changed `tools` list does not stop a call from being absorbed."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    """Ack wait of the partition consumers (held events are kept alive every `ack_wait_s / 4`). Keep it
    well under the SAMPLES duplicate window (`bus.SERVICE_DUPLICATE_WINDOW_S`), which heals a crash
    between publishing an episode's samples and acking its events."""
    lease_interval_s: float = Field(default=2.0, gt=0, le=3.0)
    """How often the partition leases are renewed and rebalanced (at most half of `bus.LEASE_TTL_S`)."""
    max_ack_pending: int = Field(default=200_000, gt=0)
    """Most unacked messages the server hands out: must exceed all events of all open episodes."""
    fetch_batch: int = Field(default=256, gt=0)
    """Messages per pull request."""
    stats_interval_s: float = Field(default=30.0, gt=0)
    """How often the counters (episodes merged, aborted, timed out, dead letters) are logged."""

    def options(self) -> MergeOptions:
        return MergeOptions(merge=self.merge, mode=self.merge_mode, ignore_tools=self.ignore_tools)


class MergerConfig(ServiceConfig, MergerSettings):
    replica: str = ""
    """This replica's name in the partition leases (default: host, pid and a random suffix)."""
