"""`swarmrl query "SQL"`: run SQL with DuckDB over a run's ledger and print the result.

Reads the Parquet files under `<run_dir>/ledger/` (no NATS needed); `--remote` asks a running ledger
over NATS instead (`remote.py`). `connect(run_dir)` gives the same views to Python code.
The table format never cuts a cell unless `--width` asks; into a pipe it prints one line per row.
A reader that stops early (`| head`) ends the output quietly with status 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import duckdb

from swarmrl.core.rundir import LATEST_LINK, latest_pointer, latest_run_dir
from swarmrl.services.ledger.remote import execute, jsonable
from swarmrl.services.ledger.views import register_views

VIEW_HELP = {
    "episodes": "one row per episode: task, group, client, models, status ok/aborted/open, reward, calls, times",
    "events": "every episode event except llm (begin, env, reward, end, abort, heartbeat)",
    "llm_calls": "every LLM call: exact prompt/output token ids, logprobs, policy version, messages",
    "samples": "training samples from the merger (token ids, loss mask, logprobs, reward)",
    "lost_episodes": "training episodes that send a model no sample (dropped or its role idle), per model",
    "train_steps": "one row per trainer step (loss, reward mean/std, staleness, throughput)",
    "sample_drops": "samples a trainer dropped untrained between steps, with the reason (JSON map)",
    "evals": "evaluation results (success rate per model, step and task)",
    "merges": "merge statistics per episode (timelines kept, tokens before/after)",
    "actions": "every action of the actions service: episode, kind, demand, queued/run/ACT seconds, status",
    "dead_letters": "rejected messages of every service: reason, original subject and bytes",
}


def default_run_dir() -> Path:
    """`$SWARMRL_RUN_DIR`, else the latest run (`./runs/latest`, else `$SWARMRL_HOME/latest-run`)."""
    if os.environ.get("SWARMRL_RUN_DIR"):
        return Path(os.environ["SWARMRL_RUN_DIR"])
    latest = latest_run_dir()
    if latest is None:
        raise FileNotFoundError(
            f"no run found: no {LATEST_LINK} in {Path.cwd()} and no existing run recorded in "
            f"{latest_pointer()} (pass --run-dir or set SWARMRL_RUN_DIR)"
        )
    return latest


def connect(run_dir: Path | str | None = None) -> duckdb.DuckDBPyConnection:
    """In-memory DuckDB with every ledger view over `run_dir` (default: `default_run_dir()`)."""
    path = Path(run_dir) if run_dir is not None else default_run_dir()
    if not path.is_dir():
        raise FileNotFoundError(
            f"run directory {str(path)!r} does not exist (set --run-dir or SWARMRL_RUN_DIR)"
        )
    con = duckdb.connect()
    register_views(con, path)
    return con


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, default=jsonable)
    if isinstance(value, bytes | bytearray | memoryview):
        return jsonable(value)  # base64, as in the JSON output
    return value


def _cell(value: Any, width: int) -> str:
    """The cell's text; cut to `width` characters only when `width` > 0 (`--width`)."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        text = f"<{len(raw)} bytes> {raw[:16].hex()}"
    else:
        text = str(_csv_cell(value))
    return text if width <= 0 or len(text) <= width else text[: width - 1] + "…"


def _print(columns: list[str], rows: list[tuple[Any, ...]], fmt: str, width: int, run_dir: str = "") -> None:
    if fmt == "json":
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        json.dump(records, sys.stdout, default=jsonable, indent=1)
        sys.stdout.write("\n")
    elif fmt == "csv":
        out = csv.writer(sys.stdout)
        out.writerow(columns)
        for row in rows:
            out.writerow(_csv_cell(v) for v in row)
    else:
        from rich.console import Console
        from rich.measure import Measurement
        from rich.table import Table
        from rich.text import Text

        footer = f"{len(rows)} row{'s' if len(rows) != 1 else ''}" + (f" from {run_dir}" if run_dir else "")
        table = Table()
        for name in columns:
            # fold, not ellipsis: a word longer than its column (an id, a JSON list) wraps whole
            table.add_column(Text(name), overflow="fold")
        for row in rows:
            # Text, not str: ledger data such as "[1, 2]" or "[bold]" is not rich markup
            table.add_row(*(Text(_cell(v, width)) for v in row))

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                # rich's own handler exits with status 1; leave it to _quiet_broken_pipe like csv/json
                self.quiet = True
                raise BrokenPipeError

        console = _Console()
        if not console.is_terminal:
            # a pipe or file: one line per row, however wide, instead of wrapping at 80 columns
            wide = Console(width=1 << 20)
            need = Measurement.get(wide, wide.options, table).maximum
            console = _Console(width=max(need, len(footer), 20))
        console.print(table)
        # a line of its own, not a caption: a caption wraps at the table's width
        console.print(Text(footer, style="dim"))
    sys.stdout.flush()


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
        "--run-dir",
        type=Path,
        default=None,
        help=f"run directory (default: $SWARMRL_RUN_DIR, else the latest run: ./{LATEST_LINK}, else the "
        "run recorded in $SWARMRL_HOME/latest-run)",
    )
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    parser.add_argument(
        "--width", type=int, default=0, help="table format: cut cells to this many characters (0 = never)"
    )
    parser.add_argument(
        "--remote",
        action="store_true",
        help="ask the swarm's ledger over NATS ($SWARMRL_NATS, the operator's URL) instead of reading a run "
        "directory on this machine: for a ledger on another host (services/ledger/remote.py)",
    )
    args = parser.parse_args(argv)
    reply = _remote(args.sql) if args.remote else _local(args.sql, args.run_dir)
    if not reply.get("ok"):
        print(f"swarmrl query{' --remote' if args.remote else ''}: {reply.get('error')}", file=sys.stderr)
        return 1
    caption = f"{reply.get('run_dir', '')} (remote)" if args.remote else reply["run_dir"]
    with _quiet_broken_pipe():
        _print(reply["columns"], reply["rows"], args.format, args.width, caption)
    return 0


def _local(sql: str, run_dir: Path | None) -> dict[str, Any]:
    """The query run on this machine, as a reply of `remote.ask`."""
    try:
        path = run_dir if run_dir is not None else default_run_dir()
        con = connect(path)
    except FileNotFoundError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        reply = execute(con, sql)
    finally:
        con.close()
    # name the run in the caption when it was found rather than given: which "latest" it was
    return reply | {"run_dir": "" if run_dir is not None else str(path)}


def _remote(sql: str) -> dict[str, Any]:
    """`--remote`: the query answered by the ledger over NATS."""
    import asyncio

    from swarmrl.services.ledger.remote import ask

    if not (url := os.environ.get("SWARMRL_NATS", "")):
        return {
            "ok": False,
            "error": "no $SWARMRL_NATS (the operator's URL, nats://service:PASSWORD@host:4222)",
        }
    return asyncio.run(ask(url, sql))


@contextmanager
def _quiet_broken_pipe() -> Iterator[None]:
    """Stop writing, without a traceback and with status 0, when the reader has gone (`| head`)."""
    try:
        yield
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush goes nowhere.
        with suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
