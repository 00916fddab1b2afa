"""`swarmrl serve ledger`: record every stream of the swarm as Parquet, queryable with `swarmrl query`."""

from __future__ import annotations

from swarmrl.core.config import parse_config
from swarmrl.core.log import setup_logging
from swarmrl.services.common import loop as aio
from swarmrl.services.ledger.config import LedgerConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(LedgerConfig, argv, "swarmrl serve ledger")
    setup_logging("ledger", cfg.log_level)
    # Imported here so `--help` stays fast (duckdb, pyarrow and nats load only to run).
    from swarmrl.services.ledger.service import run

    aio.run(run(cfg))
    return 0
