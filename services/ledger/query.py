"""`swarmrl query "SQL"`: run SQL with DuckDB over a run's ledger and print the result.

Reads the Parquet files the ledger wrote under `<run_dir>/ledger/`; needs no NATS and no running
service. `connect(run_dir)` gives the same views to Python code (report writer, tests, notebooks).
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import duckdb

from swarmrl.services.ledger.views import register_views

VIEW_HELP = {
    "episodes": "one row per episode: task, group, client, models, status ok/aborted/open, reward, calls, times",
    "events": "every episode event except llm (begin, env, reward, end, abort, heartbeat)",
    "llm_calls": "every LLM call: exact prompt/output token ids, logprobs, policy version, messages",
    "samples": "training samples from the merger (token ids, loss mask, logprobs, reward)",
    "train_steps": "one row per trainer step (loss, reward mean/std, staleness, throughput)",
    "evals": "evaluation results (success rate per model, step and task)",
    "merges": "merge statistics per episode (timelines kept, tokens before/after)",
    "dead_letters": "rejected messages of every service: reason, original subject and bytes",
}


def default_run_dir() -> Path:
    return Path(os.environ.get("SWARMRL_RUN_DIR") or "runs/latest")


def connect(run_dir: Path | str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every ledger view registered over `run_dir`'s Parquet files.

    Args:
        run_dir: the run directory (holding `ledger/`); default `$SWARMRL_RUN_DIR` or `runs/latest`.

    Raises:
        FileNotFoundError: `run_dir` does not exist.
    """
    path = Path(run_dir) if run_dir is not None else default_run_dir()
    if not path.is_dir():
        raise FileNotFoundError(
            f"run directory {str(path)!r} does not exist (set --run-dir or SWARMRL_RUN_DIR)"
        )
    con = duckdb.connect()
    register_views(con, path)
    return con


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, default=_jsonable)
    if isinstance(value, bytes | bytearray | memoryview):
        return _jsonable(value)  # base64, as in the JSON output
    return value


def _cell(value: Any, width: int) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        text = f"<{len(raw)} bytes> {raw[:16].hex()}"
    elif isinstance(value, list | dict):
        text = json.dumps(value, default=_jsonable)
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _print(columns: list[str], rows: list[tuple[Any, ...]], fmt: str, width: int) -> None:
    if fmt == "json":
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        json.dump(records, sys.stdout, default=_jsonable, indent=1)
        sys.stdout.write("\n")
    elif fmt == "csv":
        out = csv.writer(sys.stdout)
        out.writerow(columns)
        for row in rows:
            out.writerow(_csv_cell(v) for v in row)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns, caption=f"{len(rows)} row{'s' if len(rows) != 1 else ''}")
        for row in rows:
            table.add_row(*(_cell(v, width) for v in row))
        Console().print(table)


def main(argv: list[str] | None = None) -> int:
    views = "\n".join(f"  {name:<13} {text}" for name, text in VIEW_HELP.items())
    parser = argparse.ArgumentParser(
        prog="swarmrl query",
        description="Run SQL (DuckDB dialect) over a run's ledger and print the result.",
        epilog=f'views:\n{views}\n\ncolumns: `swarmrl query "DESCRIBE llm_calls"`, or services/ledger/README.md\n'
        'example: swarmrl query "SELECT status, count(*), avg(reward) FROM episodes GROUP BY status"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sql", help="the SQL to run")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="run directory (default: $SWARMRL_RUN_DIR or runs/latest)"
    )
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    parser.add_argument(
        "--width", type=int, default=60, help="table format: cut cells to this many characters"
    )
    args = parser.parse_args(argv)
    try:
        con = connect(args.run_dir)
    except FileNotFoundError as exc:
        print(f"swarmrl query: {exc}", file=sys.stderr)
        return 1
    try:
        result = con.execute(args.sql)
        columns = [d[0] for d in result.description] if result.description else []
        rows = result.fetchall() if columns else []
    except duckdb.Error as exc:
        print(f"swarmrl query: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        con.close()
    _print(columns, rows, args.format, args.width)
    return 0
