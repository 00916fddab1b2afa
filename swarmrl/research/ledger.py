"""A run's ledger, read for a study: the metric and curve SQL of a study file, run with DuckDB.

The SQL may be written by an LLM (`--topic`), so it runs in a DuckDB that can reach no file: the
ledger views it names (those of `swarmrl query`) are first read into memory, then handed to a
connection opened with `enable_external_access = false`. One SELECT statement only.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from swarmrl.services.ledger.views import VIEWS, register_views


class MetricError(ValueError):
    """The metric (or curve) SQL cannot be run, or gives something that is not a number."""


def referenced_views(sql: str) -> list[str]:
    """The ledger views `sql` mentions (a word match; a miss only means an unknown-table error)."""
    return [v for v in VIEWS if re.search(rf"\b{v}\b", sql, flags=re.IGNORECASE)]


def run_sql(run_dir: Path | None, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of `sql` over the ledger of `run_dir` (None: an empty ledger, where every
    view exists with its columns and no rows). MetricError: not one SELECT, or DuckDB refused it."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise MetricError(str(exc).splitlines()[0]) from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise MetricError(f"must be one SELECT statement, got {len(statements)} statement(s)")
    with tempfile.TemporaryDirectory() as empty:
        source = duckdb.connect()
        register_views(source, run_dir if run_dir is not None else Path(empty))
        tables = {v: source.sql(f"SELECT * FROM {v}").to_arrow_table() for v in referenced_views(sql)}
        source.close()
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for name, table in tables.items():
            con.register(name, table)
        result = con.execute(sql)
        columns = [d[0] for d in result.description or []]
        return columns, result.fetchall()
    except duckdb.Error as exc:
        raise MetricError(str(exc).splitlines()[0]) from None
    finally:
        con.close()


@functools.lru_cache(maxsize=64)  # the named metrics are checked for every study loaded
def sql_columns(sql: str) -> tuple[str, ...]:
    """The column names `sql` selects, from a run over an empty ledger."""
    return tuple(run_sql(None, sql)[0])


def check_sql(sql: str, columns: int) -> str | None:
    """Why `sql` is no metric (`columns` = 1) or curve (`columns` = 2) query, or None if it is one."""
    try:
        names = list(sql_columns(sql))
    except MetricError as exc:
        return str(exc)
    if len(names) != columns:
        return f"must select {columns} column(s), selects {len(names)}: {names}"
    return None


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise MetricError(f"{what} is not a number: {value!r}") from None


def metric_value(run_dir: Path, sql: str) -> float | None:
    """The metric of one run: the first column of the first row (None: no row, or NULL)."""
    _, rows = run_sql(run_dir, sql)
    return _number(rows[0][0], "the metric") if rows else None


def curve(run_dir: Path, sql: str) -> list[tuple[float, float]]:
    """The (x, y) points of one run's curve, rows with a NULL dropped."""
    points = [(_number(x, "a curve x"), _number(y, "a curve y")) for x, y, *_ in run_sql(run_dir, sql)[1]]
    return [(x, y) for x, y in points if x is not None and y is not None]
