"""Small helpers shared by the tables tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def rows_table(start: int, count: int) -> pa.Table:
    """Rows ``start..start+count-1``: ``id`` (the row's identity), ``g`` (id mod 4, a
    partition column), ``x`` (a float derived from id) and ``s`` (a string)."""
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "g": (ids % 4).astype(np.int32),
            "x": ids.astype(np.float64) * 0.5,
            "s": pa.array([f"row-{i}" for i in ids]),
        }
    )


def write_parquet_dir(root: Path, sizes: Iterable[int], row_group_size: int) -> list[int]:
    """Parquet files of ``sizes`` rows each (consecutive ids) under ``root``, some in a
    subdirectory; returns every id written."""
    root.mkdir(parents=True, exist_ok=True)
    start = 0
    for i, n in enumerate(sizes):
        sub = root / ("a" if i % 2 else "") / f"part-{i:03d}.parquet"
        sub.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows_table(start, n), sub, row_group_size=row_group_size)
        start += n
    return list(range(start))


def ids_of(items: Iterable[dict[str, Any]]) -> list[int]:
    """The ``id`` values of a TableDataset's items (batches or single rows), in order."""
    out: list[int] = []
    for item in items:
        v = item["id"]
        if hasattr(v, "tolist"):
            v = v.tolist()
        out.extend(v if isinstance(v, list) else [v])
    return out


def checksum(values: Iterable[Any]) -> int:
    """An order-independent checksum of a column's values."""
    return sum(zlib.crc32(repr(v).encode()) for v in values) % (1 << 61)
