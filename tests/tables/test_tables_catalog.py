"""The seed's table example with a table *name*: a Delta table registered in the catalog of a
governed mount (a directory origin), read by name (``root=`` and ``$AIRFS_VOLUMES``), exported
to a volume by name, loaded with Hugging Face ``datasets`` and with ``TableDataset`` over two
gloo ranks (fresh processes, as torchrun starts them); exports into a DELTA and a PARQUET
table name; Spark reading the table by name through ``spark_table`` and writing the seed's
Parquet output (slow: a JVM); what ``spark_table`` refuses."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import deltalake
import pytest
from tabletest_util import add_deletion_vectors, rows_table

from airfs.cli import app as cli
from airfs.tables import (
    TableError,
    export_table,
    read_table,
    resolve,
    spark_table,
)

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (catalog --origin, mounts)"),
]

ROWS = 3000


def _catalog(origin: Path, *argv: str) -> None:
    assert cli.main(["catalog", "--origin", str(origin), *argv]) == 0, argv


@pytest.fixture(scope="module")
def governed_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A governed mount: main.default.vol (a volume), main.default.sales (a managed Delta
    table of ROWS rows partitioned by g, several files), main.default.copy (managed, empty)
    and main.default.pq (managed, PARQUET, empty)."""
    from airfs.testing.mountfix import fuse_available, mount, teardown

    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount3")
    tmp = tmp_path_factory.mktemp("tables-catalog")
    origin, mnt = tmp / "origin", tmp / "Volumes"
    origin.mkdir()
    mnt.mkdir()
    for argv in (
        ["init"],
        ["create-catalog", "main"],
        ["create-schema", "main.default"],
        ["create-volume", "main.default.vol"],
        ["create-table", "main.default.sales", "--comment", "the seed's table"],
        ["create-table", "main.default.copy"],
        ["create-table", "main.default.pq", "--format", "parquet"],
    ):
        _catalog(origin, *argv)
    m = mount(str(origin), mnt, tmp / "cache", "--ttl", "0.5")
    try:
        deltalake.write_deltalake(
            str(mnt / "main/default/.table-sales"),
            rows_table(0, ROWS),
            partition_by=["g"],
            writer_properties=deltalake.WriterProperties(max_row_group_size=256),
        )
        yield mnt
    finally:
        teardown(m)


#: one rank, as torchrun starts it: a fresh interpreter (deltalake's tokio runtime does not
#: survive a fork, so the shared pool of forked ranks cannot resolve a Delta table's name)
RANK = """
import json, os, sys
import torch.distributed as dist
from airfs.tables import TableDataset
dist.init_process_group("gloo", init_method="env://")
ds = TableDataset(sys.argv[1], root=sys.argv[2], batch_rows=100, uneven="drop", seed=3)
ids = [i for batch in ds for i in batch["id"].tolist()]
dist.barrier()
dist.destroy_process_group()
print(json.dumps(ids))
"""


def _two_ranks(name: str, root: Path) -> list[list[int]]:
    import json
    import subprocess
    import sys

    from distpool import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2"}  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, name, str(root)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_seed_example_by_table_name(
    governed_mount: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mp = governed_mount
    t = read_table("main.default.sales", root=mp)
    assert t.num_rows == ROWS and sorted(t["id"].to_pylist()) == list(range(ROWS))
    src = resolve("main.default.sales", root=mp)
    assert src.kind == "delta" and src.info["table"] == "main.default.sales"
    assert src.root == str(mp / "main/default/.table-sales")
    monkeypatch.setenv("AIRFS_VOLUMES", str(mp))  # names resolve through $AIRFS_VOLUMES too
    assert read_table("main.default.sales", columns=["id"]).num_rows == ROWS
    monkeypatch.setenv("AIRFS_VOLUMES", str(tmp_path))
    with pytest.raises(TableError, match=f"{tmp_path} is not one"):
        read_table("main.default.sales")
    monkeypatch.delenv("AIRFS_VOLUMES")

    # exported to a volume by name, then loaded with HF datasets
    out = mp / "main/default/vol/training_data"
    res = export_table("main.default.sales", out, root=mp, target_file_bytes=16 << 10)
    assert res.rows == ROWS and len(res.files) > 1
    from datasets import load_dataset

    hf = load_dataset(
        "parquet", data_files=res.paths, split="train", cache_dir=str(tmp_path / "hf")
    )
    assert sorted(hf["id"]) == list(range(ROWS))
    # TableDataset over two ranks, by name: every row once, none twice
    got = _two_ranks("main.default.sales", mp)
    a, b = (set(ids) for ids in got)
    assert not a & b and a | b == set(range(ROWS)) and len(got[0]) == len(got[1])


def test_export_into_table_names(governed_mount: Path) -> None:
    mp = governed_mount
    res = export_table("main.default.sales", "main.default.copy", root=mp, columns=["id", "x"])
    assert res.dest == str(mp / "main/default/.table-copy") and res.rows == ROWS
    back = read_table("main.default.copy", root=mp)
    assert back.column_names == ["id", "x"] and sorted(back["id"].to_pylist()) == list(range(ROWS))
    with pytest.raises(FileExistsError, match="has data already"):
        export_table("main.default.sales", "main.default.copy", root=mp)
    res = export_table(
        "main.default.sales", "main.default.copy", root=mp, filter=None, overwrite=True
    )
    assert read_table("main.default.copy", root=mp).num_rows == ROWS
    # a PARQUET table gets a Parquet export (with its _SUCCESS manifest)
    res = export_table("main.default.sales", "main.default.pq", root=mp)
    assert (mp / "main/default/.table-pq/_SUCCESS").exists()
    assert sorted(read_table("main.default.pq", root=mp)["id"].to_pylist()) == list(range(ROWS))
    with pytest.raises(TableError, match=r"main\.default\.nope does not exist"):
        export_table("main.default.sales", "main.default.nope", root=mp)


def test_spark_table_refuses_deletion_vectors(tmp_path: Path) -> None:
    path = tmp_path / "dv"
    deltalake.write_deltalake(str(path), rows_table(0, 100))
    f = resolve(path).files[0]
    add_deletion_vectors(path, {os.path.relpath(f.path, path): [0, 1]})
    pytest.importorskip("pyspark")
    with pytest.raises(TableError, match="deletion vectors"):
        spark_table(None, str(path))  # refused before Spark is asked anything


@pytest.mark.slow
def test_spark_reads_the_table_by_name(governed_mount: Path, tmp_path: Path) -> None:
    """The seed's line with the table's name: spark_table(spark, NAME).write...parquet(...)."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("PySpark needs a Java runtime")
    from pyspark.sql import SparkSession

    mp = governed_mount
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("airfs-spark-table")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp_path}")
        .getOrCreate()
    )
    try:
        df = spark_table(spark, "main.default.sales", root=str(mp))
        assert df.columns == ["id", "g", "x", "s"]
        assert df.count() == ROWS
        row = df.filter("id = 1234").collect()[0]
        assert (row["g"], row["s"]) == (1234 % 4, "row-1234")  # the partition value is there
        output_path = str(mp / "main/default/vol/spark_out")
        df.write.mode("overwrite").parquet(output_path)
    finally:
        spark.stop()
    assert sorted(read_table(output_path)["id"].to_pylist()) == list(range(ROWS))
