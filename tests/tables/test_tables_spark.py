"""PySpark as a real client of a mount: local mode writing Parquet into a volume (its
``_temporary`` directories and renames), read back by Spark, by ``TableDataset``, by
``read_table`` and by Hugging Face ``datasets``; and Spark Connect (``remote("local")``) running
the seed's ``spark.table(...).write.mode("overwrite").parquet(path)``."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pyarrow.compute as pc
import pytest
from tabletest_util import checksum, ids_of

from airfs.tables import TableDataset, read_table

pyspark = pytest.importorskip("pyspark")

pytestmark = [pytest.mark.mount, pytest.mark.filterwarnings("ignore::FutureWarning")]

ROWS = 20_000


def _java() -> None:
    if shutil.which("java") is None:
        pytest.skip("PySpark needs a Java runtime (17 or later)")


def _session(tmp: Path):
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("airfs-tables-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .getOrCreate()
    )


def test_spark_local_writes_parquet_into_the_mount(table_dir: Path, tmp_path: Path):
    _java()
    from airfs.control.client import find_mount

    if find_mount(str(table_dir)) is None:
        pytest.skip("Spark writing to a plain directory is Spark's own business")
    spark = _session(tmp_path)
    try:
        out = table_dir / "main" / "default" / "vol" / "events"
        df = spark.range(0, ROWS, 1, 3).selectExpr(
            "id",
            "id % 7 AS k",
            "cast(id AS double) * 0.25 AS x",
            "concat('e-', cast(id AS string)) AS s",
        )
        df.write.mode("overwrite").parquet(str(out))
        assert spark.read.parquet(str(out)).count() == ROWS
        df.filter("id < 5000").write.mode("overwrite").parquet(str(out))  # and again
        assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()
        back = spark.read.parquet(str(out))
        assert back.count() == 5000
        parted = table_dir / "main" / "default" / "vol" / "by_k"
        back.write.partitionBy("k").parquet(str(parted))  # k=0/ ... k=6/ directories
        pdf = back.filter("k = 3").toPandas()  # the seed's single-node path
        assert len(pdf) == len([i for i in range(5000) if i % 7 == 3])
        assert pdf["x"].to_numpy().sum() == sum(i * 0.25 for i in range(5000) if i % 7 == 3)
    finally:
        spark.stop()

    table = read_table(out)
    assert sorted(table["id"].to_pylist()) == list(range(5000))
    by_k = read_table(parted, columns=["id", "k"], filter=pc.field("k") == 3)
    assert sorted(by_k["id"].to_pylist()) == [i for i in range(5000) if i % 7 == 3]
    assert set(by_k["k"].to_pylist()) == {3}
    assert sorted(ids_of(TableDataset(out, batch_rows=512))) == list(range(5000))
    from datasets import load_dataset

    hf = load_dataset(
        "parquet", data_files=str(out / "*.parquet"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert hf.num_rows == 5000 and checksum(hf["s"]) == checksum(table["s"].to_pylist())


def test_spark_connect_runs_the_seed_export(table_dir: Path, tmp_path: Path):
    _java()
    from airfs.control.client import find_mount

    if find_mount(str(table_dir)) is None:
        pytest.skip("through a mount only")
    pytest.importorskip("grpc")
    from pyspark.sql import SparkSession

    src = tmp_path / "src"
    import pyarrow.parquet as pq
    from tabletest_util import rows_table

    src.mkdir()
    pq.write_table(rows_table(0, 3000), src / "part-0.parquet")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spark = SparkSession.builder.remote("local[2]").getOrCreate()
        except Exception as exc:  # no Connect server jar in this PySpark build
            pytest.skip(f"Spark Connect cannot start here: {exc}")
    try:
        spark.read.parquet(str(src)).createOrReplaceTempView("my_table")
        output_path = str(table_dir / "catalog" / "schema" / "my_volume" / "training_data")
        spark.table("my_table").write.mode("overwrite").parquet(output_path)  # the seed's line
        assert spark.read.parquet(output_path).count() == 3000
    finally:
        spark.stop()
    from datasets import load_dataset

    dataset = load_dataset(
        "parquet",
        data_files=f"{output_path}/*.parquet",
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert sorted(dataset["id"]) == list(range(3000))
    assert TableDataset(output_path).num_rows == 3000
