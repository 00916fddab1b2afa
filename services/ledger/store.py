"""Parquet part files of the ledger: `<run_dir>/ledger/<table>/part-*.parquet` (replicas: in
`<table>/p<partition>/`). Pure file logic, no NATS.

A flush writes one stream's rows, which may span several tables; its files form a *group*
(`part-<group>-n<files>.parquet`). Each file is written to a temporary name, fsynced and renamed;
a crash between two renames leaves an incomplete group, which `recover()` deletes on the next
start. Its messages were never acked, so JetStream redelivers them and the group is written again.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from swarmrl.services.ledger.tables import TABLES

log = logging.getLogger("swarmrl.ledger.store")

LEDGER_DIR = "ledger"
EMPTY_FILE = "part-empty.parquet"
"""Zero-row file with the current schema, so a table's view exists and is live before its first rows."""
_PART_RE = re.compile(r"^part-(\d+-\d+)-n(\d+)\.parquet$")
_TMP_SUFFIX = ".tmp"
_SCALARS = {
    table: [f.name for f in schema if not pa.types.is_list(f.type)] for table, schema in TABLES.items()
}
"""Per table, the columns written dictionary-encoded and with min/max statistics: the scalars (names
and ids repeat, readers skip row groups by `stream_seq`, `ts`). Token ids and logprobs gain little
from either and cost write time."""


def ledger_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / LEDGER_DIR


def _fsync(path: Path) -> None:  # a file or a folder
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Fenced(RuntimeError):
    """A group's files were withdrawn before taking their place (`PartWriter.write_group`'s `commit`)."""


class PartWriter:
    """Writes groups of Parquet files atomically (per file) and recoverably (per group)."""

    def __init__(
        self, run_dir: Path | str, *, compression: str = "snappy", fsync: bool = True, sub: str = ""
    ) -> None:
        self.root = ledger_dir(run_dir)
        self.sub = sub
        """Write into `<table>/<sub>/` (a ledger replica's partition), not the table's folder."""
        self.compression = compression
        self.fsync = fsync
        # Group ids sort by creation time and stay unique within a process and across restarts.
        self._ids = itertools.count()
        self._epoch = time.time_ns()

    def prepare(self) -> list[Path]:
        """Create the table folders and empty schema files; delete (and return) leftovers of a crash."""
        for table in TABLES:
            self.folder(table).mkdir(parents=True, exist_ok=True)
        removed = self.recover()
        if not self.sub:  # the table's own folder holds its schema file
            for table, schema in TABLES.items():
                path = self.root / table / EMPTY_FILE
                os.replace(self._write_tmp(path, schema.empty_table()), path)
        if self.fsync:
            for table in TABLES:
                _fsync(self.folder(table))
        return removed

    def folder(self, table: str) -> Path:
        return self.root / table / self.sub if self.sub else self.root / table

    def recover(self) -> list[Path]:
        groups: dict[tuple[str, int], list[Path]] = {}  # (group id, its number of files) -> files found
        removed: list[Path] = []
        for table in TABLES:
            for path in self.folder(table).iterdir():
                if path.name.endswith(_TMP_SUFFIX):
                    removed.append(path)
                elif m := _PART_RE.match(path.name):
                    groups.setdefault((m[1], int(m[2])), []).append(path)
        for (gid, size), paths in groups.items():
            if len(paths) != size:
                log.warning(
                    "incomplete flush group %s (%d of %d files): removing, it will be redelivered",
                    gid, len(paths), size,
                )  # fmt: skip
                removed.extend(paths)
        for path in removed:
            path.unlink()
        return removed

    def write_group(
        self, tables: dict[str, pa.Table], commit: Callable[[], bool] | None = None
    ) -> list[Path]:
        """Write the non-empty `tables` as one group; return the final paths (durable on return).
        `commit` is asked once every file is written, before any takes its place: False deletes them
        and raises `Fenced` (a ledger replica's partition passed to another while it wrote)."""
        tables = {name: table for name, table in tables.items() if table.num_rows}
        if not tables:
            return []
        gid = f"{self._epoch:020d}-{next(self._ids):08d}"
        paths = [self.folder(name) / f"part-{gid}-n{len(tables)}.parquet" for name in tables]
        tmps = [
            self._write_tmp(path, table, _SCALARS[name])
            for path, (name, table) in zip(paths, tables.items(), strict=True)
        ]
        if commit is not None and not commit():
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise Fenced(f"write of {len(paths)} files to {paths[0].parent} withdrawn: no longer ours")
        for tmp, path in zip(tmps, paths, strict=True):
            os.replace(tmp, path)
        if self.fsync:  # make the renames durable before the caller acks the messages
            for path in paths:
                _fsync(path.parent)
        return paths

    def _write_tmp(self, path: Path, table: pa.Table, scalars: list[str] | bool = True) -> Path:
        """`table` written and fsynced under `path`'s temporary name, which is returned; `scalars`: the
        columns with dictionary encoding and statistics."""
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        pq.write_table(
            table, tmp, compression=self.compression, use_dictionary=scalars, write_statistics=scalars
        )
        if self.fsync:
            _fsync(tmp)
        return tmp
