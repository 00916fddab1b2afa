"""Ledger configuration: `LedgerSettings` (a swarm description's `[ledger]`) and `LedgerConfig`, the
process's whole configuration (`swarmrl serve ledger --help`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.schemas import MAX_EVENT_BYTES


class LedgerSettings(Settings):
    """How the streams are written to Parquet and read."""

    flush_rows: int = 5000
    """Write a stream's buffered rows as soon as this many are waiting (acked after the write)."""
    flush_bytes: int = 64 * 1024 * 1024
    """...or as soon as their messages add up to this many bytes (bounds memory and Arrow offsets)."""
    flush_interval_s: float = 1.0
    """Write buffered rows at least this often (seconds), however few there are."""
    flush_idle_rows: int = 100
    """...and as soon as a poll finds nothing new, if this many are waiting or they end a burst (a
    write of the last `flush_interval_s` had this many)."""
    fetch_batch: int = 1000
    """Messages pulled from a stream per fetch."""
    poll_interval_s: float = 0.25
    """Once caught up, look for new messages at most this long after the last look (seconds): batches
    cost far less CPU than single messages. Also bounds how late a timed flush is."""
    stop_drain_s: float = 10.0
    """On a stop, go on reading for up to this many seconds, until caught up with what each stream held."""
    ack_wait_s: float = 60.0
    """JetStream redelivers a message not acked within this many seconds (must exceed a flush)."""
    max_event_bytes: int = MAX_EVENT_BYTES
    """Episode events larger than this are dead-lettered as `oversized`."""
    compression: str = "snappy"
    """Parquet compression codec (snappy, zstd, gzip, none); zstd is smaller, snappy cheaper in CPU."""
    fsync: bool = True
    """fsync every part file and its folder before acking; turn off only for throwaway runs."""
    nice: int = Field(default=10, ge=0, le=19)
    """CPU priority the ledger lowers itself to (Unix niceness, 0-19; 0 leaves it as started): off the
    rollout path, it records in the gaps of a busy machine and catches up later
    (`bench/results/pipeline.md`)."""
    lease_interval_s: float = Field(default=2.0, gt=0, le=3.0)
    """Replicas: how often the leases are renewed and rebalanced (at most half of `bus.LEASE_TTL_S`)."""
    stats_interval_s: float = 30.0
    """Log row and dead-letter counts this often (seconds); open episodes are expired as often."""
    open_episode_ttl_s: float = 6 * 3600.0
    """An episode with no event for this long stops being tracked as open (its rows stay; a later event
    is dead-lettered as `after_end`): bounds the state kept for clients that vanished."""


class LedgerConfig(ServiceConfig, LedgerSettings):
    run_dir: Path = Path("runs/latest")
    """Run directory; Parquet files go to `<run_dir>/ledger/<table>/` (env SWARMRL_RUN_DIR)."""
    replica: str = ""
    """Set: this ledger is one of several replicas (`[replicas] ledger = N`), which share the episode
    partitions of LEDGER_PARTS and the other streams by lease. Empty: the one ledger."""
