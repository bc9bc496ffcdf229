"""Delta deletion vectors: deltalake exposes them as row masks (its own readers refuse such
tables), and every reader of :mod:`airfs.tables` applies them: ``read_table``, ``TableDataset``
(counts, coverage over ranks, filter), ``export_table``; on a plain directory and through a
mount. The vectors are committed by :func:`tabletest_util.add_deletion_vectors`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import deltalake
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tabletest_util import add_deletion_vectors, ids_of, rows_table

from airfs.tables import TableDataset, delta_write_options, export_table, read_table, resolve


@pytest.fixture
def dv_table(table_dir: Path) -> tuple[Path, list[int]]:
    """A table partitioned by ``g`` (4 files, row groups of 16 rows) with deletion vectors on
    three files; returns its path and the live ids."""
    path = table_dir / "dv"
    deltalake.write_deltalake(
        str(path),
        rows_table(0, 400),
        partition_by=["g"],
        writer_properties=deltalake.WriterProperties(max_row_group_size=16),
        storage_options=delta_write_options(path),
    )
    src = resolve(path)
    deleted: dict[str, list[int]] = {}
    dead: set[int] = set()
    for k, f in enumerate(src.files[:3]):
        file_ids = pq.read_table(f.path)["id"].to_pylist()  # in file order
        rows = sorted({0, 5, 17, 31 + k, len(file_ids) - 1})
        deleted[str(Path(f.path).relative_to(path))] = rows
        dead |= {file_ids[r] for r in rows}
    add_deletion_vectors(path, deleted)
    return path, [i for i in range(400) if i not in dead]


def test_deltalake_refuses_and_exposes_the_vectors(dv_table):
    path, _ = dv_table
    dt = deltalake.DeltaTable(str(path))
    with pytest.raises(Exception, match="deletionVectors"):
        dt.to_pyarrow_table()
    src = resolve(path)
    assert src.info["deletion_vectors"] == 3
    assert sum(f.keep is not None for f in src.files) == 3


def test_readers_apply_deletion_vectors(dv_table):
    path, live = dv_table
    table = read_table(path)
    assert sorted(table["id"].to_pylist()) == live
    assert all(
        g == i % 4 for g, i in zip(table["g"].to_pylist(), table["id"].to_pylist(), strict=True)
    )
    odd = read_table(path, columns=["id"], filter=pc.field("x") > 100.0)
    assert sorted(odd["id"].to_pylist()) == [i for i in live if i * 0.5 > 100.0]
    ds = TableDataset(path, batch_rows=10, seed=1)
    assert ds.num_rows == len(live)
    assert sorted(ids_of(ds)) == live
    filtered = TableDataset(path, columns=["id"], filter=[("g", "=", 1)], batch_rows=7)
    assert sorted(ids_of(filtered)) == [i for i in live if i % 4 == 1]
    seen = Counter()
    for rank in range(3):
        part = ids_of(TableDataset(path, batch_rows=8, rank=rank, world_size=3, uneven="drop"))
        assert len(part) == len(live) // 3
        seen.update(part)
    assert all(c == 1 for c in seen.values()) and set(seen) <= set(live)
    result = export_table(path, path.parent / "exported")
    assert result.rows == len(live)
    assert sorted(read_table(path.parent / "exported")["id"].to_pylist()) == live


def test_a_version_before_the_vectors_reads_every_row(dv_table):
    path, _ = dv_table
    assert sorted(read_table(path, version=0)["id"].to_pylist()) == list(range(400))
    assert resolve(path, version=0).info["deletion_vectors"] == 0
