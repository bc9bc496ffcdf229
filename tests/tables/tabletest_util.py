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


# ----------------------------------------------------------------------- deletion vectors
# deltalake (delta-rs) reads deletion vectors but does not write them (its deletes rewrite
# files), and Spark needs the delta-spark jars, which are not on PyPI. So the tests write the
# commit a Delta writer with deletion vectors makes, following the Delta protocol: the table
# protocol gains the `deletionVectors` feature, and each file is removed and re-added with an
# inline vector (Z85 of: magic, then a 64-bit RoaringBitmapArray in portable form).

_DV_MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _roaring32(values: list[int]) -> bytes:
    """A 32-bit RoaringBitmap (portable format, array containers only: < 4096 per 64Ki)."""
    import struct

    by_key: dict[int, list[int]] = {}
    for v in sorted(set(values)):
        by_key.setdefault(v >> 16, []).append(v & 0xFFFF)
    if any(len(c) > 4096 for c in by_key.values()):
        raise ValueError("this test helper writes array containers only (<= 4096 per 64Ki)")
    keys = sorted(by_key)
    out = struct.pack("<II", 12346, len(keys))
    out += b"".join(struct.pack("<HH", k, len(by_key[k]) - 1) for k in keys)
    offset = 8 + 8 * len(keys)
    for k in keys:
        out += struct.pack("<I", offset)
        offset += 2 * len(by_key[k])
    for k in keys:
        out += b"".join(struct.pack("<H", v) for v in by_key[k])
    return out


def _z85(data: bytes) -> str:
    data += b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i : i + 4], "big")
        chunk = ""
        for _ in range(5):
            chunk = _Z85[v % 85] + chunk
            v //= 85
        out.append(chunk)
    return "".join(out)


def add_deletion_vectors(table_path: Path, deleted: dict[str, list[int]]) -> None:
    """Commit deletion vectors to a Delta table: ``deleted`` maps a data file's relative path
    to the row indexes (in that file) to delete."""
    import json
    import os
    import struct
    import time

    import deltalake

    dt = deltalake.DeltaTable(str(table_path))
    adds = {a["path"]: a for a in pa.table(dt.get_add_actions(flatten=False)).to_pylist()}
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
        }
    ]
    for rel, rows in deleted.items():
        add = adds[rel]
        high = {}
        for r in rows:
            high.setdefault(r >> 32, []).append(r & 0xFFFFFFFF)
        bitmap = struct.pack("<q", len(high)) + b"".join(
            struct.pack("<I", k) + _roaring32(v) for k, v in sorted(high.items())
        )
        data = struct.pack("<I", _DV_MAGIC) + bitmap
        dv = {
            "storageType": "i",
            "pathOrInlineDv": _z85(data),
            "sizeInBytes": len(data),
            "cardinality": len(set(rows)),
        }
        parts = {k: None if v is None else str(v) for k, v in (add.get("partition") or {}).items()}
        actions.append(
            {
                "remove": {
                    "path": rel,
                    "deletionTimestamp": now,
                    "dataChange": True,
                    "extendedFileMetadata": True,
                    "partitionValues": parts,
                    "size": add["size_bytes"],
                }
            }
        )
        actions.append(
            {
                "add": {
                    "path": rel,
                    "partitionValues": parts,
                    "size": add["size_bytes"],
                    "modificationTime": now,
                    "dataChange": True,
                    "deletionVector": dv,
                    "stats": json.dumps({"numRecords": add["num_records"]}),
                }
            }
        )
    actions.append({"commitInfo": {"timestamp": now, "operation": "DELETE"}})
    version = dt.version() + 1
    log = table_path / "_delta_log" / f"{version:020d}.json"
    tmp = log.with_suffix(".tmp")
    tmp.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    os.rename(tmp, log)
