"""``export_table``: Delta and Parquet sources into Parquet files of a target size in a volume,
the ``_SUCCESS`` protocol (an export killed midway is not read), and Hugging Face ``datasets``
reading the exported files through real airfs mounts of POSIX and S3 origins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from tabletest_util import checksum, rows_table

from airfs.tables import TableDataset, TableError, delta_write_options, export_table, read_table

N = 6000


def make_delta(path: Path) -> list[int]:
    """A Delta table with an append and a delete (ids 0..N-1 less 100..199)."""
    opts = delta_write_options(path)
    deltalake.write_deltalake(str(path), rows_table(0, N // 2), storage_options=opts)
    deltalake.write_deltalake(
        str(path), rows_table(N // 2, N // 2), mode="append", storage_options=opts
    )
    deltalake.DeltaTable(str(path), storage_options=opts).delete("id >= 100 AND id < 200")
    return [i for i in range(N) if not 100 <= i < 200]


@pytest.mark.mount
def test_export_delta_then_hf_datasets_through_the_mount(volume):
    src = volume.root / "main" / "tbl"
    ids = make_delta(src)
    dest = volume.root / "main" / "training_data"
    result = export_table(src, dest, target_file_bytes=40_000, row_group_bytes=16_000)
    assert result.rows == len(ids) and len(result.files) >= 3
    names = sorted(os.listdir(dest))
    assert names == sorted([*(os.path.basename(p) for p in result.paths), "_SUCCESS"])
    manifest = json.loads((dest / "_SUCCESS").read_text())
    assert [f["rows"] for f in manifest["files"]] == [f.rows for f in result.files]
    for f in result.files:
        md = pq.read_metadata(f.path)
        assert md.num_rows == f.rows and os.path.getsize(f.path) == f.bytes
        assert md.num_row_groups >= 2  # row groups of about row_group_bytes
    sizes = [f.bytes for f in result.files[:-1]]
    assert all(30_000 <= s <= 80_000 for s in sizes), sizes  # about the target

    table = read_table(dest)
    assert sorted(table["id"].to_pylist()) == ids
    assert sorted(read_table(src)["id"].to_pylist()) == ids

    # the seed's step 2, unchanged: Hugging Face datasets over the files, through the mount
    from datasets import load_dataset

    hf = load_dataset(
        "parquet",
        data_files=str(dest / "*.parquet"),
        split="train",
        cache_dir=str(volume.tmp / "hf-cache"),
    )
    assert hf.num_rows == len(ids)
    for col in ("id", "x", "s"):
        assert checksum(hf[col]) == checksum(table[col].to_pylist()), col
    streamed = load_dataset("parquet", data_files=result.paths, split="train", streaming=True)
    assert sum(1 for _ in streamed) == len(ids)
    # map and save_to_disk into the volume, then load_from_disk, as users do
    from datasets import load_from_disk

    doubled = hf.map(lambda r: {"y": r["x"] * 2}, num_proc=1)
    doubled.save_to_disk(str(volume.root / "main" / "hf_saved"))
    again = load_from_disk(str(volume.root / "main" / "hf_saved"))
    assert again.num_rows == len(ids)
    assert checksum(again["y"]) == checksum([v * 2 for v in table["x"].to_pylist()])
    # and the dataset of this package over the export
    assert TableDataset(dest).num_rows == len(ids)


def test_export_columns_filter_and_sources(tmp_path: Path):
    t = rows_table(0, 1000)
    dest = tmp_path / "a"
    r = export_table(t, dest, columns=["id", "x"], filter=pc.field("g") == 3)
    got = read_table(dest)
    assert got.column_names == ["id", "x"] and r.rows == 250 == got.num_rows
    r2 = export_table(pads.dataset(pa.concat_tables([t, t])), tmp_path / "b")
    assert r2.rows == 2000 and len(r2.files) == 1
    reader = pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=100))
    assert export_table(reader, tmp_path / "c", filter=[("id", "<", 10)]).rows == 10


def test_dest_rules_and_overwrite(tmp_path: Path):
    t = rows_table(0, 100)
    dest = tmp_path / "d"
    export_table(t, dest)
    with pytest.raises(FileExistsError, match="not empty; pass overwrite=True"):
        export_table(t, dest)
    (dest / "stray.parquet").write_bytes(b"x")
    r = export_table(rows_table(500, 7), dest, overwrite=True)
    assert sorted(os.listdir(dest)) == sorted([os.path.basename(r.paths[0]), "_SUCCESS"])
    assert read_table(dest)["id"].to_pylist() == list(range(500, 507))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        export_table(t, tmp_path / "file")
    with pytest.raises(TableError, match="no column 'nope'"):
        export_table(tmp_path / "d", tmp_path / "e", columns=["nope"])
    assert not (tmp_path / "e").exists()  # checked before anything is made


KILLED_EXPORT = textwrap.dedent(
    """
    import sys, threading, pyarrow as pa
    from airfs.tables import export_table

    schema = pa.schema([("id", pa.int64()), ("pad", pa.string())])
    def batches():
        for i in range(10**6):
            if i == 40:
                print("stuck", flush=True)
                threading.Event().wait()  # midway, until killed
            ids = pa.array(range(i * 1000, (i + 1) * 1000), pa.int64())
            yield pa.record_batch([ids, pa.array(["x" * 50] * 1000)], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    export_table(reader, sys.argv[1], target_file_bytes=200_000, row_group_bytes=100_000)
    """
)


@pytest.mark.mount
def test_export_killed_midway_leaves_no_success_and_is_not_read(volume, tmp_path: Path):
    dest = volume.root / "killed"
    script = tmp_path / "export.py"
    script.write_text(KILLED_EXPORT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(dest)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "stuck"
        written = list((dest / "_temporary").rglob("*.parquet"))
        assert written, "the export should have written files before it got stuck"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert not (dest / "_SUCCESS").exists()
    with pytest.raises(TableError, match="_temporary/ and no _SUCCESS"):
        read_table(dest)
    with pytest.raises(TableError, match="_temporary/ and no _SUCCESS"):
        TableDataset(dest)
    # the files are renamed into place only once all are written: a glob sees none of them
    assert not list(dest.glob("*.parquet"))
    # redoing it replaces the debris
    r = export_table(rows_table(0, 10), dest, overwrite=True)
    assert read_table(dest).num_rows == 10 == r.rows
    assert not (dest / "_temporary").exists()
