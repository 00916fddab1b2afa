"""Configuration of the ledger service: `LedgerSettings`, what a swarm description's `[ledger]` may
set, and `LedgerConfig`, the process's whole configuration (`swarmrl serve ledger --help` prints
every field), which adds the run directory and replica name `swarmrl up` gives it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from swarmrl.core.config import ServiceConfig, Settings
from swarmrl.schemas import MAX_EVENT_BYTES


class LedgerSettings(Settings):
    """How the streams are written to Parquet and read."""

    flush_rows: int = 5000
    """Write a stream's buffered rows as soon as this many are waiting (messages are acked after the write)."""
    flush_bytes: int = 64 * 1024 * 1024
    """...or as soon as their messages add up to this many bytes (bounds memory and Arrow offsets)."""
    flush_interval_s: float = 1.0
    """Write buffered rows at least this often (seconds), however few there are."""
    flush_idle_rows: int = 100
    """...and as soon as a poll finds nothing new, if this many are waiting (or they are the tail of a
    burst: a write of the last `flush_interval_s` had this many): a burst is durable once the ledger
    has caught up with it, while a trickle still makes one file per `flush_interval_s`."""
    fetch_batch: int = 1000
    """Messages pulled from a stream per fetch."""
    poll_interval_s: float = 0.25
    """Once caught up, look for new messages at most this long after the last look (seconds; sooner
    on a busy stream): they then arrive in batches, which costs far less CPU than taking them one by
    one. A stream found empty is woken by its next message. Also bounds how late a timed flush is."""
    stop_drain_s: float = 10.0
    """On a stop (SIGTERM), go on reading for up to this many seconds, until caught up with what each
    stream held: `swarmrl up` stops the ledger last, so it records what the other services published."""
    ack_wait_s: float = 60.0
    """JetStream redelivers a message not acked within this many seconds (must exceed a flush)."""
    max_event_bytes: int = MAX_EVENT_BYTES
    """Episode events larger than this are dead-lettered as `oversized`."""
    compression: str = "snappy"
    """Parquet compression codec (snappy, zstd, gzip, none); zstd files are smaller, snappy costs a
    third of its CPU, which decides whether the ledger keeps up on a small machine."""
    fsync: bool = True
    """fsync every part file and its folder before acking; turn off only for throwaway runs."""
    nice: int = Field(default=10, ge=0, le=19)
    """CPU priority the ledger lowers itself to (Unix niceness, 0-19; 0 leaves it as started). It is off
    the rollout path, and JetStream keeps what it has not read yet: on a machine it shares with agents,
    engines and trainers, it records in their gaps instead of taking the CPU from them. Where the
    machine is busy for a long time, the ledger lags (in stream messages, not lost ones) and catches up
    once it is not (`bench/results/pipeline.md` measures it beside `--nice 0`)."""
    lease_interval_s: float = Field(default=2.0, gt=0, le=3.0)
    """Replicas: how often the leases are renewed and rebalanced (at most half of `bus.LEASE_TTL_S`)."""
    stats_interval_s: float = 30.0
    """Log row and dead-letter counts this often (seconds); open episodes are expired as often."""
    open_episode_ttl_s: float = 6 * 3600.0
    """An episode with no event for this long stops being tracked as open: its rows stay (the
    `episodes` view shows it `open`), a later event of it is dead-lettered as `after_end`. Bounds the
    ordering state the ledger keeps for clients that vanished without an `abort`."""


class LedgerConfig(ServiceConfig, LedgerSettings):
    run_dir: Path = Path("runs/latest")
    """Run directory; Parquet files go to `<run_dir>/ledger/<table>/part-*.parquet` (env SWARMRL_RUN_DIR)."""
    replica: str = ""
    """Set: this ledger is one of several replicas (`[replicas] ledger = N`), which share the 16
    episode partitions of LEDGER_PARTS and the other streams (one more lease) by lease, each writing
    its partitions' Parquet files under `<table>/p<partition>/` (`service.py`). Empty: the one ledger."""
