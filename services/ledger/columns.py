"""Rows of one table buffered until a flush, then handed to Arrow in one piece (pure logic).

Token ids and logprobs, the bulk of the ledger, arrive as `array.array` (`tables.check_ints`) and
are joined into one flat buffer per column, which Arrow wraps without looking at each value.
"""

from __future__ import annotations

from array import array
from itertools import accumulate

import pyarrow as pa

from swarmrl.services.ledger.tables import NUMERIC_LISTS, TABLES, Row


class TableBuffer:
    """Append rows of `table`; `to_arrow()` builds the Arrow table with the schema of `TABLES`."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.schema = TABLES[table]
        numeric = NUMERIC_LISTS[table]
        # Scalars stay in the row dicts: Arrow's converter reads them faster than a Python loop.
        self._struct = pa.struct([f for f in self.schema if f.name not in numeric])
        self._rows: list[Row] = []
        # Each row's array, joined once at the flush (cheaper than one growing array).
        self._chunks: dict[str, list[array]] = {name: [] for name in numeric}

    @property
    def rows(self) -> int:
        return len(self._rows)

    def append(self, row: Row) -> None:
        for name, chunks in self._chunks.items():
            chunks.append(row[name])
        self._rows.append(row)

    def to_arrow(self) -> pa.Table:
        # One C++ pass over the row dicts (as a struct array), much cheaper than from_pylist.
        scalars = pa.Table.from_struct_array(pa.array(self._rows, type=self._struct))
        columns: list[pa.Array | pa.ChunkedArray] = []
        for f in self.schema:
            chunks = self._chunks.get(f.name)
            if chunks is None:
                columns.append(scalars.column(f.name))
                continue
            value_type = f.type.value_type  # int64 or float64: the layout of arrays "q" and "d"
            values = pa.py_buffer(b"".join(chunks))
            flat = pa.Array.from_buffers(
                value_type, len(values) // (value_type.bit_width // 8), [None, values]
            )
            # list<> has 32-bit offsets; the handlers flush long before 2**31 values pile up.
            ends = array("i", [0, *accumulate(map(len, chunks))])
            offsets = pa.Array.from_buffers(pa.int32(), len(ends), [None, pa.py_buffer(ends)])
            columns.append(pa.ListArray.from_arrays(offsets, flat))
        return pa.Table.from_arrays(columns, schema=self.schema)


def to_arrow(table: str, rows: list[Row]) -> pa.Table:
    """Arrow table of `rows` (rows as built by the `tables` functions)."""
    buffer = TableBuffer(table)
    for row in rows:
        buffer.append(row)
    return buffer.to_arrow()
