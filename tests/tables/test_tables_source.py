"""Source resolution and ``read_table``: Parquet directories, globs, lists and Delta tables
(several versions, overwrite, append, delete, partitions), on plain directories and through real
airfs mounts of POSIX and S3 origins."""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tabletest_util import rows_table, write_parquet_dir

from airfs.tables import TableError, delta_write_options, read_table, resolve
from airfs.tables.plan import plan_units


def write_delta(path: Path, table: pa.Table, **kw) -> None:
    deltalake.write_deltalake(str(path), table, storage_options=delta_write_options(path), **kw)


def sorted_ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def test_parquet_dir_glob_list(table_dir: Path):
    ids = write_parquet_dir(table_dir / "t", [100, 57, 300], row_group_size=40)
    (table_dir / "t" / "_ignored.parquet").write_bytes(b"not parquet")
    (table_dir / "t" / "notes.txt").write_text("not a table file")
    src = resolve(table_dir / "t")
    assert src.kind == "parquet" and len(src.files) == 3
    assert sum(u.rows for u in plan_units(src)) == len(ids)
    assert len(plan_units(src)) == 3 + 2 + 8  # row groups of 40 rows
    assert sorted_ids(read_table(table_dir / "t")) == ids
    top = sorted(str(p) for p in (table_dir / "t").glob("part-*.parquet"))
    assert read_table(str(table_dir / "t" / "part-*.parquet")).num_rows == 100 + 300
    assert read_table(str(table_dir / "t" / "**" / "part-*.parquet")).num_rows == len(ids)
    assert read_table(top[:1]).num_rows == 100
    got = read_table(table_dir / "t", columns=["id", "s"], filter=pc.field("id") < 10)
    assert got.column_names == ["id", "s"] and sorted_ids(got) == list(range(10))
    assert read_table(table_dir / "t", filter=[("g", "=", 1)]).num_rows == len(ids) // 4


def test_hive_partitions_become_columns(table_dir: Path):
    import pyarrow.dataset as pads

    t = rows_table(0, 200)
    pads.write_dataset(
        t.drop_columns(["s"]),
        table_dir / "hive",
        format="parquet",
        partitioning=["g"],
        partitioning_flavor="hive",
    )
    got = read_table(table_dir / "hive")
    assert got.schema.field("g").type == pa.int64()
    assert sorted(zip(got["id"].to_pylist(), got["g"].to_pylist(), strict=True)) == [
        (i, i % 4) for i in range(200)
    ]
    assert read_table(table_dir / "hive", filter=pc.field("g") == 2).num_rows == 50
    assert resolve(table_dir / "hive").info["partition_columns"] == ["g"]


def test_clear_errors(table_dir: Path):
    write_parquet_dir(table_dir / "t", [10], row_group_size=5)
    with pytest.raises(TableError, match="no such file or directory"):
        resolve(table_dir / "missing")
    with pytest.raises(TableError, match=r"catalog\.schema\.table name"):
        resolve("main.default.my_table")
    with pytest.raises(TableError, match="no column 'nope'"):
        read_table(table_dir / "t", columns=["id", "nope"])
    with pytest.raises(TableError, match="version= is for Delta tables"):
        resolve(table_dir / "t", version=3)
    (table_dir / "empty").mkdir()
    with pytest.raises(TableError, match="no Parquet files"):
        resolve(table_dir / "empty")
    (table_dir / "bad").mkdir()
    (table_dir / "bad" / "x.parquet").write_bytes(b"garbage")
    with pytest.raises(TableError, match="not a Parquet file"):
        resolve(table_dir / "bad")
    with pytest.raises(TableError, match="no file matches"):
        resolve(str(table_dir / "t" / "*.nothing"))


def test_in_progress_and_manifest(table_dir: Path):
    write_parquet_dir(table_dir / "t", [10, 10], row_group_size=5)
    tmp = table_dir / "t" / "_temporary" / "0"
    tmp.mkdir(parents=True)
    with pytest.raises(TableError, match="_temporary/ and no _SUCCESS"):
        read_table(table_dir / "t")
    (table_dir / "t" / "_SUCCESS").write_text("")  # Spark's: empty, every file is read
    assert read_table(table_dir / "t").num_rows == 20
    manifest = {"format": "airfs-export-1", "files": [{"name": "part-000.parquet", "rows": 10}]}
    (table_dir / "t" / "_SUCCESS").write_text(json.dumps(manifest))
    assert sorted_ids(read_table(table_dir / "t")) == list(range(10))  # only what it lists
    manifest["files"].append({"name": "gone.parquet", "rows": 1})
    (table_dir / "t" / "_SUCCESS").write_text(json.dumps(manifest))
    with pytest.raises(TableError, match="listed in _SUCCESS are missing"):
        read_table(table_dir / "t")


@pytest.mark.mount
def test_delta_versions_through_the_mount(volume):
    """Several versions, an append, an overwrite and a delete, written by deltalake into a
    mount (POSIX and S3 origins); every version reads as deltalake itself reads it."""
    path = volume.root / "delta"
    write_delta(path, rows_table(0, 500), partition_by=["g"])  # v0
    write_delta(path, rows_table(500, 250), mode="append", partition_by=["g"])  # v1
    dt = deltalake.DeltaTable(str(path), storage_options=delta_write_options(path))
    dt.delete("id >= 100 AND id < 150")  # v2
    write_delta(path, rows_table(1000, 80), mode="overwrite", partition_by=["g"])  # v3
    write_delta(path, rows_table(2000, 20), mode="append", partition_by=["g"])  # v4
    expected = {
        0: list(range(500)),
        1: list(range(750)),
        2: [i for i in range(750) if not 100 <= i < 150],
        3: list(range(1000, 1080)),
        4: list(range(1000, 1080)) + list(range(2000, 2020)),
    }
    for version, ids in expected.items():
        src = resolve(path, version=version)
        assert src.kind == "delta" and src.version == version
        got = read_table(path, version=version)
        assert sorted_ids(got) == ids, version
        own = deltalake.DeltaTable(str(path), version=version).to_pyarrow_table()
        assert sorted_ids(own) == ids
        assert got.schema.field("g").type == pa.int32()  # partition values typed
        assert all(
            g == i % 4 for g, i in zip(got["g"].to_pylist(), got["id"].to_pylist(), strict=True)
        )
    assert resolve(path).version == 4
    g2 = read_table(path, columns=["id"], filter=pc.field("g") == 2)
    assert sorted_ids(g2) == [i for i in expected[4] if i % 4 == 2]
    # only active files: the overwritten ones are still in the directory
    assert len(list(path.rglob("*.parquet"))) > len(resolve(path).files)


def test_delta_schema_evolution_reads_nulls(table_dir: Path):
    path = table_dir / "evo"
    write_delta(path, rows_table(0, 10))
    wider = rows_table(10, 5).append_column("extra", pa.array([1.5] * 5))
    write_delta(path, wider, mode="append", schema_mode="merge")
    got = read_table(path).sort_by("id")
    assert got.column("extra").to_pylist() == [None] * 10 + [1.5] * 5


def test_delta_column_mapping_is_refused(table_dir: Path):
    path = table_dir / "cm"
    write_delta(path, rows_table(0, 10), configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(TableError, match="column mapping"):
        resolve(path)


def test_delta_write_options_are_no_longer_needed(tmp_path: Path, table_dir: Path):
    """deltalake commits through the mount with its own hard-link commits (no unsafe rename)."""
    assert delta_write_options(table_dir / "new" / "table") == {}
    assert delta_write_options(tmp_path / "plain") == {}


def _is_mount(path: Path) -> bool:
    from airfs.control.client import find_mount

    return find_mount(str(path)) is not None


def test_parquet_footer_counts_match(table_dir: Path):
    write_parquet_dir(table_dir / "t", [33, 7], row_group_size=8)
    src = resolve(table_dir / "t")
    units = plan_units(src)
    for u in units:
        md = pq.read_metadata(src.files[u.file].path)
        assert md.row_group(u.row_group).num_rows == u.rows
